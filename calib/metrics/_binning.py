"""Binning helpers shared by the calibration metrics (private), FOCAL-R conventions.

Conventions (docs/methods.md §6.1, §6.2):

- **Equal-width** bins: M bins with edges ``np.linspace(0, 1, M + 1)``. Bin b holds the values in
  ``(edges[b], edges[b + 1]]`` (lower edge open, upper edge closed), as in FOCAL-R / FEDLAS-R
  ``ECELoss`` (``gt(lower) * le(upper)``). A value of exactly 1.0 is in the last bin. A value of
  exactly 0.0 is put in the first bin; FOCAL-R drops it, which only matters for classwise ECE
  (a max-softmax confidence is always >= 1/C > 0). torchmetrics uses ``[lower, upper)`` with an
  extra bucket for 1.0, so its MCE can differ.
- **Equal-mass** (adaptive) bins: edges ``np.interp(linspace(0, N, M + 1), arange(N), sort(v))``
  as in FOCAL-R ``AdaptiveECELoss``; membership ``(edges[b], edges[b + 1]]``. Pitfall kept on
  purpose for comparability: ``edges[0]`` is the smallest value, so the sample(s) with the smallest
  value fall in no bin and are excluded, while the metric still divides by the full N. Bins are
  equal-mass only approximately (ties and interpolated edges).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "bin_indices_from_edges",
    "bin_statistics",
    "equal_mass_edges",
    "equal_width_bin_indices",
    "equal_width_edges",
    "top_label",
]


def top_label(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max-softmax confidence and correctness (float 0/1) of the top-label prediction.

    Ties in ``probs`` go to the lowest class index (``np.argmax``).
    """
    predictions = probs.argmax(axis=1)
    confidences = probs[np.arange(probs.shape[0]), predictions]
    return confidences, (predictions == labels).astype(np.float64)


def equal_width_edges(num_bins: int) -> np.ndarray:
    """The ``num_bins + 1`` equal-width edges on [0, 1]."""
    return np.linspace(0.0, 1.0, num_bins + 1)


def equal_width_bin_indices(values: np.ndarray, num_bins: int) -> np.ndarray:
    """Bin index in ``0..num_bins-1`` of each value in [0, 1]; bins are ``(lower, upper]``.

    A value equal to an inner edge goes to the bin below it; 0.0 goes to bin 0 and 1.0 to the
    last bin.

    >>> equal_width_bin_indices(np.array([0.0, 0.2, 0.21, 0.5, 1.0]), 5).tolist()
    [0, 0, 1, 2, 4]
    """
    edges = equal_width_edges(num_bins)
    # searchsorted(side="left") returns i with edges[i-1] < v <= edges[i]: bin i - 1.
    indices = np.searchsorted(edges, values, side="left") - 1
    return np.clip(indices, 0, num_bins - 1)


def equal_mass_edges(values: np.ndarray, num_bins: int) -> np.ndarray:
    """FOCAL-R equal-mass edges: ``np.interp(linspace(0, N, M+1), arange(N), sort(values))``.

    The first edge is ``min(values)`` and the last ``max(values)`` (``np.interp`` clamps N to the
    position of the largest value, N - 1).

    >>> equal_mass_edges(np.array([0.9, 0.5, 0.7, 0.6]), 2).tolist()
    [0.5, 0.7, 0.9]
    """
    n = values.size
    return np.interp(np.linspace(0.0, n, num_bins + 1), np.arange(n), np.sort(values))


def bin_indices_from_edges(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index of each value for non-decreasing ``edges``; bin b is ``(edges[b], edges[b+1]]``.

    Values ``<= edges[0]`` or ``> edges[-1]`` get index -1 (in no bin). With
    :func:`equal_mass_edges` this excludes the smallest value(s), as FOCAL-R does.

    >>> values = np.array([0.9, 0.5, 0.7, 0.6])
    >>> bin_indices_from_edges(values, equal_mass_edges(values, 2)).tolist()
    [1, -1, 0, 0]
    """
    num_bins = len(edges) - 1
    indices = np.searchsorted(edges, values, side="left") - 1
    indices[(indices < 0) | (indices >= num_bins)] = -1
    return indices


def bin_statistics(
    values: np.ndarray, targets: np.ndarray, bin_indices: np.ndarray, num_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin (count, mean value, mean target); samples with bin index -1 are ignored.

    For top-label calibration ``values`` are confidences and ``targets`` are 0/1 correctness, so
    this is (count, mean confidence, accuracy). An empty bin has count 0 and both means 0, so its
    gap ``|mean target - mean value|`` is 0.

    >>> counts, conf, acc = bin_statistics(
    ...     np.array([0.6, 0.8, 0.9]), np.array([1.0, 0.0, 1.0]), np.array([0, 1, 1]), 3)
    >>> counts.tolist(), conf.tolist(), acc.tolist()
    ([1, 2, 0], [0.6, 0.8500000000000001, 0.0], [1.0, 0.5, 0.0])
    """
    keep = bin_indices >= 0
    idx = bin_indices[keep]
    counts = np.bincount(idx, minlength=num_bins)
    value_sums = np.bincount(idx, weights=values[keep], minlength=num_bins)
    target_sums = np.bincount(idx, weights=targets[keep], minlength=num_bins)
    nonempty = counts > 0
    mean_values = np.divide(value_sums, counts, out=np.zeros(num_bins), where=nonempty)
    mean_targets = np.divide(target_sums, counts, out=np.zeros(num_bins), where=nonempty)
    return counts, mean_values, mean_targets
