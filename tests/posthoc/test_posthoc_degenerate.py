"""Degenerate fits are never silent (docs/methods.md §5.13): each case flagged with its reason and its documented
fallback; a class absent from the calibration set, per method; one probability floor for every method; the
spline keeps the predicted class; the warning line a study prints and its store columns."""

import io
import math
import warnings

import numpy as np
import pytest
import torch
from posthoc_cases import synthetic_logits as synthetic

from calib.methods import METHODS
from calib.metrics import negative_log_likelihood
from calib.metrics.nll import NLL_MAX
from calib.posthoc import POSTHOC, PROBABILITY_FLOOR, DegenerateFitWarning, TemperatureScaling
from calib.posthoc.classwise_ts import ClasswiseTemperatureScaling
from calib.posthoc.smart import SMART
from calib.posthoc.temperature_scaling import TEMPERATURE_RANGE
from calib.run.display import DEGENERATE_LINES, ProgressDisplay

pytestmark = pytest.mark.usefixtures("one_thread")


def fit_quietly(calibrator, logits, labels):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        return calibrator.fit(logits, labels)


class TestTemperatureScaling:
    def test_a_separable_set_holds_t_at_the_lower_bound(self):
        # The case: labels = argmax of random logits. It used to return T = 2.7e-4 silently (test NLL 390).
        g = torch.Generator().manual_seed(0)
        z, test, test_labels = (torch.randn(500, 10, generator=g, dtype=torch.float64),
                                torch.randn(2000, 10, generator=g, dtype=torch.float64),
                                torch.randint(0, 10, (2000,), generator=g))
        with pytest.warns(DegenerateFitWarning, match=r"TemperatureScaling: degenerate fit: no finite optimum: every "
                                                      r"calibration sample's label has its row's top logit"):
            ts = TemperatureScaling().fit(z, z.argmax(1))
        assert ts.temperature.item() == TEMPERATURE_RANGE[0] == 0.05
        assert ts.degenerate and "T is held at 0.05" in ts.degenerate_reason
        nll = negative_log_likelihood(ts.probs(test).numpy(), test_labels.numpy())
        assert nll < 100  # bounded: at T = 0.05 a random label costs ~its logit gap / 0.05, not / 2.7e-4

    def test_anti_informative_logits_hold_t_at_the_upper_bound(self):
        z = torch.randn(400, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        ts = fit_quietly(TemperatureScaling(), z, z.argmin(1))
        assert ts.temperature.item() == TEMPERATURE_RANGE[1] == 20.0
        assert "the NLL keeps falling as T → ∞" in ts.degenerate_reason

    def test_constant_rows_hold_t_at_one(self):
        ts = fit_quietly(TemperatureScaling(), torch.zeros(6, 3, dtype=torch.float64), torch.tensor([0, 1, 2] * 2))
        assert ts.temperature.item() == 1.0 and "does not depend on T" in ts.degenerate_reason

    def test_a_finite_optimum_below_the_range_is_held_at_the_bound(self):
        # All right but one sample, wrong by a tiny margin: the optimum is finite but far below 0.05.
        z = torch.randn(100, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 3
        labels = z.argmax(1).clone()
        top2 = z.topk(2, dim=1).indices[0]
        z[0, top2[1]] = z[0, top2[0]] - 0.05  # the NLL optimum: T = 0.0375
        labels[0] = top2[1]
        ts = fit_quietly(TemperatureScaling(), z, labels)
        assert ts.temperature.item() == 0.05
        assert ts.degenerate_reason == ("the NLL optimum T = 0.03747 lies outside the range [0.05, 20]; T is held "
                                        "at 0.05")

    def test_a_grid_fit_at_the_end_of_its_grid_is_flagged(self):
        z = torch.randn(400, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        ts = fit_quietly(TemperatureScaling("nll", "grid"), z, z.argmax(1))
        assert ts.temperature.item() == pytest.approx(0.1) and "at the end of the grid 0.1 … 10" in ts.degenerate_reason

    def test_ordinary_logits_are_not_flagged(self):
        z, y = synthetic(2000, 10, seed=3)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DegenerateFitWarning)
            ts = TemperatureScaling().fit(z, y)
        assert not ts.degenerate and ts.fit_details() == {"fit_degenerate": False, "fit_degenerate_reason": None}
        assert ts.temperature.item() == pytest.approx(2.5, rel=0.1)  # the generator's sharpness


def test_classwise_ts_on_five_samples_is_flagged_and_bounded():
    # The case: CTS on 5 samples reported converged with T_min 0.19.
    z, y = synthetic(5, 10, seed=4)
    with pytest.warns(DegenerateFitWarning, match=r"ClasswiseTemperatureScaling: degenerate fit: classes .* absent "
                                                  r"from the calibration set: their temperatures are fitted only"):
        cts = ClasswiseTemperatureScaling().fit(z, y)
    low, high = TEMPERATURE_RANGE
    assert ((cts.temperatures >= low) & (cts.temperatures <= high)).all()


@pytest.mark.parametrize(("name", "params", "fragment"), [
    ("classwise_ts", {}, "their temperatures are fitted only to push their probabilities down"),
    ("vector_scaling", {}, "their intercept b_k has no finite optimum (b_k → −∞)"),
    ("matrix_scaling", {"off_diagonal_weight": 1000.0, "intercept_weight": 0.1},
     "their rows of W and their b_k are fitted only to push their probabilities down"),
    ("dirichlet", {"off_diagonal_weight": 1000.0, "intercept_weight": 0.1},
     "their diagonal weight W_kk has no finite optimum"),
    ("isotonic", {}, "isotonic regression maps their scores to 0"),
    ("histogram_binning_equal_mass", {}, "histogram binning maps their scores to 0"),
    ("ivap", {}, "Venn-Abers gives such a class p0 = 0"),
    ("cir", {}, "centred isotonic regression maps their scores to 0"),
    ("beta", {}, "the likelihood has no finite optimum"),
])
def test_absent_classes_are_flagged_with_what_they_get(name, params, fragment):
    # 40 samples of 20 classes: several classes never occur (the K = 100, N = 50 on a smaller scale).
    z, y = synthetic(40, 20, seed=5)
    absent = sorted(set(range(20)) - set(y.tolist()))
    assert absent
    with pytest.warns(DegenerateFitWarning, match="absent from the calibration set"):
        calibrator = POSTHOC.create(name, **params).fit(z, y)
    assert fragment in calibrator.degenerate_reason
    assert f"({len(absent)} of 20)" in calibrator.degenerate_reason
    test, _ = synthetic(500, 20, seed=6)
    log_probs, probs = calibrator(test), calibrator.probs(test)
    if name in ("isotonic", "histogram_binning_equal_mass", "cir"):  # exactly 0, floored at the one floor of all
        mapped = log_probs.max(1).values > math.log(1 / 20) + 1e-12  # (a row every g_k maps to 0 is uniform)
        assert mapped.sum() > 400 and (log_probs[mapped][:, absent] == math.log(PROBABILITY_FLOOR)).all()
    elif name == "vector_scaling":  # b_k stopped where the mean p_k on the calibration set is below 1e-6
        assert calibrator.probs(z)[:, absent].mean() < 1e-6
    else:  # pushed down from the uncalibrated probabilities
        assert probs[:, absent].mean() < test.softmax(1)[:, absent].mean()


@pytest.mark.parametrize("name", ["temperature_scaling", "ensemble_ts", "isotonic_irm", "bbq", "spline"])
def test_class_agnostic_methods_are_not_flagged_for_an_absent_class(name):
    z, y = synthetic(40, 20, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegenerateFitWarning)
        calibrator = POSTHOC.create(name).fit(z, y)
    probs = calibrator.probs(synthetic(200, 20, seed=6)[0])
    absent = sorted(set(range(20)) - set(y.tolist()))
    if name == "bbq":  # the prior's pseudo-positives: small but positive
        assert (probs[:, absent] > 1e-12).all()


def test_smart_with_one_sample_or_identical_rows_is_flagged():
    one = torch.tensor([[2.0, 0.0, -1.0]], dtype=torch.float64)
    with pytest.warns(DegenerateFitWarning, match=r"the 1 calibration margins have no spread"):
        SMART(max_epochs=20).fit(one, torch.tensor([0]))
    rows = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64).repeat(10, 1)
    smart = fit_quietly(SMART(max_epochs=20), rows, torch.tensor([0, 1]).repeat(10))
    assert "no spread" in smart.degenerate_reason


def test_one_probability_floor_for_every_method():
    # A class with probability exactly 0 costs calib's NLL maximum, whichever method output it.
    z, y = synthetic(300, 5, seed=7)
    keep = y != 4  # class 4 absent: IR and HB give it exactly 0
    test = z[:20]
    labels = torch.full((20,), 4)
    for name in ("isotonic", "histogram_binning_equal_mass"):
        calibrator = fit_quietly(POSTHOC.create(name), z[keep], y[keep])
        log_probs = calibrator(test)
        zero = log_probs[:, 4] == math.log(PROBABILITY_FLOOR)  # the rows not mapped to 0 everywhere (uniform)
        assert zero.sum() >= 15
        nll = negative_log_likelihood(calibrator.probs(test[zero]).numpy(), labels[zero].numpy())
        assert nll == pytest.approx(NLL_MAX)  # 744.44 nats, as calib's NLL of p_y = 0 (it was 708.40)


@pytest.mark.parametrize("num_classes", [2, 10, 100])
def test_spline_keeps_the_predicted_class_with_its_calibrated_confidence(num_classes):
    # The over-confident logits: the old rescaling moved the argmax on up to 7% (K = 2), 59% (K = 10),
    # 97% (K = 100) of the test samples.
    z, y = synthetic(2000, num_classes, seed=8)
    test, _ = synthetic(5000, num_classes, seed=9)
    spline = POSTHOC.create("spline").fit(z, y)
    probs = spline.probs(test)
    assert (probs.argmax(1) == test.argmax(1)).all()
    confidence = spline.calibrated_confidence(test.softmax(1).max(1).values.numpy())
    shown = np.maximum(confidence, 1 / (num_classes - (num_classes - 1) * 1e-9))
    np.testing.assert_allclose(probs.max(1).values.numpy(), shown, rtol=1e-12)
    torch.testing.assert_close(probs.sum(1), torch.ones(len(test), dtype=torch.float64))


def test_the_store_columns_and_the_study_warning_line(tmp_path):
    from types import SimpleNamespace

    from calib.config import parse_trial_config
    from calib.run.execution import degenerate_fit_line, summary
    from calib.study.presets import PRESETS, base_config
    from calib.trial import TrialResult

    g = torch.Generator().manual_seed(7)
    splits = {name: SimpleNamespace(features=torch.empty(n, 0), logits=torch.randn(n, 3, generator=g),
                                    labels=torch.randint(0, 2, (n,), generator=g)) for name, n in (("val", 60),
                                                                                                   ("test", 30))}
    params = METHODS.get("histogram_binning_equal_mass").config(calibration_size=20, calibration_draw=1)
    with pytest.warns(DegenerateFitWarning):
        outcome = METHODS.get("histogram_binning_equal_mass")(params, SimpleNamespace(splits=splits), seed=0,
                                                   device=torch.device("cpu"))
    assert outcome.fit_details["fit_degenerate"] is True
    assert outcome.fit_details["fit_degenerate_reason"].startswith("class 2 absent from the calibration set")
    config = parse_trial_config({
        **base_config(PRESETS.get("quick"), study="s", dataset="digits-noisy", arch="small_cnn", seed=3,
                      method={"name": "histogram_binning_equal_mass", "calibration_size": 20, "calibration_draw": 1},
                      data_root=str(tmp_path / "data"), artifact_root=str(tmp_path / "artifacts")),
        "label": "HB · n=20"})
    result = TrialResult(config=config, trial_id="t1", stage1_id="s1", fit_details=outcome.fit_details)
    line = degenerate_fit_line(result)
    assert line == ("HB · n=20 (histogram_binning_equal_mass) on digits-noisy · small_cnn · seed 3, calibration set "
                    "of 20 (draw 1): degenerate fit: " + outcome.fit_details["fit_degenerate_reason"])
    assert summary(result)["degenerate_fit"] == line
    from calib.store.parquet import trial_row

    row = trial_row(result)
    assert row["fit_degenerate"] is True and row["fit_degenerate_reason"] == outcome.fit_details[
        "fit_degenerate_reason"]


def test_the_display_prints_the_first_warnings_and_counts_them_all():
    stream = io.StringIO()
    display = ProgressDisplay("posthoc", 100, "val_ece", stream=stream, interactive=False)
    for i in range(DEGENERATE_LINES + 5):
        display.degenerate_fit(f"HB on d · a · seed {i}: degenerate fit: why")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[posthoc] warning: HB on d · a · seed 0: degenerate fit: why"
    assert len(lines) == DEGENERATE_LINES + 1 and "more degenerate fits" in lines[-1]
    assert f"{DEGENERATE_LINES + 5} degenerate fits" in display.line()
