"""Softmax in float64, for computing metrics from logits."""

from __future__ import annotations

import numpy as np

from calib.metrics._validation import ArrayLike, to_float64

__all__ = ["softmax64"]


def softmax64(logits: ArrayLike) -> np.ndarray:
    """Softmax over the last axis computed in float64; returns probabilities (rows sum to 1).

    p_{i,k} = exp(z_{i,k} − max_l z_{i,l}) / Σ_j exp(z_{i,j} − max_l z_{i,l})

    where z_{i,k} is the logit of class k for sample i. float32 saturates: for many CIFAR-10
    predictions the float32 softmax is exactly 1.0, which moves samples into the top bin and
    makes NLL infinite without clipping, so metrics compute it in float64 (docs/methods.md §6.1).
    The metrics never apply this themselves: callers pass probabilities explicitly.

    Args:
        logits: real logits z, shape (..., C) with C >= 1; numpy array or torch tensor (any
            dtype or device). Must be finite.

    Returns:
        A float64 numpy array of the same shape whose last axis sums to 1.

    >>> softmax64([[0.0, 0.0], [0.0, np.log(3.0)]]).tolist()
    [[0.5, 0.5], [0.25, 0.75]]
    """
    z = to_float64(logits, "logits")
    if z.ndim < 1 or z.shape[-1] < 1:
        raise ValueError(f"`logits` must have at least one class on its last axis, got shape {z.shape}.")
    finite = np.isfinite(z)
    if not finite.all():
        index = tuple(int(i) for i in np.argwhere(~finite)[0])
        where = ", ".join(str(i) for i in index)
        raise ValueError(f"`logits` must be finite (no NaN or inf), got logits[{where}]={float(z[index])}.")
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
