"""Tests for calib/metrics/reliability.py: reliability bins and the Clopper–Pearson interval."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from calib.metrics import clopper_pearson, expected_calibration_error, reliability_bins


class TestReliabilityBins:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # 5 bins: (.4,.6] {.45 W, .50 R}, (.6,.8] {.70 W, .65 R}, (.8,1] {.90 R, .85 R}
        probs, labels = worked
        counts, conf, acc = reliability_bins(probs, labels, num_bins=5)
        assert counts.tolist() == [0, 0, 2, 2, 2]
        assert conf == pytest.approx([0, 0, 0.475, 0.675, 0.875], abs=1e-12)
        assert acc == pytest.approx([0, 0, 0.5, 0.5, 1.0], abs=1e-12)
        ece = np.sum(counts / counts.sum() * np.abs(acc - conf))
        assert ece == pytest.approx(expected_calibration_error(probs, labels, num_bins=5), abs=1e-12)


class TestClopperPearson:
    def test_main(self) -> None:
        # k = 0 of n = 10: lower 0; upper solves (1 - p)^10 = α/2, i.e. 1 - 0.025^(1/10) = 0.30850.
        # k = n = 10: by symmetry lower = 0.025^(1/10) = 0.69150, upper 1.
        lower, upper = clopper_pearson([0, 10], [10, 10])
        assert lower.tolist() == [0.0, pytest.approx(0.025 ** (1 / 10), abs=1e-12)]
        assert upper.tolist() == [pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-12), 1.0]
        # k = 1 of n = 1 at level .9: lower solves p = α/2 = .05
        lower, upper = clopper_pearson([1], [1], level=0.9)
        assert lower[0] == pytest.approx(0.05, abs=1e-12) and upper[0] == 1.0

    def test_scipy_beta_quantiles(self) -> None:
        rng = np.random.default_rng(0)
        counts = rng.integers(1, 500, size=200)
        successes = rng.integers(0, counts + 1)
        for level in (0.95, 0.8):
            alpha = 1 - level
            lower, upper = clopper_pearson(successes, counts, level=level)
            for k, n, lo, hi in zip(successes, counts, lower, upper, strict=True):
                expected_lo = 0.0 if k == 0 else stats.beta(k, n - k + 1).ppf(alpha / 2)
                expected_hi = 1.0 if k == n else stats.beta(k + 1, n - k).ppf(1 - alpha / 2)
                assert lo == pytest.approx(expected_lo, abs=1e-12)
                assert hi == pytest.approx(expected_hi, abs=1e-12)
                assert 0.0 <= lo <= k / n <= hi <= 1.0

    def test_scipy_binomtest(self) -> None:
        # scipy's exact binomial test gives the same interval
        for k, n in [(0, 7), (3, 7), (7, 7), (40, 113)]:
            ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
            lower, upper = clopper_pearson(k, n)
            assert (float(lower), float(upper)) == pytest.approx((ci.low, ci.high), abs=1e-10)

    def test_empty_bin_is_the_whole_interval(self) -> None:
        lower, upper = clopper_pearson(np.array([0, 2, 0]), np.array([0, 4, 0]))
        assert lower[[0, 2]].tolist() == [0.0, 0.0] and upper[[0, 2]].tolist() == [1.0, 1.0]

    def test_shapes_and_inputs(self) -> None:
        lower, upper = clopper_pearson(3, 7)  # scalars give 0-d arrays
        assert lower.shape == upper.shape == ()
        lower, upper = clopper_pearson(np.zeros((2, 3), dtype=int), np.full((2, 3), 5))
        assert lower.shape == upper.shape == (2, 3)
        # whole-valued floats (a rounded count · accuracy) are accepted
        as_float = clopper_pearson(np.array([3.0, 0.0]), np.array([7.0, 0.0]))
        as_int = clopper_pearson(np.array([3, 0]), np.array([7, 0]))
        assert np.array_equal(as_float[0], as_int[0]) and np.array_equal(as_float[1], as_int[1])
        torch = pytest.importorskip("torch")
        from_torch = clopper_pearson(torch.tensor([3, 0]), torch.tensor([7, 0]))
        assert np.array_equal(from_torch[1], as_int[1])

    def test_wider_at_higher_level(self) -> None:
        low95, high95 = clopper_pearson([5], [20])
        low99, high99 = clopper_pearson([5], [20], level=0.99)
        assert low99[0] < low95[0] < 0.25 < high95[0] < high99[0]

    def test_errors(self) -> None:
        with pytest.raises(ValueError, match=r"^`successes` must be <= `counts`, got successes\[1\]=5 > counts\[1\]=4"):
            clopper_pearson([1, 5], [2, 4])
        with pytest.raises(ValueError, match=r"^`successes` and `counts` must have the same shape, got \(2,\) and"):
            clopper_pearson([1, 2], [2, 4, 5])
        with pytest.raises(ValueError, match=r"^`counts` must be >= 0, got counts\[0\]=-1\.$"):
            clopper_pearson([0], [-1])
        with pytest.raises(ValueError, match=r"^`successes` must hold whole numbers, got successes\[0\]=1\.5\.$"):
            clopper_pearson([1.5], [3])
        with pytest.raises(ValueError, match=r"^`counts` must be an array of whole numbers >= 0, got dtype float64\.$"):
            clopper_pearson([1], [np.nan])
        with pytest.raises(ValueError, match=r"^`successes` must be an array of whole numbers >= 0, got dtype <U1\.$"):
            clopper_pearson(["a"], [3])
        for level in (0.0, 1.0, 95, True, "0.95"):
            with pytest.raises(ValueError, match=r"^`level` must be a number strictly between 0 and 1"):
                clopper_pearson([1], [3], level=level)  # type: ignore[arg-type]
