"""Tests for calib/metrics/_compute.py: METRICS, compute_all, higher_is_better."""

from __future__ import annotations

import numpy as np
import pytest

import calib.metrics as metrics
from calib.metrics import METRICS, MetricSpec, compute_all, higher_is_better

NAMES = [
    "accuracy", "ece", "aece", "mce", "oece", "uece", "cwece", "nll", "brier", "aurc", "augrc", "smece", "ece_sweep",
    "l2ce_debiased", "ks_ce", "nll_calibration", "nll_refinement", "brier_calibration", "brier_refinement",
]


def test_names() -> None:
    assert list(METRICS) == NAMES
    assert all(isinstance(spec, MetricSpec) for spec in METRICS.values())


def test_public_surface() -> None:
    for name in metrics.__all__:
        assert hasattr(metrics, name), name
    assert not any(name.startswith("_") for name in metrics.__all__)


@pytest.mark.parametrize("name", NAMES)
def test_direction(name: str) -> None:
    assert higher_is_better(name) is (name == "accuracy")
    assert METRICS[name].higher_is_better is higher_is_better(name)


def test_worked_example(worked: tuple[np.ndarray, np.ndarray]) -> None:
    # The hand-computed values of the per-metric tests: ECE family with 5 bins; AECE is checked by
    # hand at 3 bins in test_adaptive_ece.py, so here only against its own function.
    probs, labels = worked
    result = compute_all(probs, labels, num_bins=5)
    expected = {
        "accuracy": 4 / 6,
        "ece": 0.325 / 3,
        "mce": 0.175,
        "oece": 0.175 / 3,
        "uece": 0.05,
        "cwece": 5.1 / 18,
        "brier": 2.63 / 6,
        "aurc": 67 / 360,
        "augrc": 5 / 36,
        "ece_sweep": 0.325 / 3,  # B* = 3, see test_worked_example_ece_sweep
        "l2ce_debiased": 0.0,  # chunks of 2, 1, 1, 1, 1: only {.45, .50} counts, .025² − .25 < 0
    }
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-12), name
    assert compute_all(probs, labels, num_bins=3)["aece"] == pytest.approx(0.25, abs=1e-12)


def test_worked_example_ece_sweep(worked: tuple[np.ndarray, np.ndarray]) -> None:
    # Sorted conf .45 .50 .65 .70 .85 .90, correct 0 1 1 0 1 1. B = 2: acc 2/3, 2/3; B = 3: .5, .5, 1
    # (monotone); B = 4 (ranks r·4//6 = 0 0 1 2 2 3): .5, 1, .5, 1, not -> B* = 3, bins of two:
    # conf .475, .675, .875 vs acc .5, .5, 1 -> (2/6)(.025 + .175 + .125) = .325/3 (= the ECE here).
    probs, labels = worked
    assert compute_all(probs, labels)["ece_sweep"] == pytest.approx(0.325 / 3, abs=1e-12)


@pytest.mark.parametrize("num_bins", [1, 15])
def test_compute_all_matches_each_function(random_case: tuple[np.ndarray, np.ndarray], num_bins: int) -> None:
    probs, labels = random_case
    result = compute_all(probs, labels, num_bins=num_bins)
    assert list(result) == NAMES
    for name, spec in METRICS.items():
        assert isinstance(result[name], float)
        assert result[name] == spec(probs, labels, num_bins=num_bins), name
        low, high = spec.bounds
        assert low <= result[name] <= high, name
    assert result["oece"] + result["uece"] == pytest.approx(result["ece"], abs=1e-12)


def test_spec_call_passes_num_bins_only_when_binned(worked: tuple[np.ndarray, np.ndarray]) -> None:
    probs, labels = worked
    assert METRICS["ece"](probs, labels, num_bins=5) == metrics.expected_calibration_error(
        probs, labels, num_bins=5
    )
    assert METRICS["nll"](probs, labels, num_bins=5) == metrics.negative_log_likelihood(probs, labels)
    assert METRICS["brier"].binned is False and METRICS["cwece"].binned is True
    assert METRICS["smece"].binned is False and METRICS["ece_sweep"].binned is False
    assert METRICS["l2ce_debiased"].binned is True


def test_errors(worked: tuple[np.ndarray, np.ndarray]) -> None:
    probs, labels = worked
    with pytest.raises(
        KeyError, match=r"Unknown metric 'eec'\. Did you mean 'ece'.*Valid metric names: accuracy, ece"
    ):
        higher_is_better("eec")
    with pytest.raises(
        KeyError,
        match=r"Valid metric names: accuracy, ece, aece, mce, oece, uece, cwece, nll, brier, aurc, augrc, smece, "
        r"ece_sweep, l2ce_debiased, ks_ce, nll_calibration, nll_refinement, brier_calibration, brier_refinement\.",
    ):
        higher_is_better("ece_pct")
    with pytest.raises(ValueError, match=r"^`num_bins` must be an integer >= 1, got num_bins=0\.$"):
        compute_all(probs, labels, num_bins=0)
    with pytest.raises(ValueError, match=r"^`num_bins` must be an integer >= 1, got num_bins=0\.$"):
        METRICS["nll"](probs, labels, num_bins=0)
    with pytest.raises(KeyError, match=r"post-hoc calibrator.*'temprature_scaling'.*temperature_scaling"):
        compute_all(probs, labels, recalibrator="temprature_scaling")


def test_worked_example_split_and_ks(worked: tuple[np.ndarray, np.ndarray]) -> None:
    # N = 6 < 5 folds? No: 6 >= 5, but no class has 5 samples (3, 2, 1), so the folds are plain KFold ones; the
    # split is the same as calibration_refinement's, and calibration + refinement is the loss itself.
    probs, labels = worked
    result = compute_all(probs, labels)
    split = metrics.calibration_refinement(probs, labels)
    for loss in ("nll", "brier"):
        assert result[f"{loss}_calibration"] == split[f"{loss}_calibration"]
        assert result[f"{loss}_calibration"] + result[f"{loss}_refinement"] == pytest.approx(result[loss], abs=1e-12)
    # sorted confidences .45 .50 .65 .70 .85 .90, correct 0 1 1 0 1 1: c − y = .45 −.5 −.35 .7 −.15 −.1, cumulative
    # .45 −.05 −.4 .3 .15 .05: max |·| = .45, / 6
    assert result["ks_ce"] == pytest.approx(0.45 / 6, abs=1e-12)
    other = compute_all(probs, labels, recalibrator="histogram_binning")
    assert other["nll_refinement"] == metrics.calibration_refinement(
        probs, labels, recalibrator="histogram_binning")["nll_refinement"] != result["nll_refinement"]
