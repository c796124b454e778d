"""Debiased L2 calibration error (Kumar, Liang and Ma, NeurIPS 2019), top-label, equal-mass bins."""

from __future__ import annotations

import numpy as np

from calib.metrics._binning import bin_statistics, top_label
from calib.metrics._validation import ArrayLike, check_num_bins, check_probs_labels

__all__ = ["debiased_l2_calibration_error"]


def _kumar_equal_mass_edges(values: np.ndarray, num_bins: int) -> np.ndarray:
    """Upper bin edges of ``calibration.utils.get_equal_bins``: the sorted values split into
    min(M, N) chunks (``np.array_split``: the first N mod M chunks one larger), an edge half-way
    between the last value of a chunk and the first of the next, then 1.0; duplicates dropped.

    >>> _kumar_equal_mass_edges(np.array([0.9, 0.5, 0.7, 0.6, 0.8]), 2).tolist()
    [0.75, 1.0]
    """
    sorted_values = np.sort(values)
    num_chunks = min(num_bins, sorted_values.size)
    # np.array_split: chunk j starts at j·⌊N/M⌋ + min(j, N mod M)
    size, extra = divmod(sorted_values.size, num_chunks)
    starts = np.arange(1, num_chunks) * size + np.minimum(np.arange(1, num_chunks), extra)
    inner = (sorted_values[starts - 1] + sorted_values[starts]) / 2.0
    return np.unique(np.append(inner, 1.0))


def _l2ce_debiased_compute(confidences: np.ndarray, correct: np.ndarray, num_bins: int) -> float:
    edges = _kumar_equal_mass_edges(confidences, num_bins)
    # bin b holds the confidences in (edges[b-1], edges[b]] (edges[-1] = 0 for b = 0), as bisect_left
    indices = np.searchsorted(edges, confidences, side="left")
    counts, mean_conf, acc = bin_statistics(confidences, correct, indices, edges.size)
    variance = np.divide(acc * (1.0 - acc), counts - 1.0, out=np.zeros(edges.size), where=counts >= 2)
    per_bin = np.where(counts >= 2, (mean_conf - acc) ** 2 - variance, 0.0)
    squared = float(np.sum(counts / confidences.size * per_bin))
    return max(squared, 0.0) ** 0.5


def debiased_l2_calibration_error(probs: ArrayLike, labels: ArrayLike, *, num_bins: int = 15) -> float:
    """Debiased L2 calibration error of the top-label prediction, a fraction in [0, 1].

    CE² = Σ_{b: n_b >= 2} (n_b / N) · [ (conf(B_b) − acc(B_b))² − acc(B_b)·(1 − acc(B_b)) / (n_b − 1) ]
    L2-CE = sqrt(max(CE², 0))

    with the symbols of :func:`expected_calibration_error` and n_b = |B_b|. The plug-in estimate
    Σ_b (n_b/N)·(conf(B_b) − acc(B_b))² is biased upwards: acc(B_b) is a mean of n_b labels, and
    E[(conf − acc)²] = (conf − E acc)² + Var(acc). The subtracted term is the unbiased estimate of
    that variance, so CE² is unbiased for the binned squared error and the estimate can be lower
    than the plug-in one (and is 0, not negative, when the debiased square is below 0). A bin
    with one sample contributes 0.

    Bins: M = ``num_bins`` equal-mass bins as in ``calibration.utils.get_equal_bins``: the sorted
    confidences are split into min(M, N) chunks of ⌈N/M⌉ or ⌊N/M⌋ (the larger first), each edge is
    half-way between the last confidence of one chunk and the first of the next, the last edge is
    1.0, and B_b holds the confidences in (e_{b−1}, e_b] (tied confidences share a bin; every sample
    counts). This is Kumar et al.'s ``uncertainty-calibration`` package,
    ``lower_bound_scaling_top_ce(probs, labels, p=2, debias=True, num_bins=15)``, which is what
    ``get_calibration_error(probs, labels, p=2, debias=True, mode="top-label")`` calls unless its
    heuristic ``is_discrete`` finds fewer than N/4 distinct values in every column of ``probs`` (then
    it gives every distinct confidence its own bin); calib always uses the equal-mass bins.
    Reference: Kumar, Liang and Ma, "Verified Uncertainty Calibration", NeurIPS 2019.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).
        num_bins: number of equal-mass bins M, >= 1 (15, as the package's default).

    Returns:
        The debiased L2 calibration error, a fraction in [0, 1]; lower is better.

    Two bins of two: confidences (0.625, 0.625) with 1 of 2 correct, then (0.75, 0.875) with 1 of 2;
    CE² = ½·[(0.125² − 0.25/1) + (0.3125² − 0.25/1)] < 0, so the estimate is 0 (the plug-in L2 error
    is sqrt(½·(0.125² + 0.3125²)) ≈ 0.238).

    >>> probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
    >>> debiased_l2_calibration_error(probs, [0, 1, 0, 1], num_bins=2)
    0.0
    """
    num_bins = check_num_bins(num_bins)
    p, y = check_probs_labels(probs, labels)
    return _l2ce_debiased_compute(*top_label(p, y), num_bins)
