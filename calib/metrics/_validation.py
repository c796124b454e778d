"""Input conversion and checks shared by every metric (private).

Every check raises ``ValueError`` naming the argument, the offending value and what is allowed.
Inputs may be numpy arrays, torch tensors or nested sequences; they are converted to numpy
(probabilities and scores to float64). Nothing here guesses whether an array holds logits.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

__all__ = [
    "PROB_SUM_TOLERANCE",
    "ArrayLike",
    "check_num_bins",
    "check_probs",
    "check_probs_labels",
    "check_scores",
    "to_float64",
    "to_numpy",
]

ArrayLike = Union[npt.ArrayLike, "torch.Tensor"]
"""A numpy array, a torch tensor (any device) or a nested sequence of numbers."""

PROB_SUM_TOLERANCE = 1e-6
"""Largest allowed ``|sum_k p_k - 1|`` for one row of probabilities."""


def to_numpy(x: Any) -> np.ndarray:
    """``x`` as a numpy array; a torch tensor is detached and moved to the CPU first."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        t = x.detach().cpu()
        if t.is_floating_point():
            t = t.double()  # bfloat16/float16 have no numpy dtype; float64 loses nothing
        return t.numpy()
    return np.asarray(x)


def to_float64(x: Any, name: str) -> np.ndarray:
    """``x`` as a float64 numpy array; a non-numeric array is a ``ValueError`` naming ``name``."""
    arr = to_numpy(x)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"`{name}` must be a real numeric array, got dtype {arr.dtype}.")
    return arr.astype(np.float64, copy=False)


def check_num_bins(num_bins: Any) -> int:
    """``num_bins`` as an ``int``; it must be an integer >= 1 (a bool is rejected)."""
    is_integer = isinstance(num_bins, numbers.Integral) and not isinstance(num_bins, bool)
    if not is_integer or num_bins < 1:
        shown = int(num_bins) if is_integer else num_bins  # np.int64(0) is shown as 0
        raise ValueError(f"`num_bins` must be an integer >= 1, got num_bins={shown!r}.")
    return int(num_bins)


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def check_probs(probs: Any, name: str = "probs") -> np.ndarray:
    """Validate an (N, C) array of probabilities and return it as float64 numpy.

    Rules: 2-D, N >= 1, C >= 2, finite, every entry in [0, 1], every row summing to 1 within
    ``PROB_SUM_TOLERANCE``.
    """
    p = to_float64(probs, name)
    if p.ndim != 2:
        raise ValueError(f"`{name}` must be a 2-D array of shape (N, C), got shape {p.shape}.")
    n, c = p.shape
    if n < 1:
        raise ValueError(f"`{name}` must contain at least one sample (row), got shape {p.shape}.")
    if c < 2:
        raise ValueError(
            f"`{name}` must have at least 2 classes (columns), got shape {p.shape}. "
            "For a binary problem pass both columns, [1 - p, p]."
        )
    finite = np.isfinite(p)
    if not finite.all():
        i, k = _first_index(~finite)
        raise ValueError(f"`{name}` must be finite (no NaN or inf), got {name}[{i}, {k}]={float(p[i, k])}.")
    outside = (p < 0.0) | (p > 1.0)
    if outside.any():
        i, k = _first_index(outside)
        raise ValueError(f"`{name}` entries must lie in [0, 1], got {name}[{i}, {k}]={float(p[i, k])!r}.")
    sums = p.sum(axis=1)
    bad = np.abs(sums - 1.0) > PROB_SUM_TOLERANCE
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"`{name}` rows must sum to 1 (tolerance {PROB_SUM_TOLERANCE:g}), got row {i} summing to "
            f"{float(sums[i])!r}. Pass probabilities, not logits; convert logits with "
            "calib.metrics.softmax64(logits)."
        )
    return p


def check_probs_labels(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate probabilities (N, C) and integer labels (N,) in [0, C); return numpy arrays.

    The number of classes is ``probs.shape[1]``, never ``max(labels) + 1``.
    """
    p = check_probs(probs)
    n, c = p.shape
    y = to_numpy(labels)
    if y.dtype.kind not in "iu":
        raise ValueError(f"`labels` must have an integer dtype, got dtype {y.dtype}.")
    if y.shape != (n,):
        raise ValueError(
            f"`labels` must be a 1-D array of shape (N,) = ({n},) matching `probs` of shape {p.shape}, "
            f"got shape {y.shape}."
        )
    out_of_range = (y < 0) | (y >= c)
    if out_of_range.any():
        i = int(np.argmax(out_of_range))
        raise ValueError(
            f"`labels` must be in [0, C) = [0, {c}) where C = probs.shape[1], got labels[{i}]={int(y[i])}."
        )
    return p, y.astype(np.int64, copy=False)


def check_scores(scores: Any, name: str) -> np.ndarray:
    """Validate a non-empty, finite 1-D array of scores and return it as float64 numpy."""
    s = to_float64(scores, name)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"`{name}` must be a non-empty 1-D array, got shape {s.shape}.")
    finite = np.isfinite(s)
    if not finite.all():
        i = int(np.argmax(~finite))
        raise ValueError(f"`{name}` must be finite (no NaN or inf), got {name}[{i}]={float(s[i])}.")
    return s
