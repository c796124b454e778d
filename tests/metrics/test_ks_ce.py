"""KS calibration error (Gupta et al. 2021): hand-computed values, ties, bounds."""

from __future__ import annotations

import numpy as np
import pytest
from metric_cases import overconfident_probs

from calib.metrics import ks_calibration_error


def binary(confidences: list[float], correct: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Two-class rows whose top-label confidence is c (class 0) and label 0 where correct, else 1."""
    c = np.asarray(confidences, dtype=float)
    return np.stack([c, 1 - c], axis=1), np.where(np.asarray(correct) == 1, 0, 1)


def test_hand_computed():
    # sorted c 0.6 0.7 0.8 0.9, y 1 0 1 1: c − y = −0.4, 0.7, −0.2, −0.1; cumulative −0.4, 0.3, 0.1, 0.0; max 0.4 / 4
    probs, labels = binary([0.9, 0.6, 0.8, 0.7], [1, 1, 1, 0])
    assert ks_calibration_error(probs, labels) == pytest.approx(0.1, abs=1e-15)


def test_ties_enter_together():
    # Two samples at c = 0.5, one right, one wrong: calibrated at 0.5. After the first of them alone the gap would be
    # 0.5 / 2 in either order; the KS distance compares the cumulative sums at the confidence, after both: 0.
    for correct in ([1, 0], [0, 1]):
        assert ks_calibration_error(*binary([0.5, 0.5], correct)) == 0.0
    # c = 0.6 twice (one right) then 0.9 (right): cumulative at 0.6: 1.2 − 1 = 0.2; at 0.9: 0.2 − 0.1 = 0.1; / 3
    assert ks_calibration_error(*binary([0.6, 0.9, 0.6], [0, 1, 1])) == pytest.approx(0.2 / 3, abs=1e-15)


def test_bounds_and_extremes():
    assert ks_calibration_error(*binary([1.0, 1.0], [1, 1])) == 0.0
    assert ks_calibration_error(*binary([1.0, 1.0], [0, 0])) == 1.0  # confident and always wrong
    probs, labels = overconfident_probs(500, 10, 0)
    value = ks_calibration_error(probs, labels)
    assert 0 < value <= 1
    # the order of the samples does not matter
    order = np.random.default_rng(1).permutation(500)
    assert ks_calibration_error(probs[order], labels[order]) == value


def test_errors():
    with pytest.raises(ValueError, match=r"`labels` must be in \[0, C\) = \[0, 2\)"):
        ks_calibration_error([[0.5, 0.5]], [2])
