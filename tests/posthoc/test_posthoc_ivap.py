"""Inductive Venn-Abers predictors (docs/methods.md §5.15): a hand-computed example, the definition (isotonic
regression with the test object added) restated with scikit-learn, the papers' properties, and probmetrics 1.3's
``get_calibrator("ivap")`` (venn-abers' ``VennAbersCalibrator``, one-vs-all) on the reference cases."""

import warnings

import numpy as np
import pytest
import torch
from posthoc_cases import check_runs_as_a_method, edge_case_data
from reference_cases import CLASS_COUNTS, reference_split
from scipy.special import softmax
from sklearn.isotonic import IsotonicRegression

from calib._config import ConfigError, from_dict
from calib.methods import METHODS
from calib.posthoc import POSTHOC, DegenerateFitWarning
from calib.posthoc.ivap import InductiveVennAbers, InductiveVennAbersConfig, merge_interval, venn_abers_grid

pytestmark = pytest.mark.usefixtures("one_thread")

CALIBRATION_SIZE = {2: 500, 10: 1000, 100: 600}
"""The reference checks' calibration sets: at K = 100 600 samples (every class present), not the 3,000 of
test_posthoc_references.py, because venn-abers' fit takes ~50 ms per class at 1,000 samples (5 s at K = 100)."""

TEST_SIZE = 500

PROBABILITY_TOLERANCE = 1e-12
"""max |p̂_calib − p̂_probmetrics| (measured: 3e-16 at K = 2, 10 and 100)."""


def binary_logits(p1):
    """Logits whose softmax is (1 − p1, p1)."""
    p1 = torch.tensor(p1, dtype=torch.float64)
    return torch.stack([(1 - p1).log(), p1.log()], dim=1)


def test_hand_computed_example():
    # Calibration (score: label) 0.1: 0, 0.2: 1, 0.3: 0, 0.4: 1. Isotonic regression with the test object added:
    # s = 0.05 labelled 0: 0, 0, 1, 0, 1 → PAV 0, 0, ½, ½, 1: p0 = 0; labelled 1: 1, 0, 1, 0, 1 → ½ ×4, 1: p1 = ½.
    # s = 0.25 labelled 0: 0, 1, 0, 0, 1 → 0, ⅓ ×3, 1: p0 = ⅓; labelled 1: 0, 1, 1, 0, 1 → 0, ⅔ ×3, 1: p1 = ⅔.
    # s = 0.3 (tied with a calibration score): its group {0, 0} → 0, 1, 0 (×2), 1 → p0 = ⅓; {0, 1} → p1 = ⅔.
    # s = 0.5 labelled 0: 0, 1, 0, 1, 0 → 0, ½ ×4: p0 = ½; labelled 1: 0, ½, ½, 1, 1: p1 = 1.
    scores = [0.1, 0.2, 0.3, 0.4]
    calibrator = InductiveVennAbers().fit(binary_logits(scores), torch.tensor([0, 1, 0, 1]))
    tests = binary_logits([0.05, 0.25, 0.3, 0.5])
    p0, p1 = calibrator.intervals(tests)
    np.testing.assert_allclose(p0[:, 0], [0, 1 / 3, 1 / 3, 1 / 2], rtol=0, atol=1e-15)
    np.testing.assert_allclose(p1[:, 0], [1 / 2, 2 / 3, 2 / 3, 1], rtol=0, atol=1e-15)
    # p = p1 / (1 − p0 + p1): ½/(3/2) = ⅓, ⅔/(4/3) = ½, ½, 1/(3/2) = ⅔
    np.testing.assert_allclose(calibrator.probs(tests)[:, 1].numpy(), [1 / 3, 1 / 2, 1 / 2, 2 / 3], atol=1e-15)


