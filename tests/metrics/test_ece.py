"""Tests for calib/metrics/ece.py."""

from __future__ import annotations

import numpy as np
import pytest
from metric_references import reference_ece

from calib.metrics import expected_calibration_error


class TestExpectedCalibrationError:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # 5 bins (0,.2] (.2,.4] (.4,.6] (.6,.8] (.8,1]; see conftest for conf/correct.
        # bin (.4,.6]: {.45 wrong, .50 right}  conf .475, acc .5  -> |gap| .025, weight 2/6
        # bin (.6,.8]: {.70 wrong, .65 right}  conf .675, acc .5  -> |gap| .175, weight 2/6
        # bin (.8,1]:  {.90 right, .85 right}  conf .875, acc 1.0 -> |gap| .125, weight 2/6
        # ECE = (2/6)(.025 + .175 + .125) = .325 / 3 = 0.108333...
        probs, labels = worked
        assert expected_calibration_error(probs, labels, num_bins=5) == pytest.approx(0.325 / 3, abs=1e-12)

    def test_one_bin(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # One bin: |mean conf - acc| = |(.9+.7+.65+.45+.85+.5)/6 - 4/6| = |4.05 - 4| / 6 = .05/6.
        probs, labels = worked
        assert expected_calibration_error(probs, labels, num_bins=1) == pytest.approx(0.05 / 6, abs=1e-12)

    def test_default_is_15_bins(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = random_case
        assert expected_calibration_error(probs, labels) == expected_calibration_error(
            probs, labels, num_bins=15
        )

    @pytest.mark.parametrize("num_bins", [1, 3, 10, 15, 30])
    def test_independent_reference(self, random_case: tuple[np.ndarray, np.ndarray], num_bins: int) -> None:
        probs, labels = random_case
        expected = reference_ece(probs, labels, num_bins)
        assert expected_calibration_error(probs, labels, num_bins=num_bins) == pytest.approx(
            expected, abs=1e-12
        )

    def test_torchmetrics(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        # Continuous random data: no confidence on a bin edge and none at exactly 1.0, so the
        # torchmetrics [lower, upper) convention gives the same bins.
        functional = pytest.importorskip("torchmetrics.functional.classification")
        import torch

        probs, labels = random_case
        expected = functional.multiclass_calibration_error(
            torch.from_numpy(probs),
            torch.from_numpy(labels),
            num_classes=probs.shape[1],
            n_bins=15,
            norm="l1",
        )
        assert expected_calibration_error(probs, labels) == pytest.approx(float(expected), abs=1e-6)

    def test_perfectly_calibrated(self) -> None:
        # 15 bins. Bin (.733,.8]: 8 samples at conf .75, 6 correct (acc .75).
        # Bin (.8,.867]: 20 samples at conf .85, 17 correct (acc .85). Every gap is 0, so ECE = 0.
        probs = np.array([[0.75, 0.25]] * 8 + [[0.85, 0.15]] * 20)
        labels = np.array([0] * 6 + [1] * 2 + [0] * 17 + [1] * 3)
        assert expected_calibration_error(probs, labels) == pytest.approx(0.0, abs=1e-12)

    def test_confidence_one_is_in_last_bin(self) -> None:
        # conf 1.0 (wrong) and conf .95 (right) share the last of 10 bins, (.9, 1]:
        # conf .975, acc .5 -> ECE = 1 * .475. A separate 1.0 bucket would give (1 + .05)/2 = .525.
        probs = np.array([[1.0, 0.0, 0.0], [0.95, 0.05, 0.0]])
        labels = np.array([1, 0])
        assert expected_calibration_error(probs, labels, num_bins=10) == pytest.approx(0.475, abs=1e-12)

    def test_torch_input(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        torch = pytest.importorskip("torch")
        probs, labels = worked
        value = expected_calibration_error(
            torch.tensor(probs, dtype=torch.float32), torch.tensor(labels), num_bins=5
        )
        assert isinstance(value, float)
        assert value == pytest.approx(0.325 / 3, abs=1e-6)

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        with pytest.raises(ValueError, match=r"^`num_bins` must be an integer >= 1, got num_bins=0\.$"):
            expected_calibration_error(probs, labels, num_bins=0)
        with pytest.raises(ValueError, match=r"`num_bins` must be an integer >= 1, got num_bins=2\.5\."):
            expected_calibration_error(probs, labels, num_bins=2.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"`num_bins` must be an integer >= 1, got num_bins=True\."):
            expected_calibration_error(probs, labels, num_bins=True)
        with pytest.raises(ValueError, match=r"`probs` rows must sum to 1"):
            expected_calibration_error(probs * 0.5, labels)
