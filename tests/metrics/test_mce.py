"""Tests for calib/metrics/mce.py."""

from __future__ import annotations

import numpy as np
import pytest
from metric_references import reference_mce

from calib.metrics import maximum_calibration_error


class TestMaximumCalibrationError:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # 5 bins: nonempty-bin gaps .025 (.4,.6], .175 (.6,.8], .125 (.8,1] (see test_ece); empty 0.
        # MCE = max(.025, .175, .125) = .175
        probs, labels = worked
        assert maximum_calibration_error(probs, labels, num_bins=5) == pytest.approx(0.175, abs=1e-12)

    def test_three_bins(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # 3 bins (0,1/3] (1/3,2/3] (2/3,1]:
        # (1/3,2/3]: {.45 wrong, .50 right, .65 right} conf 1.6/3 = .5333, acc 2/3 -> gap .1333
        # (2/3,1]:   {.70 wrong, .85 right, .90 right} conf 2.45/3 = .8167, acc 2/3 -> gap .15
        probs, labels = worked
        assert maximum_calibration_error(probs, labels, num_bins=3) == pytest.approx(0.15, abs=1e-12)

    def test_empty_bins_contribute_zero(self) -> None:
        # One sample, conf .75, correct: 14 of 15 bins are empty; MCE = |1 - .75| = .25.
        assert maximum_calibration_error(np.array([[0.75, 0.25]]), np.array([0])) == pytest.approx(0.25)

    def test_confidence_one_is_in_last_bin(self) -> None:
        # conf 1.0 (wrong) and .95 (right) share (.9, 1]: gap |.5 - .975| = .475; a separate 1.0
        # bucket (torchmetrics) would give MCE 1.0.
        probs = np.array([[1.0, 0.0, 0.0], [0.95, 0.05, 0.0]])
        labels = np.array([1, 0])
        assert maximum_calibration_error(probs, labels, num_bins=10) == pytest.approx(0.475, abs=1e-12)

    @pytest.mark.parametrize("num_bins", [1, 5, 15])
    def test_independent_reference(self, random_case: tuple[np.ndarray, np.ndarray], num_bins: int) -> None:
        probs, labels = random_case
        expected = reference_mce(probs, labels, num_bins)
        assert maximum_calibration_error(probs, labels, num_bins=num_bins) == pytest.approx(
            expected, abs=1e-12
        )

    def test_torchmetrics(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        functional = pytest.importorskip("torchmetrics.functional.classification")
        import torch

        probs, labels = random_case
        expected = functional.multiclass_calibration_error(
            torch.from_numpy(probs),
            torch.from_numpy(labels),
            num_classes=probs.shape[1],
            n_bins=15,
            norm="max",
        )
        assert maximum_calibration_error(probs, labels) == pytest.approx(float(expected), abs=1e-6)

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        with pytest.raises(ValueError, match=r"^`num_bins` must be an integer >= 1, got num_bins=-3\.$"):
            maximum_calibration_error(probs, labels, num_bins=-3)
