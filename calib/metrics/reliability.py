"""Reliability-diagram statistics: per-bin sample count, mean confidence and accuracy, and the
Clopper–Pearson interval of each bin's accuracy."""

from __future__ import annotations

import numbers

import numpy as np

from calib.metrics._binning import bin_statistics, equal_width_bin_indices, top_label
from calib.metrics._validation import ArrayLike, check_num_bins, check_probs_labels, to_numpy

__all__ = ["clopper_pearson", "reliability_bins"]


def reliability_bins(
    probs: ArrayLike, labels: ArrayLike, *, num_bins: int = 15
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, mean confidence, accuracy) of the top-label prediction in each equal-width bin.

    Bins are ``(lower, upper]`` as for the ECE (FOCAL-R convention); an empty bin has count 0 and
    both means 0. ECE = Σ_b (count_b / N)·|accuracy_b − confidence_b|.

    >>> counts, conf, acc = reliability_bins([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]], [0, 1, 1], num_bins=2)
    >>> counts.tolist(), conf.round(3).tolist(), acc.tolist()
    ([0, 3], [0.0, 0.733], [0.0, 0.6666666666666666])
    """
    num_bins = check_num_bins(num_bins)
    p, y = check_probs_labels(probs, labels)
    confidences, correct = top_label(p, y)
    return bin_statistics(confidences, correct, equal_width_bin_indices(confidences, num_bins), num_bins)


def _check_whole(x: ArrayLike, name: str) -> np.ndarray:
    """``x`` as an int64 array of whole numbers >= 0 (integer dtype, or floats with whole values)."""
    arr = to_numpy(x)
    if arr.dtype.kind not in "iuf" or (arr.dtype.kind == "f" and not np.all(np.isfinite(arr))):
        raise ValueError(f"`{name}` must be an array of whole numbers >= 0, got dtype {arr.dtype}.")
    if arr.dtype.kind == "f" and np.any(arr != np.round(arr)):
        i = int(np.argmax(arr.ravel() != np.round(arr.ravel())))
        raise ValueError(f"`{name}` must hold whole numbers, got {name}[{i}]={float(arr.ravel()[i])!r}.")
    if np.any(arr < 0):
        i = int(np.argmax(arr.ravel() < 0))
        raise ValueError(f"`{name}` must be >= 0, got {name}[{i}]={arr.ravel()[i]}.")
    return arr.astype(np.int64)


def clopper_pearson(
    successes: ArrayLike, counts: ArrayLike, *, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Exact (Clopper–Pearson) binomial confidence interval of ``successes / counts``, elementwise.

    With α = 1 − ``level``, k successes out of n trials and B(q; a, b) the q-quantile of the
    Beta(a, b) distribution:

        lower = B(α/2; k, n − k + 1)      (0 when k = 0)
        upper = B(1 − α/2; k + 1, n − k)  (1 when k = n)

    The interval covers the true proportion with probability at least ``level`` for every
    proportion (conservative). An empty bin (n = 0) says nothing, so its interval is [0, 1]
    (lower 0, upper 1: finite, so it can be stored and plotted; its bar is empty anyway). For a
    reliability diagram: k = round(count_b · accuracy_b) correct predictions out of count_b.
    Reference: Clopper and Pearson, "The use of confidence or fiducial limits illustrated in the
    case of the binomial", Biometrika, 1934.

    Args:
        successes: k, whole numbers >= 0, any shape. Numpy array, torch tensor or sequence.
        counts: n, whole numbers >= 0, the same shape, with k <= n elementwise.
        level: the confidence level 1 − α, strictly between 0 and 1.

    Returns:
        (lower, upper), float64 arrays of the inputs' shape, 0 <= lower <= k/n <= upper <= 1.

    >>> lower, upper = clopper_pearson([0, 5, 0], [10, 10, 0])
    >>> lower.round(4).tolist(), upper.round(4).tolist()
    ([0.0, 0.1871, 0.0], [0.3085, 0.8129, 1.0])
    """
    from scipy import stats  # here, not at import: scipy.stats costs every process 0.4 s

    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0.0 < level < 1.0:
        raise ValueError(f"`level` must be a number strictly between 0 and 1, got level={level!r}.")
    k = _check_whole(successes, "successes")
    n = _check_whole(counts, "counts")
    if k.shape != n.shape:
        raise ValueError(f"`successes` and `counts` must have the same shape, got {k.shape} and {n.shape}.")
    if np.any(k > n):
        i = int(np.argmax((k > n).ravel()))
        raise ValueError(
            f"`successes` must be <= `counts`, got successes[{i}]={k.ravel()[i]} > counts[{i}]={n.ravel()[i]}."
        )
    alpha = 1.0 - float(level)
    lower = np.zeros(k.shape)
    upper = np.ones(k.shape)
    some = k > 0
    lower[some] = stats.beta.ppf(alpha / 2, k[some], n[some] - k[some] + 1)
    short = k < n
    upper[short] = stats.beta.ppf(1 - alpha / 2, k[short] + 1, n[short] - k[short])
    return lower, upper
