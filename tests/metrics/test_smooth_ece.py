"""Tests for calib/metrics/smooth_ece.py (SmoothECE via relplot) against an exact kernel computation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import relplot
from metric_cases import binary, overconfident_probs

from calib.metrics import smooth_ece
from calib.metrics._binning import top_label
from calib.metrics.smooth_ece import _smece_with_bandwidth

BISECTION_STEP = 2.0**-10  # relplot.smECE halves [0, 1] ten times


def smooth_case(n: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Over-confident random predictions whose confidences stay below 0.999 (see test_confidence_one)."""
    return overconfident_probs(n, num_classes, seed, scale=2.0, below_confidence=0.999)


def reflected_kernel(t: np.ndarray, f: np.ndarray, sigma: float) -> np.ndarray:
    """K_σ(t_j, f_i) = φ_σ(t − f) + φ_σ(t + f) + φ_σ(t − 2 + f): the Gaussian reflected at 0 and 1, exact."""

    def phi(x: np.ndarray) -> np.ndarray:
        return np.exp(-0.5 * (x / sigma) ** 2) / (sigma * np.sqrt(2 * np.pi))

    d_minus, d_plus = t[:, None] - f[None, :], t[:, None] + f[None, :]
    return phi(d_minus) + phi(d_plus) + phi(d_plus - 2.0)


def exact_smece(f: np.ndarray, y: np.ndarray, sigma: float) -> float:
    """smECE_σ with the exact kernel at every sample (no rounding onto a grid, no discrete convolution),
    summed over relplot's evaluation points t (max(200, 10/σ) on [0, 1]):
    Σ_t |Σ_i K(t, f_i)(f_i − y_i)| / Σ_t Σ_i K(t, f_i)."""
    t = np.linspace(0.0, 1.0, max(round(10 / sigma), 200))
    kernel = reflected_kernel(t, f, sigma)
    return float(np.abs(kernel @ (f - y)).sum() / kernel.sum())


def integral_smece(f: np.ndarray, y: np.ndarray, sigma: float) -> float:
    """smECE_σ = (1/N) ∫_0^1 |Σ_i K(t, f_i)(f_i − y_i)| dt, the paper's definition, by the trapezoid rule."""
    t = np.linspace(0.0, 1.0, 4001)
    residual = sum(reflected_kernel(t, f[i : i + 250], sigma) @ (f - y)[i : i + 250] for i in range(0, f.size, 250))
    return float(np.trapezoid(np.abs(residual), t) / f.size)


