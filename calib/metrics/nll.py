"""Negative log-likelihood (mean cross-entropy) of given probabilities, or exactly from logits."""

from __future__ import annotations

import math

import numpy as np

from calib.metrics._validation import ArrayLike, check_probs_labels, to_float64, to_numpy

__all__ = ["NLL_FLOOR", "NLL_MAX", "negative_log_likelihood"]

NLL_FLOOR = float(np.finfo(np.float64).smallest_subnormal)
"""p_{i,y_i} is floored at the smallest positive float64 (~4.94e-324) only so that p_y = 0 stays finite."""

NLL_MAX = -math.log(NLL_FLOOR)
"""The largest NLL a sample (hence the mean) can have: −log(NLL_FLOOR) ~= 744.44 nats."""


def _nll_compute(probs: np.ndarray, labels: np.ndarray) -> float:
    p_true = probs[np.arange(labels.size), labels]
    return float(np.mean(-np.log(np.maximum(p_true, NLL_FLOOR))))


def _nll_from_logits(logits: np.ndarray, labels: np.ndarray) -> float:
    shifted = logits - logits.max(axis=1, keepdims=True)  # log-sum-exp: the sum is >= 1, no underflow
    log_p_true = shifted[np.arange(labels.size), labels] - np.log(np.exp(shifted).sum(axis=1))
    return float(np.mean(np.minimum(-log_p_true, NLL_MAX)))


def _check_logits_labels(logits: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Finite float64 logits (N, C), N >= 1, C >= 2, and int64 labels (N,) in [0, C)."""
    z = to_float64(logits, "logits")
    if z.ndim != 2 or z.shape[0] < 1 or z.shape[1] < 2:
        raise ValueError(f"`logits` must have shape (N, C) with N >= 1 and C >= 2, got shape {z.shape}.")
    finite = np.isfinite(z)
    if not finite.all():
        i, k = (int(v) for v in np.argwhere(~finite)[0])
        raise ValueError(f"`logits` must be finite (no NaN or inf), got logits[{i}, {k}]={float(z[i, k])}.")
    y = to_numpy(labels)
    if y.dtype.kind not in "iu":
        raise ValueError(f"`labels` must have an integer dtype, got dtype {y.dtype}.")
    if y.shape != (z.shape[0],):
        raise ValueError(f"`labels` must have shape (N,) = ({z.shape[0]},) matching `logits` of shape {z.shape}, "
                         f"got shape {y.shape}.")
    out_of_range = (y < 0) | (y >= z.shape[1])
    if out_of_range.any():
        i = int(np.argmax(out_of_range))
        raise ValueError(f"`labels` must be in [0, C) = [0, {z.shape[1]}) where C = logits.shape[1], "
                         f"got labels[{i}]={int(y[i])}.")
    return z, y.astype(np.int64, copy=False)


def negative_log_likelihood(probs: ArrayLike, labels: ArrayLike, *, from_logits: bool = False) -> float:
    """Mean negative log-likelihood in nats, a value in [0, −log(4.94e-324) ~= 744.44] (not a fraction).

    NLL = −(1/N) · Σ_{i=1..N} log max(p_{i,y_i}, p_min)

    where N is the number of samples, y_i the label of sample i, p_{i,y_i} the probability given to
    it and p_min = :data:`NLL_FLOOR` the smallest positive float64: the NLL is exact for every
    p_{i,y_i} a float64 can hold, and p_{i,y_i} = 0 gives 744.44 nats rather than inf. This is the
    mean cross-entropy of the (possibly recalibrated) probabilities (docs/methods.md §6.6); it equals
    ``sklearn.metrics.log_loss`` whenever no p_{i,y_i} is below sklearn's own clip (float64 eps).

    With ``from_logits=True`` the first argument holds logits z and log p_{i,y_i} is the exact
    float64 log-softmax, z_{i,y_i} − log Σ_k exp(z_{i,k}) (no exp underflow, so gaps beyond 745
    nats are exact too), each sample's term again capped at 744.44 so both paths share one range.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1 (logits with ``from_logits=True``). Numpy
            array or torch tensor.
        labels: integer labels in [0, C), shape (N,).
        from_logits: whether ``probs`` holds logits rather than probabilities.

    Returns:
        The mean NLL in nats; lower is better, 0 for a confident correct model.

    >>> round(negative_log_likelihood([[0.5, 0.5], [0.25, 0.75]], [0, 1]), 6)
    0.490415
    >>> round(negative_log_likelihood([[0.0, 0.0], [0.0, np.log(3.0)]], [0, 1], from_logits=True), 6)
    0.490415
    """
    if from_logits:
        return _nll_from_logits(*_check_logits_labels(probs, labels))
    p, y = check_probs_labels(probs, labels)
    return _nll_compute(p, y)
