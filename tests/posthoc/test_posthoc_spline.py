"""Spline calibration (docs/methods.md §5): against an independent scipy natural-spline fit."""


import numpy as np
import pytest
import torch
from posthoc_cases import check_runs_as_a_method, edge_case_data
from scipy.interpolate import CubicSpline
from scipy.special import softmax

from calib._config import ConfigError, from_dict
from calib.methods import METHODS
from calib.posthoc import POSTHOC
from calib.posthoc.spline import SplineCalibration, SplineConfig, natural_spline_bases


def scipy_bases(x, num_knots):
    """Value and derivative bases from scipy's natural cubic splines through the unit knot vectors."""
    knots = np.linspace(0, 1, num_knots)
    splines = [CubicSpline(knots, np.eye(num_knots)[j], bc_type="natural") for j in range(num_knots)]
    return np.stack([s(x) for s in splines], 1), np.stack([s(x, 1) for s in splines], 1)


def reference_fit(logits, labels, num_knots):
    """(sorted top scores, calibrated confidences a) written from the paper and the official recalibrate.py."""
    probs = softmax(logits.numpy(), axis=1)
    top, correct = probs.max(1), (probs.argmax(1) == labels.numpy()).astype(float)
    order = np.argsort(top, kind="stable")  # within ties: the calibration set's order
    s, c = top[order], correct[order]
    n = len(s)
    fraction = np.linspace(0, 1, n)
    values, slopes = scipy_bases(fraction, num_knots)
    coefficients = np.linalg.lstsq(values, np.cumsum(c) / n - np.cumsum(s) / n, rcond=None)[0]
    return s, slopes @ coefficients + s


def reference_distribution(probs, confidence, margin=1e-9):
    """Row by row, the documented top-label distribution: the top class gets max(c, 1/(C − (C − 1)·margin)); the
    others, largest p first, take their share t·p_j of the rest, or the cap c·(1 − margin) where t·p_j would
    exceed it (t recomputed for the classes still uncapped); classes with p_j = 0 share what is left equally."""
    out = np.zeros_like(probs)
    num_classes = probs.shape[1]
    for i, row in enumerate(probs):
        top = int(np.argmax(row))
        c = max(confidence[i], 1 / (num_classes - (num_classes - 1) * margin))
        cap, rest = c * (1 - margin), 1 - c
        others = sorted((j for j in range(num_classes) if j != top), key=lambda j: -row[j])
        out[i, top] = c
        uncapped = [j for j in others if row[j] > 0]
        while uncapped:
            scale = rest / sum(row[j] for j in uncapped)
            if scale * row[uncapped[0]] <= cap:
                for j in uncapped:
                    out[i, j] = scale * row[j]
                rest = 0.0
                break
            out[i, uncapped[0]] = cap
            rest -= cap
            uncapped = uncapped[1:]
        zeros = [j for j in others if row[j] == 0]
        for j in zeros:
            out[i, j] = rest / len(zeros)
    return out


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(2000, 5, generator=g, dtype=torch.float64)
    labels = torch.multinomial((logits / 2).softmax(1), 1, generator=g).squeeze(1)  # overconfident logits
    test = 3 * torch.randn(500, 5, generator=g, dtype=torch.float64)
    return logits, labels, test


@pytest.mark.parametrize("num_knots", [2, 3, 6, 10])
def test_bases_match_scipy_natural_splines(num_knots):
    x = np.concatenate([np.linspace(0, 1, 57), [0.0, 1.0, 1 / 3, 0.5]])
    values, slopes = natural_spline_bases(x, num_knots)
    expected_values, expected_slopes = scipy_bases(x, num_knots)
    np.testing.assert_allclose(values, expected_values, atol=1e-12)
    np.testing.assert_allclose(slopes, expected_slopes, atol=1e-10)


@pytest.mark.parametrize("num_knots", [6, 4])
def test_matches_the_independent_scipy_fit(data, num_knots):
    logits, labels, test = data
    calibrator = SplineCalibration(num_knots=num_knots).fit(logits, labels)
    scores, calibrated = reference_fit(logits, labels, num_knots)
    np.testing.assert_allclose(calibrator.score_points, scores)  # distinct scores here
    np.testing.assert_allclose(calibrator.calibrated_points, calibrated, atol=1e-10)
    probs_test = softmax(test.numpy(), axis=1)
    rows, top = np.arange(len(probs_test)), probs_test.argmax(1)
    confidence = np.clip(np.interp(probs_test[rows, top], scores, calibrated), 0, 1)
    expected = reference_distribution(probs_test, confidence)
    probs = calibrator.probs(test).numpy()
    np.testing.assert_allclose(probs, expected, rtol=1e-9, atol=1e-12)
    # the predicted class is kept with the calibrated confidence (where that is >= 1/C)
    assert (probs.argmax(1) == top).all()
    above = confidence >= 1 / 5
    np.testing.assert_allclose(probs[rows, top][above], confidence[above], rtol=1e-12)
    # Overconfident logits: the calibrated top confidence is lower on average.
    assert calibrator.probs(test).max(1).values.mean() < probs_test.max(1).mean() - 0.05


