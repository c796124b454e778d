"""Expected calibration error (ECE), 15 equal-width bins by default."""

from __future__ import annotations

import numpy as np

from calib.metrics._binning import bin_statistics, equal_width_bin_indices, top_label
from calib.metrics._validation import ArrayLike, check_num_bins, check_probs_labels

__all__ = ["expected_calibration_error"]


def _ece_update(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validated batch -> (max-softmax confidences, 0/1 correctness)."""
    return top_label(probs, labels)


def _ece_bins(confidences: np.ndarray, correct: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Per equal-width bin: weight |B_b|/N and signed gap conf(B_b) - acc(B_b) (0 for empty bins)."""
    indices = equal_width_bin_indices(confidences, num_bins)
    counts, mean_conf, acc = bin_statistics(confidences, correct, indices, num_bins)
    return counts / confidences.size, mean_conf - acc


def _ece_compute(confidences: np.ndarray, correct: np.ndarray, num_bins: int) -> float:
    weights, gaps = _ece_bins(confidences, correct, num_bins)
    return float(np.sum(weights * np.abs(gaps)))


def expected_calibration_error(probs: ArrayLike, labels: ArrayLike, *, num_bins: int = 15) -> float:
    """Expected calibration error (ECE) as a fraction in [0, 1] (not percent).

    ECE = Σ_{b=1..M} (|B_b| / N) · |acc(B_b) − conf(B_b)|

    where N is the number of samples, M = ``num_bins``, B_b the samples whose max-softmax
    confidence ``conf_i = max_k p_{i,k}`` lies in bin b, acc(B_b) the fraction of B_b whose
    arg-max class is correct and conf(B_b) the mean confidence in B_b. Empty bins contribute 0.

    Binning: M equal-width bins on [0, 1], each ``(lower, upper]`` (upper edge closed), so a
    confidence of exactly 1.0 is in the last bin (FOCAL-R ``ECELoss`` convention; torchmetrics
    uses ``[lower, upper)`` plus an extra bucket for 1.0). Reference: Guo, Pleiss, Sun and
    Weinberger, "On Calibration of Modern Neural Networks", ICML 2017; Naeini, Cooper and
    Hauskrecht, AAAI 2015.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
            Convert logits with :func:`calib.metrics.softmax64` first.
        labels: integer labels in [0, C), shape (N,).
        num_bins: number of equal-width bins M, >= 1 (15 as in the papers; TST-R uses 10).

    Returns:
        ECE, a fraction in [0, 1]. Multiply by 100 only for display.

    >>> probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
    >>> expected_calibration_error(probs, [0, 1, 0, 1], num_bins=4)
    0.28125
    """
    num_bins = check_num_bins(num_bins)
    p, y = check_probs_labels(probs, labels)
    return _ece_compute(*_ece_update(p, y), num_bins)
