"""Multi-class Brier score: sum over classes, mean over samples."""

from __future__ import annotations

import numpy as np

from calib.metrics._validation import ArrayLike, check_probs_labels

__all__ = ["brier_score"]


def _brier_compute(probs: np.ndarray, labels: np.ndarray) -> float:
    diff = probs.copy()
    diff[np.arange(labels.size), labels] -= 1.0
    return float(np.mean(np.sum(diff * diff, axis=1)))


def brier_score(probs: ArrayLike, labels: ArrayLike) -> float:
    """Multi-class Brier score, a value in [0, 2] (sum over classes, mean over samples).

    BS = (1/N) · Σ_{i=1..N} Σ_{k=1..C} (p_{i,k} − 1[y_i = k])²

    where N is the number of samples, C the number of classes (``probs.shape[1]``), p_{i,k} the
    probability of class k for sample i and y_i its label. This is Brier's original multi-class
    definition. TST-R and BALCAL-R use sklearn ``mean_squared_error(p, onehot)``, the mean over all
    N*C entries, which is C times smaller: divide this value by C to compare (docs/methods.md §6.6).
    Reference: Brier, "Verification of forecasts expressed in terms of probability", Monthly
    Weather Review, 1950.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).

    Returns:
        The Brier score in [0, 2]; 0 for confident correct predictions, 2 for confident wrong ones.

    >>> brier_score([[0.75, 0.25], [0.5, 0.5]], [0, 1])
    0.3125
    """
    p, y = check_probs_labels(probs, labels)
    return _brier_compute(p, y)
