"""run_trial end to end for TST, V-TST and every post-hoc method on one shared Stage-I artifact."""

import math

import numpy as np
import pytest
import torch

from calib._config import ConfigError
from calib.artifacts import get_or_train_stage1
from calib.config import parse_trial_config
from calib.methods import METHODS
from calib.metrics import METRICS, expected_calibration_error, negative_log_likelihood
from calib.posthoc import TemperatureScaling
from calib.trial import run_trial, trial_id

METHOD_PARAMS = [
    {"name": "tst", "epochs": 2},
    {"name": "vtst", "epochs": 2, "num_samples": 2},
    {"name": "temperature_scaling"},
    {"name": "temperature_scaling", "objective": "ece", "optimizer": "grid"},
    {"name": "smart", "max_epochs": 100},
    {"name": "classwise_ts"},
    {"name": "parameterized_ts", "steps": 200},
    {"name": "ensemble_ts"},
    {"name": "vector_scaling"},
    {"name": "matrix_scaling"},
    {"name": "dirichlet", "off_diagonal_weight": 0.01, "intercept_weight": 0.01},  # its 5-fold CV: test_odir_cv
    {"name": "sms"},
    {"name": "svs"},
    {"name": "isotonic"},
    {"name": "isotonic_irm"},
    {"name": "histogram_binning"},
    {"name": "histogram_binning_equal_width"},
    {"name": "bbq"},
    {"name": "spline"},
    {"name": "ivap"},
    {"name": "cir"},
    {"name": "beta"},
    {"name": "temperature_scaling", "calibration_size": 50, "calibration_draw": 1},
]
KEEP_ARGMAX = ("temperature_scaling", "smart", "parameterized_ts", "ensemble_ts", "isotonic_irm", "spline")
"""The methods that keep the predicted class: a positive temperature, a mixture of such softmaxes, IRM's
strictly increasing map (up to scores closer than ~1e-7), the spline's top-label distribution."""


def test_methods_share_one_stage1_artifact(make_config):
    vanilla = run_trial(make_config(method={"name": "vanilla"}))
    assert vanilla.metrics["test_argmax_changed"] == vanilla.metrics["test_accuracy_change"] == 0.0
    results = [run_trial(make_config(method=method)) for method in METHOD_PARAMS]
    changed = {m["name"]: r.metrics["test_argmax_changed"] for m, r in zip(METHOD_PARAMS, results, strict=True)}
    assert changed["histogram_binning"] > 0 and changed["histogram_binning_equal_width"] > 0  # one-vs-rest bins
    assert vanilla.stage1_cache_hit is False and all(r.stage1_cache_hit is True for r in results)
    assert {r.stage1_id for r in results} == {vanilla.stage1_id}
    for method, result in zip(METHOD_PARAMS, results, strict=True):
        assert result.status == "ok", method
        assert set(result.metrics) == set(vanilla.metrics)
        for name, value in result.metrics.items():
            low, high = (-1.0, 1.0) if name == "test_accuracy_change" else (0.0, 1.0) if name == "test_argmax_changed" \
                else METRICS[name.split("_", 1)[1]].bounds
            assert math.isfinite(value) and low <= value <= high, (method, name, value)
        change = result.metrics["test_accuracy"] - vanilla.metrics["test_accuracy"]
        assert result.metrics["test_accuracy_change"] == pytest.approx(change, abs=1e-12), method
        assert all(0.0 <= result.metrics[f"{s}_{m}"] <= 1.0 for s in ("val", "test") for m in ("accuracy", "ece"))
        stage2 = [r["epoch"] for r in result.history if r["stage"] == "stage2"]
        assert stage2 == ([0, 1] if method["name"] in ("tst", "vtst") else [])
        if method["name"] in KEEP_ARGMAX:  # the argmax, hence accuracy, is unchanged
            assert result.metrics["test_accuracy"] == vanilla.metrics["test_accuracy"], method
            assert result.metrics["test_argmax_changed"] == 0.0, method
            if "calibration_size" not in method:  # else the validation metrics are the held-out rest's
                assert result.metrics["val_accuracy"] == vanilla.metrics["val_accuracy"], method


def test_the_fitted_temperature_is_readable(make_config):
    cfg = parse_trial_config(make_config(method={"name": "temperature_scaling"}))
    artifact, _ = get_or_train_stage1(cfg, torch.device("cpu"))
    outcome = METHODS.get("temperature_scaling")(cfg.method.params, artifact, seed=1, device=torch.device("cpu"))
    temperature = outcome.predict.calibrator.temperature.item()
    assert temperature > 0
    test = artifact.splits["test"]
    torch.testing.assert_close(outcome.test_probs, (test.logits.double() / temperature).softmax(1))


