"""Centred isotonic regression (docs/methods.md §5.16): hand-computed examples, the paper's properties against
scikit-learn's isotonic regression, cir-model 0.2 (the package probmetrics calls) in float64 and probmetrics 1.3's
``get_calibrator("cir")`` on the reference cases."""

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
from calib.posthoc import POSTHOC, PROBABILITY_FLOOR, DegenerateFitWarning
from calib.posthoc.cir import CenteredIsotonicRegression, CenteredIsotonicRegressionConfig, centred_isotonic_points

pytestmark = pytest.mark.usefixtures("one_thread")

CALIBRATION_SIZE = {2: 500, 10: 1000, 100: 2000}
TEST_SIZE = 1000

PROBABILITY_TOLERANCE = 1e-12
"""max |p̂_calib − p̂_cir-model| in float64 (measured: 3e-15, at K = 2)."""

PROBMETRICS_TOLERANCE = 1e-5
"""max |p̂_calib − p̂_probmetrics| (measured: 2.7e-6 at K = 2, 3.8e-7 at K = 10, 6e-8 at K = 100): probmetrics'
``flatten_binary_probs`` rounds each class's scores to float32 before cir-model fits them."""


def binary_logits(p1):
    """Logits whose softmax is (1 − p1, p1)."""
    p1 = torch.tensor(p1, dtype=torch.float64)
    return torch.stack([(1 - p1).log(), p1.log()], dim=1)


def cir_probs(calibrator, p1):
    return calibrator.probs(binary_logits(p1))[:, 1].numpy()


def test_hand_computed_examples():
    # Scores 0.1 … 0.6, labels 0, 1, 0, 0, 1, 1: IR 0, ⅓, ⅓, ⅓, 1, 1. The block at 0 keeps its end (0.1, 0), the
    # block {0.2, 0.3, 0.4} collapses to (0.3, ⅓), the block at 1 keeps both ends (0.5, 1), (0.6, 1).
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    calibrator = CenteredIsotonicRegression().fit(binary_logits(scores), torch.tensor([0, 1, 0, 0, 1, 1]))
    x, g = calibrator.points[0]
    np.testing.assert_allclose(x, [0.1, 0.3, 0.5, 0.6], rtol=1e-14)
    np.testing.assert_allclose(g, [0, 1 / 3, 1, 1], rtol=0, atol=1e-15)
    # g(0.2) = ⅙ (IR: ⅓), g(0.35) = ⅓ + ¼·⅔ = ½, g(0.4) = ⅔, constant beyond the calibration scores
    np.testing.assert_allclose(cir_probs(calibrator, [0.2, 0.35, 0.4, 0.05, 0.7]), [1 / 6, 1 / 2, 2 / 3, 0, 1],
                               rtol=0, atol=1e-12)
    # Labels 1, 0, 0, 1, 1, 0: IR ⅓ ×3, ⅔ ×3. Neither block is at 0 or 1: the first keeps its lower end, the last its
    # upper end: (0.1, ⅓), (0.2, ⅓), (0.5, ⅔), (0.6, ⅔).
    calibrator = CenteredIsotonicRegression().fit(binary_logits(scores), torch.tensor([1, 0, 0, 1, 1, 0]))
    np.testing.assert_allclose(calibrator.points[0][0], [0.1, 0.2, 0.5, 0.6], rtol=1e-14)
    np.testing.assert_allclose(cir_probs(calibrator, [0.05, 0.15, 0.3, 0.35, 0.5, 0.65]),
                               [1 / 3, 1 / 3, 4 / 9, 1 / 2, 2 / 3, 2 / 3], rtol=0, atol=1e-12)


