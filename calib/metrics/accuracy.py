"""Top-1 accuracy."""

from __future__ import annotations

import numpy as np

from calib.metrics._validation import ArrayLike, check_probs_labels

__all__ = ["accuracy"]


def _accuracy_compute(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(probs.argmax(axis=1) == labels))


def accuracy(probs: ArrayLike, labels: ArrayLike) -> float:
    """Top-1 accuracy as a fraction in [0, 1] (not percent).

    Acc = (1/N) · Σ_i 1[ŷ_i = y_i],   ŷ_i = argmax_k p_{i,k},

    where N is the number of samples, y_i the label of sample i and p_{i,k} its probability for
    class k. Ties in a row go to the lowest class index.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).

    Returns:
        The fraction of samples whose arg-max class equals the label, in [0, 1].

    >>> accuracy([[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]], [0, 1, 0, 1])
    0.5
    """
    p, y = check_probs_labels(probs, labels)
    return _accuracy_compute(p, y)