def test_a_calibration_subset_is_what_the_method_fits_on(make_config):
    cfg = parse_trial_config(make_config(method={"name": "temperature_scaling", "calibration_size": 40,
                                                 "calibration_draw": 2}))
    artifact, _ = get_or_train_stage1(cfg, torch.device("cpu"))
    outcome = METHODS.get("temperature_scaling")(cfg.method.params, artifact, seed=1, device=torch.device("cpu"))
    val = artifact.splits["val"]
    subset = torch.from_numpy(np.sort(np.random.default_rng(2).permutation(len(val.labels))[:40]))
    direct = TemperatureScaling().fit(val.logits[subset], val.labels[subset])
    assert outcome.predict.calibrator.temperature.item() == direct.temperature.item()
    whole = TemperatureScaling().fit(val.logits, val.labels)
    assert outcome.predict.calibrator.temperature.item() != whole.temperature.item()


def test_a_calibration_set_larger_than_the_validation_split_is_refused(make_config):
    config = make_config(method={"name": "histogram_binning", "calibration_size": 270})
    with pytest.raises(ConfigError, match=r"`method.calibration_size` must be at most the 269 images of "
                                          r"digits-noisy's validation split, got method.calibration_size=270"):
        parse_trial_config(config)
    parse_trial_config(make_config(method={"name": "histogram_binning", "calibration_size": 269}))
    with pytest.raises(ConfigError, match=r"`method.calibration_size` must be null .* or an integer >= 2, "
                                          r"got method.calibration_size=1"):
        parse_trial_config(make_config(method={"name": "bbq", "calibration_size": 1}))


def test_adding_the_calibration_fields_kept_the_stored_ids(make_config):
    """Trials stored before calibration_size existed keep their ids at its default (config.ADDED_FIELDS):
    the ids below are what calib computed for these configs before the fields were added."""
    for name, stored_id in (("temperature_scaling", "30e55c2e613af750"), ("smart", "688d079cb12899da")):
        assert trial_id(make_config(method={"name": name})) == stored_id
        explicit = make_config(method={"name": name, "calibration_size": None, "calibration_draw": 0})
        assert trial_id(explicit) == stored_id
        assert trial_id(make_config(method={"name": name, "calibration_size": 50})) != stored_id


def test_equal_mass_binning_kept_its_ids_under_its_new_name(make_config):
    """HB became the equal-width method and the equal-mass one (HB-EM) was renamed from ``histogram_binning`` to
    ``histogram_binning_equal_mass``: its identity keeps the former name (``MethodSpec.former_name``), so its stored
    trials keep their ids under either name: these are the ids calib computed before equal-width binning existed."""
    for name in ("histogram_binning", "histogram_binning_equal_mass"):
        assert trial_id(make_config(method={"name": name})) == "95c1eba40765753c"
        sized = make_config(method={"name": name, "num_bins": 10, "calibration_size": 50})
        assert trial_id(sized) == "695be3406f75059e"
        # the config reads as the new name (the store's `method` column)
        assert parse_trial_config(make_config(method={"name": name})).method.name == "histogram_binning_equal_mass"
    assert trial_id(make_config(method={"name": "histogram_binning_equal_width"})) != "95c1eba40765753c"


def test_validation_metrics_of_a_subset_fit_are_the_held_out_rests(make_config):
    config = make_config(method={"name": "temperature_scaling", "calibration_size": 100})
    result = run_trial(config)
    artifact, _ = get_or_train_stage1(parse_trial_config(config), torch.device("cpu"))
    val = artifact.splits["val"]
    fitted = np.sort(np.random.default_rng(0).permutation(len(val.labels))[:100])
    rest = np.setdiff1d(np.arange(len(val.labels)), fitted)
    temperature = TemperatureScaling().fit(val.logits[fitted], val.labels[fitted]).temperature.item()
    probs = (val.logits[rest].double() / temperature).softmax(1).numpy()
    assert result.metrics["val_ece"] == pytest.approx(expected_calibration_error(probs, val.labels[rest].numpy()))
    assert result.metrics["val_nll"] == pytest.approx(negative_log_likelihood(probs, val.labels[rest].numpy()))