def test_the_grid_is_isotonic_regression_with_the_test_object_added():
    # The definition restated: scikit-learn's isotonic regression on the calibration pairs plus (s, 0) or (s, 1),
    # read at s; random data with ties, test scores on, between and beyond the calibration scores.
    rng = np.random.default_rng(0)
    for trial in range(20):
        n = int(rng.integers(1, 25))
        scores = rng.integers(0, 6, n) / 6 if trial % 2 else rng.random(n)
        labels = (rng.random(n) < 0.2 + 0.6 * scores).astype(int)
        tests = np.concatenate([scores, rng.random(5), [-1.0, 2.0]])
        p0, p1 = venn_abers_grid(scores, labels).interval(tests)
        for end, label in ((p0, 0), (p1, 1)):
            expected = [IsotonicRegression().fit(np.append(scores, s), np.append(labels, label)).predict([s])[0]
                        for s in tests]
            np.testing.assert_allclose(end, expected, rtol=0, atol=1e-12)


def test_validity_each_object_gets_the_isotonic_fit_of_the_whole_set():
    # Vovk & Petej's validity: the end of the interval that carries the test object's true label is the isotonic
    # regression fitted on the calibration set and the test object together. So, leaving each object of one set
    # out in turn, p_{y_j} is the whole set's isotonic fit at s_j, and the labels average exactly that value over
    # the objects that get it (calibrated in the small).
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 40, 120) / 40
    labels = (rng.random(120) < scores).astype(int)
    whole = IsotonicRegression().fit(scores, labels).predict(scores)
    true_end = np.empty(120)
    for j in range(120):
        rest = np.arange(120) != j
        p0, p1 = venn_abers_grid(scores[rest], labels[rest]).interval(scores[j:j + 1])
        true_end[j] = (p1 if labels[j] else p0)[0]
    np.testing.assert_allclose(true_end, whole, rtol=0, atol=1e-12)
    for value in np.unique(true_end):
        assert labels[true_end == value].mean() == pytest.approx(value, abs=1e-12)


@pytest.mark.parametrize("num_classes", [2, 10])
def test_the_interval_holds_the_merged_probability_and_rows_sum_to_one(num_classes):
    split = reference_split(num_classes, 400, 300, seed=3)
    calibrator = InductiveVennAbers().fit(*split.calibration_tensors())
    test = torch.from_numpy(split.test_logits)
    p0, p1 = calibrator.intervals(test)
    merged = merge_interval(p0, p1)
    assert (p0 <= p1).all() and (p0 <= merged).all() and (merged <= p1).all()
    assert ((p0 >= 0) & (p1 <= 1) & (p1 > 0)).all()  # p1 >= 1/(N + 1): the test object may be positive
    probs = calibrator.probs(test)
    torch.testing.assert_close(probs.sum(1), torch.ones(len(test), dtype=torch.float64))
    expected = (np.stack([1 - merged[:, 0], merged[:, 0]], axis=1) if num_classes == 2
                else merged / merged.sum(1, keepdims=True))
    np.testing.assert_allclose(probs.numpy(), expected, rtol=0, atol=1e-15)


def test_the_argmax_can_change():
    # Class 1 scores 0.6 on 8 class-0 and 2 class-1 samples, 0.9 on 10 class-1 ones. A test score 0.6 joins the tie
    # group: p0 = 2/11, p1 = 3/11, p̂_1 = (3/11)/(1 − 2/11 + 3/11) = ¼, so the predicted class moves from 1 to 0.
    calibrator = InductiveVennAbers().fit(binary_logits([0.6] * 10 + [0.9] * 10), torch.tensor([0] * 8 + [1] * 12))
    probs = calibrator.probs(binary_logits([0.6]))
    assert probs[0, 1].item() == pytest.approx(0.25, abs=1e-15) and probs.argmax(1).item() == 0


def test_an_absent_class_is_flagged_and_gets_a_small_positive_probability():
    split = reference_split(10, 300, 200, seed=4)
    z, y = split.calibration_tensors()
    keep = y != 3
    with pytest.warns(DegenerateFitWarning, match=r"InductiveVennAbers: degenerate fit: class 3 absent from the "
                                                  r"calibration set: Venn-Abers gives such a class p0 = 0"):
        calibrator = InductiveVennAbers().fit(z[keep], y[keep])
    test = torch.from_numpy(split.test_logits)
    p0, p1 = calibrator.intervals(test)
    assert (p0[:, 3] == 0).all() and (p1[:, 3] > 0).all()
    # p1 of a class without positives: 1 / (1 + #calibration scores at or above the test score)
    class_scores = softmax(z[keep].numpy(), axis=1)[:, 3]
    test_scores = softmax(split.test_logits, axis=1)[:, 3]
    np.testing.assert_allclose(p1[:, 3], 1 / (1 + (class_scores[None, :] >= test_scores[:, None]).sum(1)), rtol=1e-14)
    assert (calibrator.probs(test)[:, 3] > 0).all()