def test_two_knots_is_a_least_squares_line():
    # K = 2: σ is the least-squares line through (t_i, A_i − S_i), so a_i = s_i + its slope.
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(300, 3, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (300,), generator=g)
    probs = softmax(logits.numpy(), axis=1)
    top, correct = probs.max(1), (probs.argmax(1) == labels.numpy())
    order = np.argsort(top)
    slope = np.polyfit(np.linspace(0, 1, 300), np.cumsum(correct[order] - top[order]) / 300, 1)[0]
    calibrator = SplineCalibration(num_knots=2).fit(logits, labels)
    np.testing.assert_allclose(calibrator.calibrated_points, top[order] + slope, atol=1e-12)


def test_off_the_range_is_constant_and_clipped():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(200, 4, generator=g, dtype=torch.float64)
    calibrator = SplineCalibration().fit(logits, torch.randint(0, 4, (200,), generator=g))
    below, above = calibrator.score_points[0] / 2, (1 + calibrator.score_points[-1]) / 2
    expected = np.clip(calibrator.calibrated_points[[0, -1]], 0, 1)
    np.testing.assert_allclose(calibrator.calibrated_confidence(np.array([below, above])), expected)
    confidences = calibrator.calibrated_confidence(np.linspace(0.25, 1, 100))
    assert confidences.min() >= 0 and confidences.max() <= 1


def test_tied_scores_are_averaged():
    # Rows repeat: each tie group of top scores gets the mean of its a_i; identical rows map identically.
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(10, 3, generator=g, dtype=torch.float64).repeat(30, 1)
    labels = torch.randint(0, 3, (300,), generator=g)
    calibrator = SplineCalibration().fit(logits, labels)
    scores, calibrated = reference_fit(logits, labels, 6)
    assert len(calibrator.score_points) == 10
    for point, value in zip(calibrator.score_points, calibrator.calibrated_points, strict=True):
        assert value == pytest.approx(calibrated[scores == point].mean(), abs=1e-12)
    probs = calibrator.probs(logits)
    torch.testing.assert_close(probs[:10].repeat(30, 1), probs, rtol=0, atol=0)


def test_the_argmax_is_kept_and_the_others_are_capped_below_it():
    # Top scores 0.5 are always wrong: their calibrated confidence ĉ is ~0. Proportional sharing would give the
    # runner-up (0.4) ~0.8 and move the argmax; instead the top class keeps the floor 1/C and the others are
    # capped just below it, so the row becomes (nearly) uniform with class 0 still first.
    rows = torch.tensor([[0.5, 0.4, 0.1], [0.1, 0.8, 0.1]], dtype=torch.float64).log()
    logits, labels = rows.repeat(50, 1), torch.tensor([1, 1]).repeat(50)
    calibrator = SplineCalibration().fit(logits, labels)
    assert calibrator.calibrated_confidence(np.array([0.5]))[0] < 0.1  # below 1/C: the floor binds
    probs = calibrator.probs(rows)
    assert probs.argmax(1).tolist() == [0, 1]
    floor = 1 / (3 - 2e-9)
    assert probs[0, 0].item() == pytest.approx(floor, rel=1e-12)
    assert probs[0, 0] > probs[0, 1] and probs[0, 0] > probs[0, 2]
    torch.testing.assert_close(probs[0], torch.full((3,), 1 / 3, dtype=torch.float64), rtol=0, atol=1e-8)
    # a confidence the cap does not bind: the others keep their proportions
    mild = calibrator.probs(torch.tensor([[0.1, 0.8, 0.1]], dtype=torch.float64).log())
    assert mild[0, 0] / mild[0, 2] == pytest.approx(1.0) and mild.argmax().item() == 1
    # A top class holding all the mass: the others (p = 0) share 1 − ĉ uniformly.
    saturated = calibrator.probs(torch.tensor([[0.0, -800.0, -800.0]], dtype=torch.float64))
    assert saturated[0, 1] == saturated[0, 2] == pytest.approx((1 - saturated[0, 0].item()) / 2)


@pytest.mark.parametrize(("name", "logits", "labels"), edge_case_data())
def test_edge_cases(name, logits, labels):
    calibrator = SplineCalibration().fit(logits, labels)
    test = torch.cat([logits, 4 * torch.randn(30, logits.shape[1], dtype=torch.float64)])
    out, probs = calibrator(test), calibrator.probs(test)
    assert torch.isfinite(out).all() and out.dtype == torch.float64
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(1), torch.ones(len(test), dtype=torch.float64))
    assert np.isfinite(calibrator.knot_values).all()


def test_single_sample_fits():
    calibrator = SplineCalibration().fit(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
    assert torch.isfinite(calibrator.probs(torch.randn(5, 2))).all()


def test_registry_config_and_errors():
    assert POSTHOC.get("spline") is SplineCalibration and METHODS.get("spline").config is SplineConfig
    assert SplineConfig().num_knots == 6 and from_dict(SplineConfig, {"num_knots": 8}).num_knots == 8
    with pytest.raises(ConfigError, match=r"`num_knots` must be an integer >= 2, got num_knots=1"):
        SplineConfig(num_knots=1)
    with pytest.raises(ValueError, match=r"`num_knots` must be an integer >= 2, got num_knots=1"):
        SplineCalibration(num_knots=1)
    with pytest.raises(RuntimeError, match=r"SplineCalibration is not fitted"):
        SplineCalibration()(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 2"):
        SplineCalibration().fit(torch.randn(9, 3), torch.arange(9) % 3)(torch.zeros(2, 2))


def test_runs_as_a_method_on_float32_logits():
    cases = [("spline", SplineConfig()), ("spline", SplineConfig(num_knots=4, calibration_size=60))]
    check_runs_as_a_method(cases)
