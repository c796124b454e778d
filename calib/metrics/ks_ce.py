"""Kolmogorov–Smirnov calibration error (Gupta et al., ICLR 2021), top-label: no bins."""

from __future__ import annotations

import numpy as np

from calib.metrics._binning import top_label
from calib.metrics._validation import ArrayLike, check_probs_labels

__all__ = ["ks_calibration_error"]


def _ks_compute(confidences: np.ndarray, correct: np.ndarray) -> float:
    order = np.argsort(confidences, kind="stable")
    sorted_confidences = confidences[order]
    gaps = np.cumsum(sorted_confidences - correct[order]) / confidences.size
    # the cumulative sums at each distinct confidence: the last index of every run of tied confidences
    last_of_tie = np.append(sorted_confidences[1:] != sorted_confidences[:-1], True)
    return float(np.abs(gaps[last_of_tie]).max())


def ks_calibration_error(probs: ArrayLike, labels: ArrayLike) -> float:
    """KS calibration error of the top-label prediction, a fraction in [0, 1] (Gupta et al. 2021, §3).

    KS = max_σ |(1/N) Σ_{i: c_i ≤ σ} (c_i − y_i)|

    where c_i = max_k p_{i,k} is the confidence, y_i = 1[arg-max class = label] its correctness and σ runs
    over the distinct confidences: the largest gap between the cumulative confidence and the cumulative
    accuracy of the samples sorted by confidence, the Kolmogorov–Smirnov distance between the two
    (sub-)distributions Gupta et al. define. Samples with equal confidence enter together (the gap is taken
    only after the last of them), so the value does not depend on the order of tied samples; with distinct
    confidences this is their max over the sorted positions i of |(1/N) Σ_{j≤i} (c_j − y_j)|, as in
    probmetrics' ``KolmogorovSmirnovCalibrationMetric`` on (c, y) (docs/methods.md §6.14). Reference:
    Gupta, Rahimi, Ajanthan, Mensink, Sminchisescu, Hartley, "Calibration of Neural Networks using Splines",
    ICLR 2021.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).

    Returns:
        The KS error in [0, 1]; lower is better, 0 when the cumulative confidence and accuracy agree at
        every confidence.

    >>> probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
    >>> ks_calibration_error(probs, [0, 1, 0, 1])
    0.25
    """
    p, y = check_probs_labels(probs, labels)
    return _ks_compute(*top_label(p, y))
