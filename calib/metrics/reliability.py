"""Reliability-diagram statistics: per-bin sample count, mean confidence and accuracy."""

from __future__ import annotations

import numpy as np

from calib.metrics._binning import bin_statistics, equal_width_bin_indices, top_label
from calib.metrics._validation import ArrayLike, check_num_bins, check_probs_labels

__all__ = ["reliability_bins"]


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
