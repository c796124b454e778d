"""Over- and under-confidence halves of the ECE (FeDLaS Table 4): O-ECE + U-ECE = ECE.

Both live in one file because they are the two halves of one decomposition and share one binning.
"""

from __future__ import annotations

import numpy as np

from calib.metrics._validation import ArrayLike, check_num_bins, check_probs_labels
from calib.metrics.ece import _ece_bins, _ece_update

__all__ = ["overconfidence_ece", "underconfidence_ece"]


def _oece_compute(confidences: np.ndarray, correct: np.ndarray, num_bins: int) -> float:
    weights, gaps = _ece_bins(confidences, correct, num_bins)
    return float(np.sum(weights * np.maximum(gaps, 0.0)))


def _uece_compute(confidences: np.ndarray, correct: np.ndarray, num_bins: int) -> float:
    weights, gaps = _ece_bins(confidences, correct, num_bins)
    return float(np.sum(weights * np.maximum(-gaps, 0.0)))


def overconfidence_ece(probs: ArrayLike, labels: ArrayLike, *, num_bins: int = 15) -> float:
    """Over-confidence ECE (O-ECE) as a fraction in [0, 1] (not percent).

    O-ECE = Σ_{b=1..M} (|B_b| / N) · max(conf(B_b) − acc(B_b), 0)

    with the bins and symbols of :func:`expected_calibration_error` (M equal-width bins, each
    ``(lower, upper]``). Only bins whose mean confidence exceeds their accuracy count, and
    O-ECE + U-ECE = ECE on the same bins. Definition as used in FeDLaS (Bahavan et al.), Table 4,
    docs/methods.md §6.4; ECE from Guo et al., ICML 2017.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).
        num_bins: number of equal-width bins M, >= 1.

    Returns:
        O-ECE, a fraction in [0, 1].

    >>> probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
    >>> overconfidence_ece(probs, [0, 1, 0, 1], num_bins=4)
    0.25
    """
    num_bins = check_num_bins(num_bins)
    p, y = check_probs_labels(probs, labels)
    return _oece_compute(*_ece_update(p, y), num_bins)


def underconfidence_ece(probs: ArrayLike, labels: ArrayLike, *, num_bins: int = 15) -> float:
    """Under-confidence ECE (U-ECE) as a fraction in [0, 1] (not percent): on the bins of
    :func:`overconfidence_ece`, only those whose accuracy exceeds their mean confidence count,

    U-ECE = Σ_{b=1..M} (|B_b| / N) · max(acc(B_b) − conf(B_b), 0),

    so O-ECE + U-ECE = ECE on the same bins. Arguments as :func:`overconfidence_ece`'s.

    >>> probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
    >>> underconfidence_ece(probs, [0, 1, 0, 1], num_bins=4)
    0.03125
    """
    num_bins = check_num_bins(num_bins)
    p, y = check_probs_labels(probs, labels)
    return _uece_compute(*_ece_update(p, y), num_bins)