def test_strictly_increasing_between_block_centres_and_equal_to_ir_there():
    # Oron & Flournoy: g agrees with isotonic regression at each block's centre (its mean score) and interpolates
    # linearly between them, so it is strictly increasing between the centres of blocks not at 0 or 1.
    rng = np.random.default_rng(0)
    for _ in range(10):
        scores = rng.integers(0, 60, 400) / 60
        labels = (rng.random(400) < 0.1 + 0.8 * scores).astype(float)
        x, g = centred_isotonic_points(scores, labels)
        fitted = IsotonicRegression().fit(scores, labels).predict(scores)
        for value in np.unique(fitted):
            in_block = fitted == value
            assert np.interp(scores[in_block].mean(), x, g) == pytest.approx(value, abs=1e-12)
        inner = (g > 0) & (g < 1)
        assert np.all(np.diff(g[inner]) >= 0)
        centres = np.array([scores[fitted == v].mean() for v in np.unique(fitted) if 0 < v < 1])
        grid = np.linspace(centres.min(), centres.max(), 2000)
        assert np.all(np.diff(np.interp(grid, x, g)) > 0)
        assert np.all(np.diff(np.interp(np.linspace(-0.1, 1.1, 2000), x, g)) >= 0)  # non-decreasing everywhere


def test_the_argmax_can_change():
    calibrator = CenteredIsotonicRegression().fit(binary_logits([0.6] * 10 + [0.9] * 10),
                                                  torch.tensor([0] * 8 + [1] * 12))
    probs = calibrator.probs(binary_logits([0.6]))
    assert probs[0, 1].item() == pytest.approx(0.2, abs=1e-15) and probs.argmax(1).item() == 0


def test_an_absent_class_is_flagged_and_gets_zero():
    split = reference_split(10, 300, 200, seed=4)
    z, y = split.calibration_tensors()
    keep = y != 3
    with pytest.warns(DegenerateFitWarning, match=r"CenteredIsotonicRegression: degenerate fit: class 3 absent from "
                                                  r"the calibration set: centred isotonic regression maps their"):
        calibrator = CenteredIsotonicRegression().fit(z[keep], y[keep])
    log_probs = calibrator(torch.from_numpy(split.test_logits))
    assert (log_probs[:, 3] == np.log(PROBABILITY_FLOOR)).all()


@pytest.mark.parametrize(("name", "logits", "labels"), edge_case_data())
def test_edge_cases(name, logits, labels):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        calibrator = CenteredIsotonicRegression().fit(logits, labels)
    g = torch.Generator().manual_seed(0)
    test = torch.cat([logits, 4 * torch.randn(30, logits.shape[1], generator=g, dtype=torch.float64)])
    probs = calibrator.probs(test)
    assert torch.isfinite(calibrator(test)).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(1), torch.ones(len(test), dtype=torch.float64))
    assert calibrator.degenerate == (len(torch.unique(labels)) < logits.shape[1])
    if name == "ties":
        torch.testing.assert_close(probs[:10].repeat(20, 1), probs[:200], rtol=0, atol=0)


def test_registry_config_and_errors():
    assert POSTHOC.get("cir") is CenteredIsotonicRegression
    assert METHODS.get("cir").config is CenteredIsotonicRegressionConfig
    assert from_dict(CenteredIsotonicRegressionConfig, {"calibration_draw": 2}).calibration_draw == 2
    with pytest.raises(ConfigError, match=r"`calibration_draw` must be an integer >= 0, got calibration_draw=-1\."):
        CenteredIsotonicRegressionConfig(calibration_draw=-1)
    with pytest.raises(ConfigError, match=r"Unknown key 'non_centered_points' for CenteredIsotonicRegressionConfig"):
        from_dict(CenteredIsotonicRegressionConfig, {"non_centered_points": [0, 1]})
    with pytest.raises(RuntimeError, match=r"CenteredIsotonicRegression is not fitted"):
        CenteredIsotonicRegression()(torch.zeros(2, 3))
    calibrator = CenteredIsotonicRegression().fit(torch.randn(30, 3), torch.arange(30) % 3)
    with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 2"):
        calibrator(torch.zeros(2, 2))


def test_runs_as_a_method_on_float32_logits():
    check_runs_as_a_method([("cir", CenteredIsotonicRegressionConfig()),
                            ("cir", CenteredIsotonicRegressionConfig(calibration_size=60))])


@pytest.fixture(scope="module", params=CLASS_COUNTS, ids=lambda k: f"K{k}")
def fitted(request):
    """(split, calib's test probabilities) per K (seed K)."""
    split = reference_split(request.param, CALIBRATION_SIZE[request.param], TEST_SIZE, seed=request.param)
    calibrator = CenteredIsotonicRegression().fit(*split.calibration_tensors())
    return split, calibrator.probs(torch.from_numpy(split.test_logits)).numpy()