def confidences_correct(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return top_label(np.asarray(probs, dtype=float), np.asarray(labels))


CASES = {
    "2000x10": smooth_case(2000, 10, 0),
    "500x3": smooth_case(500, 3, 1),
    "50x10": smooth_case(50, 10, 2),
}


class TestExactKernel:
    @pytest.mark.parametrize("name", list(CASES))
    @pytest.mark.parametrize("sigma", [0.02, 0.05, 0.1])
    def test_relplot_at_fixed_sigma(self, name: str, sigma: float) -> None:
        # relplot.smECE_sigma rounds the samples onto a grid and convolves; the exact kernel agrees.
        f, y = confidences_correct(*CASES[name])
        assert relplot.smECE_sigma(f, y, sigma) == pytest.approx(exact_smece(f, y, sigma), rel=2e-4)

    @pytest.mark.parametrize("name", list(CASES))
    def test_value_is_smece_at_the_chosen_bandwidth(self, name: str) -> None:
        probs, labels = CASES[name]
        f, y = confidences_correct(probs, labels)
        value, sigma = _smece_with_bandwidth(f, y)
        assert smooth_ece(probs, labels) == value
        assert value == relplot.smECE_sigma(f, y, sigma)
        assert value == pytest.approx(exact_smece(f, y, sigma), rel=1e-3)
        # The sum over relplot's grid of t is within 0.5% of the paper's integral here.
        assert value == pytest.approx(integral_smece(f, y, sigma), rel=5e-3)

    @pytest.mark.parametrize("name", list(CASES))
    def test_bandwidth_is_the_fixed_point(self, name: str) -> None:
        # Bisection keeps smECE_σ <= σ at the returned σ* and smECE_σ > σ one step below it.
        f, y = confidences_correct(*CASES[name])
        value, sigma = _smece_with_bandwidth(f, y)
        assert sigma / BISECTION_STEP == int(sigma / BISECTION_STEP)
        assert value <= sigma
        below = sigma - BISECTION_STEP
        assert relplot.smECE_sigma(f, y, below) > below
        assert 0.0 <= sigma - value <= 2 * BISECTION_STEP
        # The same bracket with the exact kernel, up to its agreement with relplot.
        assert exact_smece(f, y, sigma) <= sigma * (1 + 2e-3)
        assert exact_smece(f, y, below) >= below * (1 - 2e-3)


class TestValues:
    def test_calibrated_large_sample_is_small(self) -> None:
        # Labels drawn from probs: P(correct | probs) = max probs, top-label calibrated.
        rng = np.random.default_rng(3)
        logits = rng.normal(scale=2.0, size=(20_000, 10))
        probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        labels = (rng.random((20_000, 1)) > probs.cumsum(axis=1)).sum(axis=1)
        assert smooth_ece(probs, labels) < 0.02
        assert smooth_ece(*CASES["2000x10"]) > 0.1  # labels from sharpened probs: over-confident

    def test_equal_confidences(self) -> None:
        # One confidence c for every sample: r̂(t) = c − acc everywhere, so smECE_σ = |c − acc| for all σ.
        probs, labels = binary([0.6] * 10, [1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
        assert smooth_ece(probs, labels) == pytest.approx(0.3, abs=1e-3)

    def test_all_correct_and_all_wrong(self) -> None:
        # Every residual has the same sign and the reflected kernel integrates to 1 over [0, 1], so
        # smECE_σ = mean(1 − conf) (all correct) or mean(conf) (all wrong) for every σ.
        conf = np.random.default_rng(4).uniform(0.5, 0.99, 500)
        probs, labels = binary(conf.tolist(), [1] * 500)
        assert smooth_ece(probs, labels) == pytest.approx(np.mean(1 - conf), abs=2e-3)
        probs, labels = binary(conf.tolist(), [0] * 500)
        assert smooth_ece(probs, labels) == pytest.approx(np.mean(conf), abs=2e-3)

    @pytest.mark.parametrize(("correct", "expected"), [(1, 0.3), (0, 0.7)])
    def test_single_sample(self, correct: int, expected: float) -> None:
        probs, labels = binary([0.7], [correct])
        assert smooth_ece(probs, labels) == pytest.approx(expected, abs=1e-3)

    def test_class_absent(self) -> None:
        probs, labels = smooth_case(300, 4, seed=5)
        labels = np.where(labels == 3, 0, labels)
        f, y = confidences_correct(probs, labels)
        value, sigma = _smece_with_bandwidth(f, y)
        assert smooth_ece(probs, labels) == value == pytest.approx(exact_smece(f, y, sigma), rel=2e-3)

    def test_ties(self) -> None:
        # Rounded logits: few distinct confidences; relplot does not depend on the order of the samples.
        rng = np.random.default_rng(6)
        logits = np.round(rng.normal(scale=1.5, size=(400, 3)))
        probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        labels = rng.integers(0, 3, size=400)
        f, y = confidences_correct(probs, labels)
        value, sigma = _smece_with_bandwidth(f, y)
        assert value == pytest.approx(exact_smece(f, y, sigma), rel=2e-3)
        order = rng.permutation(400)
        assert smooth_ece(probs[order], labels[order]) == pytest.approx(value, abs=1e-12)


def test_confidence_one_counts_at_half_weight_in_relplot() -> None:
    # Documents a relplot discretisation effect that calib inherits (docs/methods.md §6.11): a
    # confidence within 1/1000 of 1 sits (partly) on relplot's last grid point, whose mass is not
    # reflected, so it weighs about half. Half the samples at conf 1 (right, residual 0), half at
    # conf .6 with acc .3: the exact smECE_σ is ½·.3 = .15; relplot gives about .3·1/(1 + ½) = .2.
    f = np.array([1.0] * 10 + [0.6] * 10)
    y = np.array([1.0] * 10 + [1.0] * 3 + [0.0] * 7)
    assert integral_smece(f, y, 0.05) == pytest.approx(0.15, abs=1e-4)
    assert relplot.smECE_sigma(f, y, 0.05) == pytest.approx(0.2, abs=0.01)


def test_global_state_untouched() -> None:
    # In a fresh process: importing calib.metrics imports neither relplot nor matplotlib; computing
    # SmoothECE leaves warnings filters, relplot.config and matplotlib's rcParams as they were.
    code = """
import sys, warnings
import calib.metrics as m
assert "relplot" not in sys.modules and "matplotlib" not in sys.modules, "eager import"
import matplotlib
filters, rc = list(warnings.filters), dict(matplotlib.rcParams)
m.smooth_ece([[0.9, 0.1], [0.3, 0.7]], [0, 0])
import relplot
assert "relplot" in sys.modules and list(warnings.filters) == filters, "warnings filters changed"
assert dict(matplotlib.rcParams) == rc, "rcParams changed"
assert relplot.config.use_logit_scaling is False and relplot.config.smECE_mesh_pts == 200
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_logit_scaling_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relplot.config, "use_logit_scaling", True)
    with pytest.raises(RuntimeError, match=r"relplot\.config\.use_logit_scaling is True"):
        smooth_ece([[0.9, 0.1], [0.3, 0.7]], [0, 0])
