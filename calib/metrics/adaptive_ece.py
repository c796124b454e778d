"""Adaptive calibration error (AECE / AdaECE): ECE over equal-mass bins, FOCAL-R convention."""

from __future__ import annotations

import numpy as np

from calib.metrics._binning import bin_indices_from_edges, bin_statistics, equal_mass_edges
from calib.metrics._validation import ArrayLike, check_num_bins, check_probs_labels
from calib.metrics.ece import _ece_update

__all__ = ["adaptive_calibration_error"]


def _aece_compute(confidences: np.ndarray, correct: np.ndarray, num_bins: int) -> float:
    edges = equal_mass_edges(confidences, num_bins)
    indices = bin_indices_from_edges(confidences, edges)
    counts, mean_conf, acc = bin_statistics(confidences, correct, indices, num_bins)
    return float(np.sum(counts / confidences.size * np.abs(acc - mean_conf)))


def adaptive_calibration_error(probs: ArrayLike, labels: ArrayLike, *, num_bins: int = 15) -> float:
    """Adaptive (equal-mass) calibration error, AECE, as a fraction in [0, 1] (not percent).

    AECE = Σ_{b=1..M} (|B_b| / N) · |acc(B_b) − conf(B_b)|

    with the symbols of :func:`expected_calibration_error`, but the M = ``num_bins`` bins have
    (approximately) equal numbers of samples: edges
    ``e = np.interp(linspace(0, N, M + 1), arange(N), sort(conf))`` and B_b the samples with
    confidence in ``(e_b, e_{b+1}]`` (upper edge closed), as in FOCAL-R / FEDLAS-R
    ``AdaptiveECELoss`` (docs/methods.md §6.2). Pitfall kept for comparability with the papers: e_0 is
    the smallest confidence, so the sample(s) with the smallest confidence are in no bin, while
    the weights still divide by the full N. torch-uncertainty instead splits the sorted
    confidences into M chunks and counts every sample. References: Nguyen and O'Connor,
    "Posterior Calibration and Exploratory Analysis for NLP Models", EMNLP 2015; Mukhoti et al.,
    "Calibrating Deep Neural Networks using Focal Loss", NeurIPS 2020.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).
        num_bins: number of equal-mass bins M, >= 1.

    Returns:
        AECE, a fraction in [0, 1].

    Here the edges are [0.625, 0.75, 0.875]; both samples with confidence 0.625 are excluded.

    >>> probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
    >>> adaptive_calibration_error(probs, [0, 1, 0, 1], num_bins=2)
    0.21875
    """
    num_bins = check_num_bins(num_bins)
    p, y = check_probs_labels(probs, labels)
    return _aece_compute(*_ece_update(p, y), num_bins)