def test_against_cir_model(fitted):
    # cir-model's CenteredIsotonicRegression in float64 with probmetrics' conventions: K = 2 one fit on p_1, else one
    # per class on p_k; new scores clipped to the calibration range, outputs to [0, 1]; MulticlassOneVsRestCalibrator
    # floors the K outputs at 1e-30 and renormalises.
    from cir_model import CenteredIsotonicRegression as CIRModel

    split, actual = fitted
    calibration, test = softmax(split.calibration_logits, axis=1), softmax(split.test_logits, axis=1)
    classes = [1] if split.num_classes == 2 else range(split.num_classes)
    mapped = []
    for k in classes:
        model = CIRModel().fit(calibration[:, k], (split.calibration_labels == k).astype(np.float64))
        low, high = calibration[:, k].min(), calibration[:, k].max()
        mapped.append(np.clip(model.transform(np.clip(test[:, k], low, high)), 0.0, 1.0))
    mapped = np.stack(mapped, axis=1)
    if split.num_classes == 2:
        expected = np.concatenate([1 - mapped, mapped], axis=1)
    else:
        expected = np.maximum(mapped, 1e-30) / np.maximum(mapped, 1e-30).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=PROBABILITY_TOLERANCE)


def test_against_probmetrics(fitted):
    # probmetrics 1.3 get_calibrator("cir") = MulticlassOneVsRestCalibrator(CenteredIsotonicRegressionCalibrator()),
    # what CalArena runs, on the softmax probabilities.
    from probmetrics.calibrators import get_calibrator

    split, actual = fitted
    reference = get_calibrator("cir").fit(softmax(split.calibration_logits, axis=1),
                                          split.calibration_labels).predict_proba(softmax(split.test_logits, axis=1))
    np.testing.assert_allclose(actual, reference, rtol=0, atol=PROBMETRICS_TOLERANCE)


def sklearn_merged(scores: np.ndarray) -> np.ndarray:
    """Each score replaced by the first score of its run, in ascending order, of scores less than float64's
    resolution (1e-15, absolute) above it: what scikit-learn's ``IsotonicRegression.fit``, which cir-model calls,
    does to nearly tied inputs before it pools them."""
    resolution = np.finfo(np.float64).resolution
    merged, start = scores.copy(), None
    for i in np.argsort(scores, kind="stable"):
        if start is None or scores[i] - start >= resolution:
            start = scores[i]
        merged[i] = start
    return merged


def test_scores_closer_than_1e_15_are_the_one_difference_from_cir_model():
    """A confident model puts scores of 1e-20 to 1e-13 on its other classes, and a confident mistake gives such a
    score a positive label. calib pools exactly tied scores only (the paper's IR); cir-model, through scikit-learn's
    ``IsotonicRegression``, also pools distinct scores less than 1e-15 apart, and then builds CIR's blocks from its
    own interpolation at the unpooled scores. That alone is why the two differ on such scores (WRN-16-4 / CIFAR-10,
    docs/how-to/benchmarks.md): with the scores merged that way first, they agree to float64 rounding."""
    from cir_model import CenteredIsotonicRegression as CIRModel

    rng = np.random.default_rng(0)
    tiny, moderate = 10 ** rng.uniform(-20, -13, 600), rng.uniform(1e-3, 1.0, 1400)
    scores = np.concatenate([tiny, moderate])
    targets = np.concatenate([rng.random(600) < 0.01, rng.random(1400) < moderate]).astype(np.float64)
    new = np.concatenate([10 ** rng.uniform(-20, -13, 300), rng.uniform(1e-3, 1.0, 300)])

    def difference(calibration_scores):
        x, g = centred_isotonic_points(calibration_scores, targets)
        clipped = np.clip(new, calibration_scores.min(), calibration_scores.max())
        return np.abs(np.interp(clipped, x, g) - CIRModel().fit(calibration_scores, targets).predict(clipped)).max()

    assert difference(scores) > 1e-3  # measured: 4.7e-3
    assert difference(sklearn_merged(scores)) <= PROBABILITY_TOLERANCE  # measured: 3.3e-16
