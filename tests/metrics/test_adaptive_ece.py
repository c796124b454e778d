"""Tests for calib/metrics/adaptive_ece.py (AECE, FOCAL-R equal-mass bins)."""

from __future__ import annotations

import numpy as np
import pytest
from metric_references import reference_aece

from calib.metrics import adaptive_calibration_error


class TestAdaptiveCalibrationError:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # Sorted conf [.45 .50 .65 .70 .85 .90]; M = 3: interp at positions [0 2 4 6] -> edges
        # [.45, .65, .85, .90] (position 6 clamps to the maximum).
        # (.45,.65]: {.50 right, .65 right} conf .575, acc 1  -> |gap| .425, weight 2/6
        # (.65,.85]: {.70 wrong, .85 right} conf .775, acc .5 -> |gap| .275, weight 2/6
        # (.85,.90]: {.90 right}            conf .9,   acc 1  -> |gap| .1,   weight 1/6
        # .45 equals the first edge and is excluded (FOCAL-R pitfall); N stays 6.
        # AECE = (2(.425) + 2(.275) + .1)/6 = 1.5/6 = .25
        probs, labels = worked
        assert adaptive_calibration_error(probs, labels, num_bins=3) == pytest.approx(0.25, abs=1e-12)

    def test_one_bin(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # Edges [.45, .90]: 5 samples, conf (.5+.65+.7+.85+.9)/5 = .72, acc 4/5 = .8.
        # AECE = (5/6)(.08) = .0666...
        probs, labels = worked
        assert adaptive_calibration_error(probs, labels, num_bins=1) == pytest.approx(0.4 / 6, abs=1e-12)

    def test_smallest_confidence_is_excluded(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # Making the least-confident sample (row 3, conf .45) correct changes nothing: it is in no bin.
        probs, labels = worked
        before = adaptive_calibration_error(probs, labels, num_bins=3)
        labels[3] = 2
        assert adaptive_calibration_error(probs, labels, num_bins=3) == before

    def test_single_sample(self) -> None:
        # N = 1: every edge equals the one confidence, so no sample is in a bin.
        assert adaptive_calibration_error(np.array([[0.3, 0.7]]), np.array([0])) == 0.0

    @pytest.mark.parametrize("num_bins", [1, 3, 15, 50])
    def test_independent_reference(self, random_case: tuple[np.ndarray, np.ndarray], num_bins: int) -> None:
        probs, labels = random_case
        expected = reference_aece(probs, labels, num_bins)
        assert adaptive_calibration_error(probs, labels, num_bins=num_bins) == pytest.approx(
            expected, abs=1e-12
        )

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        with pytest.raises(ValueError, match=r"^`num_bins` must be an integer >= 1, got num_bins=0\.$"):
            adaptive_calibration_error(probs, labels, num_bins=0)
