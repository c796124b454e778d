"""Classwise ECE (FOCAL-R / FEDLAS-R ``ClasswiseECELoss``)."""

from __future__ import annotations

import numpy as np

from calib.metrics._binning import bin_statistics, equal_width_bin_indices
from calib.metrics._validation import ArrayLike, check_num_bins, check_probs_labels

__all__ = ["classwise_ece"]


def _cwece_compute(probs: np.ndarray, labels: np.ndarray, num_bins: int) -> float:
    n, num_classes = probs.shape
    is_class = (labels[:, None] == np.arange(num_classes)[None, :]).astype(np.float64)
    # One flat bin id per (class, bin): class k owns ids k*M .. k*M + M - 1.
    flat = equal_width_bin_indices(probs, num_bins) + num_bins * np.arange(num_classes)[None, :]
    counts, mean_p, frequency = bin_statistics(
        probs.ravel(), is_class.ravel(), flat.ravel(), num_bins * num_classes
    )
    per_class = (counts / n * np.abs(mean_p - frequency)).reshape(num_classes, num_bins).sum(axis=1)
    return float(per_class.mean())


def classwise_ece(probs: ArrayLike, labels: ArrayLike, *, num_bins: int = 15) -> float:
    """Classwise ECE as a fraction in [0, 1] (not percent).

    cwECE = (1/C) · Σ_{k=1..C} Σ_{b=1..M} (|B_{k,b}| / N) · |freq_k(B_{k,b}) − conf_k(B_{k,b})|

    where C = ``probs.shape[1]``, M = ``num_bins``, N the number of samples and B_{k,b} the
    samples (all N of them, not only those predicted as k) whose probability p_{i,k} for class k
    lies in equal-width bin b, ``(lower, upper]`` (upper edge closed); freq_k(B) is the fraction
    of B with label y_i = k and conf_k(B) the mean of p_{i,k} over B. Empty bins contribute 0.

    Differences from FOCAL-R ``ClasswiseECELoss``: C is ``probs.shape[1]``, not
    ``max(labels) + 1`` (FOCAL-R silently drops trailing classes absent from the labels); and
    p_{i,k} = 0 exactly is put in the first bin, where FOCAL-R's ``gt(0)`` test drops it.
    Reference: Kull et al., "Beyond temperature scaling: Obtaining well-calibrated multi-class
    probabilities with Dirichlet calibration", NeurIPS 2019.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).
        num_bins: number of equal-width bins M per class, >= 1.

    Returns:
        Classwise ECE, a fraction in [0, 1].

    >>> probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
    >>> classwise_ece(probs, [0, 1, 0, 1], num_bins=2)
    0.21875
    """
    num_bins = check_num_bins(num_bins)
    p, y = check_probs_labels(probs, labels)
    return _cwece_compute(p, y, num_bins)
