"""ECE-sweep (Roelofs et al., AISTATS 2022): equal-mass ECE at the most bins that keep accuracy monotone."""

from __future__ import annotations

import numbers

import numpy as np

from calib.metrics._binning import bin_statistics, top_label
from calib.metrics._validation import ArrayLike, check_probs_labels

__all__ = ["ece_sweep"]


def _check_p(p: object) -> float:
    """``p`` as a float; it must be a real number >= 1 (a bool is rejected)."""
    if not isinstance(p, numbers.Real) or isinstance(p, bool) or not (np.isfinite(p) and p >= 1):
        raise ValueError(f"`p` must be a finite number >= 1 (1: ECE, 2: L2 error), got p={p!r}.")
    return float(p)


def _sweep_bin_indices(num_samples: int, num_bins: int) -> np.ndarray:
    """Equal-mass bin of each rank r = 0..N-1 of the sorted confidences: floor(r·B/N), exact in integers."""
    return np.arange(num_samples) * num_bins // num_samples


def _is_monotone(cumulative_correct: np.ndarray, num_bins: int) -> bool:
    """Whether the accuracies of the ``num_bins`` equal-mass bins are non-decreasing in confidence.

    ``cumulative_correct[r]`` is the number of correct samples among the r least confident (int64,
    length N + 1). Bin k holds the ranks ceil(k·N/B) .. ceil((k+1)·N/B) − 1 (the ranks with
    floor(r·B/N) = k); acc_{k-1} <= acc_k is checked as hits_{k-1}·n_k <= hits_k·n_{k-1}, exactly.
    """
    num_samples = cumulative_correct.size - 1
    starts = (np.arange(num_bins + 1) * num_samples + num_bins - 1) // num_bins
    hits = np.diff(cumulative_correct[starts])
    counts = np.diff(starts)
    return bool(np.all(hits[:-1] * counts[1:] <= hits[1:] * counts[:-1]))


def _sweep_num_bins(sorted_correct: np.ndarray) -> int:
    """B*: the last B of B = 1, 2, ..., N − 1 before the first B whose bin accuracies are not monotone."""
    num_samples = sorted_correct.size
    if num_samples < 3:
        return 1  # the reference sweeps B = 2 .. N − 1: nothing to sweep
    if np.all(sorted_correct[1:] >= sorted_correct[:-1]):
        return num_samples - 1  # every error is less confident than every hit: each B is monotone
    cumulative_correct = np.concatenate(([0], np.cumsum(sorted_correct.astype(np.int64))))
    for num_bins in range(2, num_samples):
        if not _is_monotone(cumulative_correct, num_bins):
            return num_bins - 1
    return num_samples - 1


def _ece_sweep_compute(confidences: np.ndarray, correct: np.ndarray, p: float = 1.0) -> float:
    order = np.argsort(confidences, kind="stable")
    sorted_conf, sorted_correct = confidences[order], correct[order]
    num_bins = _sweep_num_bins(sorted_correct)
    indices = _sweep_bin_indices(sorted_conf.size, num_bins)
    counts, mean_conf, acc = bin_statistics(sorted_conf, sorted_correct, indices, num_bins)
    return float(np.sum(counts / sorted_conf.size * np.abs(acc - mean_conf) ** p) ** (1.0 / p))


def ece_sweep(probs: ArrayLike, labels: ArrayLike, *, p: float = 1) -> float:
    """ECE-sweep: the equal-mass ECE at the largest number of bins whose accuracies are monotone.

    ECE_sweep = ( Σ_{b=1..B*} (|B_b| / N) · |acc(B_b) − conf(B_b)|^p )^(1/p)

    with the symbols of :func:`expected_calibration_error`. The samples are sorted by max-softmax
    confidence (stable: tied confidences keep their input order) and the one of rank r = 0..N−1 is
    in bin floor(r·B/N), so every bin has ⌊N/B⌋ or ⌈N/B⌉ samples. B* sweeps B = 2, 3, ..., N − 1 and
    stops at the first B whose bin accuracies are not non-decreasing in confidence
    (acc(B_1) <= ... <= acc(B_B), ties allowed); B* is the B before it (1 if B = 2 already fails,
    N − 1 if none fails, 1 for N <= 2). p = 1 is the ECE, p = 2 the L2 calibration error.

    As the paper's code (google-research ``caltrain/calibration_metrics.py``,
    ``CalibrationMetric(ce_type="em_ece_sweep")``: ``em_monotonic_sweep`` and ``_calc_ece_postbin``),
    except that the bin is floor(r·B/N) in exact integers (the reference computes floor((r/N)·B) in
    floating point, which for some N, B, e.g. N = 44, B = 22, r = 30, puts a sample one bin lower) and
    that the sort is stable (the reference's ``np.argsort`` is not: with tied confidences of mixed
    correctness the value depends on the order of the tied samples in both). Reference: Roelofs,
    Cain, Shlens and Mozer, "Mitigating Bias in Calibration Error Estimation", AISTATS 2022.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).
        p: the exponent of the L^p norm, >= 1: 1 (default) for the ECE, 2 for the L2 error.

    Returns:
        ECE-sweep, a fraction in [0, 1]; lower is better.

    Sorted by confidence the samples are wrong, right, wrong, right, right, right. B = 3 gives bin
    accuracies 1/2, 1/2, 1 (monotone); B = 4 gives 1/2, 0, 1, 1 (not), so B* = 3 and
    ECE = (2/6)·(|0.5 − 0.575| + |0.5 − 0.75| + |1 − 0.925|) = 0.4/3.

    >>> probs = [[0.55, 0.45], [0.6, 0.4], [0.3, 0.7], [0.8, 0.2], [0.1, 0.9], [0.95, 0.05]]
    >>> round(ece_sweep(probs, [1, 0, 0, 0, 1, 0]), 12)
    0.133333333333
    """
    p = _check_p(p)
    probs_checked, y = check_probs_labels(probs, labels)
    return _ece_sweep_compute(*top_label(probs_checked, y), p)
