"""Negative log-likelihood (mean cross-entropy) of given probabilities."""

from __future__ import annotations

import numpy as np

from calib.metrics._validation import ArrayLike, check_probs_labels

__all__ = ["NLL_CLIP", "negative_log_likelihood"]

NLL_CLIP = 1e-12
"""Probabilities are clipped to [NLL_CLIP, 1] before the log, so NLL <= -log(1e-12) ~= 27.63."""


def _nll_compute(probs: np.ndarray, labels: np.ndarray) -> float:
    p_true = probs[np.arange(labels.size), labels]
    return float(np.mean(-np.log(np.clip(p_true, NLL_CLIP, 1.0))))


def negative_log_likelihood(probs: ArrayLike, labels: ArrayLike) -> float:
    """Mean negative log-likelihood in nats, a value in [0, -log(1e-12) ~= 27.63] (not a fraction).

    NLL = −(1/N) · Σ_{i=1..N} log max(p_{i,y_i}, 1e-12)

    where N is the number of samples, y_i the label of sample i and p_{i,y_i} the probability
    given to it. This is the mean cross-entropy of the (possibly recalibrated) probabilities
    (METHODS.md §6.6); it equals ``sklearn.metrics.log_loss`` whenever no p_{i,y_i} is clipped.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).

    Returns:
        The mean NLL in nats; lower is better, 0 for a confident correct model.

    >>> round(negative_log_likelihood([[0.5, 0.5], [0.25, 0.75]], [0, 1]), 6)
    0.490415
    """
    p, y = check_probs_labels(probs, labels)
    return _nll_compute(p, y)
