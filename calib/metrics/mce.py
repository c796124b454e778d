"""Maximum calibration error (MCE), 15 equal-width bins by default."""

from __future__ import annotations

import numpy as np

from calib.metrics._validation import ArrayLike, check_num_bins, check_probs_labels
from calib.metrics.ece import _ece_bins, _ece_update

__all__ = ["maximum_calibration_error"]


def _mce_compute(confidences: np.ndarray, correct: np.ndarray, num_bins: int) -> float:
    _, gaps = _ece_bins(confidences, correct, num_bins)
    return float(np.max(np.abs(gaps)))


def maximum_calibration_error(probs: ArrayLike, labels: ArrayLike, *, num_bins: int = 15) -> float:
    """Maximum calibration error (MCE) as a fraction in [0, 1] (not percent).

    MCE = max_{b=1..M} |acc(B_b) − conf(B_b)|

    with the same bins B_b, acc(B_b) and conf(B_b) as :func:`expected_calibration_error`
    (M = ``num_bins`` equal-width bins, each ``(lower, upper]``; confidence 1.0 in the last bin).
    Empty bins contribute 0, as in torchmetrics (``norm="max"``) and FOCAL-R. torchmetrics puts
    confidence 1.0 in a separate extra bucket, so its MCE can differ. Reference: Naeini, Cooper
    and Hauskrecht, "Obtaining Well Calibrated Probabilities Using Bayesian Binning", AAAI 2015.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).
        num_bins: number of equal-width bins M, >= 1.

    Returns:
        MCE, a fraction in [0, 1].

    >>> probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
    >>> maximum_calibration_error(probs, [0, 1, 0, 1], num_bins=4)
    0.3333333333333333
    """
    num_bins = check_num_bins(num_bins)
    p, y = check_probs_labels(probs, labels)
    return _mce_compute(*_ece_update(p, y), num_bins)