@pytest.mark.parametrize(("name", "logits", "labels"), edge_case_data())
def test_edge_cases(name, logits, labels):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        calibrator = InductiveVennAbers().fit(logits, labels)
    g = torch.Generator().manual_seed(0)
    test = torch.cat([logits, 4 * torch.randn(30, logits.shape[1], generator=g, dtype=torch.float64)])
    probs = calibrator.probs(test)
    assert torch.isfinite(calibrator(test)).all() and (probs > 0).all()
    torch.testing.assert_close(probs.sum(1), torch.ones(len(test), dtype=torch.float64))
    assert calibrator.degenerate == (len(torch.unique(labels)) < logits.shape[1])  # only an absent class
    if name == "ties":  # identical rows, identical outputs
        torch.testing.assert_close(probs[:10].repeat(20, 1), probs[:200], rtol=0, atol=0)


def test_registry_config_and_errors():
    assert POSTHOC.get("ivap") is InductiveVennAbers and METHODS.get("ivap").config is InductiveVennAbersConfig
    assert from_dict(InductiveVennAbersConfig, {"calibration_size": 100}).calibration_size == 100
    with pytest.raises(ConfigError, match=r"`calibration_size` must be null \(the whole validation split\) or an "
                                          r"integer >= 2, got calibration_size=1\."):
        InductiveVennAbersConfig(calibration_size=1)
    with pytest.raises(ConfigError, match=r"Unknown key .precision. for InductiveVennAbersConfig"):
        from_dict(InductiveVennAbersConfig, {"precision": 3})
    with pytest.raises(RuntimeError, match=r"InductiveVennAbers is not fitted"):
        InductiveVennAbers()(torch.zeros(2, 3))
    calibrator = InductiveVennAbers().fit(torch.randn(30, 3), torch.arange(30) % 3)
    with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 4"):
        calibrator(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"`logits` must have shape \(N, C\) with C >= 2, got shape \(4, 1\)"):
        InductiveVennAbers().fit(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long))


def test_runs_as_a_method_on_float32_logits():
    check_runs_as_a_method([("ivap", InductiveVennAbersConfig()), ("ivap", InductiveVennAbersConfig(
        calibration_size=60))])


@pytest.mark.parametrize("num_classes", CLASS_COUNTS, ids=lambda k: f"K{k}")
def test_against_probmetrics(num_classes):
    # probmetrics 1.3 get_calibrator("ivap") = VennAbersCalibrator(use_ovo=False): venn-abers'
    # VennAbersCalibrator.predict_proba(p_cal, y_cal, p_test, va_type="one_vs_all"), on softmax probabilities:
    # K = 2 one binary Venn-Abers on p_1, else one per class on p_k, the merged p1/(1 − p0 + p1) renormalised.
    from probmetrics.calibrators import get_calibrator

    split = reference_split(num_classes, CALIBRATION_SIZE[num_classes], TEST_SIZE, seed=num_classes)
    assert len(np.unique(split.calibration_labels)) == num_classes  # venn-abers drops the columns of absent classes
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # venn-abers' nanmin over empty slices
        reference = get_calibrator("ivap").fit(softmax(split.calibration_logits, axis=1),
                                               split.calibration_labels).predict_proba(
            softmax(split.test_logits, axis=1))
    calibrator = InductiveVennAbers().fit(*split.calibration_tensors())
    actual = calibrator.probs(torch.from_numpy(split.test_logits)).numpy()
    np.testing.assert_allclose(actual, reference, rtol=0, atol=PROBABILITY_TOLERANCE)
