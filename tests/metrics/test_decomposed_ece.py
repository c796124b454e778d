"""Tests for calib/metrics/decomposed_ece.py (O-ECE and U-ECE)."""

from __future__ import annotations

import numpy as np
import pytest

from calib.metrics import expected_calibration_error, overconfidence_ece, underconfidence_ece


class TestOverconfidenceEce:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # 5 bins; signed gaps conf - acc: (.4,.6] -.025, (.6,.8] +.175, (.8,1] -.125, weights 2/6.
        # O-ECE = (2/6)(.175) = .058333...
        probs, labels = worked
        assert overconfidence_ece(probs, labels, num_bins=5) == pytest.approx(0.175 / 3, abs=1e-12)

    def test_all_wrong_is_all_overconfidence(self) -> None:
        # Every prediction wrong: acc 0 in every bin, so O-ECE = mean conf = (.6 + .8)/2 = .7, U-ECE 0.
        probs = np.array([[0.6, 0.4], [0.2, 0.8]])
        labels = np.array([1, 0])
        assert overconfidence_ece(probs, labels) == pytest.approx(0.7, abs=1e-12)
        assert underconfidence_ece(probs, labels) == 0.0

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        with pytest.raises(ValueError, match=r"^`num_bins` must be an integer >= 1, got num_bins=0\.$"):
            overconfidence_ece(probs, labels, num_bins=0)


class TestUnderconfidenceEce:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # U-ECE = (2/6)(.025 + .125) = .05
        probs, labels = worked
        assert underconfidence_ece(probs, labels, num_bins=5) == pytest.approx(0.05, abs=1e-12)

    def test_all_right_is_all_underconfidence(self) -> None:
        # Every prediction right: acc 1, so U-ECE = 1 - mean conf = 1 - .7 = .3, O-ECE 0.
        probs = np.array([[0.6, 0.4], [0.2, 0.8]])
        labels = np.array([0, 1])
        assert underconfidence_ece(probs, labels) == pytest.approx(0.3, abs=1e-12)
        assert overconfidence_ece(probs, labels) == 0.0

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        with pytest.raises(ValueError, match=r"^`num_bins` must be an integer >= 1, got num_bins='15'\.$"):
            underconfidence_ece(probs, labels, num_bins="15")  # type: ignore[arg-type]


@pytest.mark.parametrize("num_bins", [1, 5, 10, 15, 40])
def test_over_plus_under_equals_ece(random_case: tuple[np.ndarray, np.ndarray], num_bins: int) -> None:
    probs, labels = random_case
    total = overconfidence_ece(probs, labels, num_bins=num_bins) + underconfidence_ece(
        probs, labels, num_bins=num_bins
    )
    assert total == pytest.approx(expected_calibration_error(probs, labels, num_bins=num_bins), abs=1e-12)
