"""Over-confident synthetic logits with known true probabilities: the post-hoc study's many-class regime.

For each sample, the true class probabilities p are drawn from a symmetric Dirichlet(α·1_C), α = 0.3 (most mass on
a few classes, as a trained network's posterior), the label is drawn from p, and the model's logits are

    z = s·log p + ε,   s = 2.5,   ε ~ N(0, σ² I),   σ = 0.5

so softmax(z) is over-confident (s > 1 sharpens p; temperature scaling with T ~= s undoes most of it) and imperfect
(the noise ε moves the argmax away from the most likely class). With C = 100 the uncalibrated accuracy is about 10%
and the test NLL about 4.5 nats (TS: 3.6); with C = 10 about 46%.

:func:`write_synthetic_logits` writes train, validation and test splits as a features file
(:mod:`calib.artifacts.features_file`, the logits also as the features), so every post-hoc method runs on them as on
a trained model's validation logits (``studies/posthoc.py --synthetic-classes 100``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["CONCENTRATION", "NOISE_STD", "SHARPNESS", "overconfident_logits", "write_synthetic_logits"]

CONCENTRATION = 0.3
"""α of the symmetric Dirichlet the true probabilities are drawn from."""

SHARPNESS = 2.5
"""s of z = s·log p + ε: the logits are s times too sharp."""

NOISE_STD = 0.5
"""σ of the Gaussian logit noise ε."""


def overconfident_logits(num_samples: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(logits (N, C) float64, labels (N,) int64) of the module's recipe, from ``numpy.random.default_rng(seed)``.

    >>> logits, labels = overconfident_logits(4, 3, seed=0)
    >>> logits.shape, labels.shape, bool((labels >= 0).all() and (labels < 3).all())
    ((4, 3), (4,), True)
    """
    if num_samples < 1 or num_classes < 2:
        raise ValueError(f"`num_samples` must be >= 1 and `num_classes` >= 2, got {num_samples=}, {num_classes=}.")
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(num_classes, CONCENTRATION), size=num_samples)
    labels = (probs.cumsum(axis=1) > rng.random((num_samples, 1))).argmax(axis=1)
    # a Dirichlet(0.3) draw can underflow to exactly 0: floor it at the smallest normal float64 before the log
    log_probs = np.log(np.maximum(probs, np.finfo(np.float64).tiny))
    logits = SHARPNESS * log_probs + NOISE_STD * rng.standard_normal((num_samples, num_classes))
    return logits, labels.astype(np.int64)


def write_synthetic_logits(path: str | os.PathLike, num_classes: int, *, seed: int = 0, num_train: int = 1_000,
                           num_val: int = 5_000, num_test: int = 10_000) -> Path:
    """Write train, val and test splits of :func:`overconfident_logits` (split k from seed ``seed·3 + k``) as an
    ``.npz`` features file at ``path`` (the logits are also the features); returns the path. Written to a temporary
    name and renamed, so a concurrent reader never sees half a file; the same arguments give the same bytes."""
    path = Path(path)
    arrays = {}
    for k, (split, size) in enumerate((("train", num_train), ("val", num_val), ("test", num_test))):
        logits, labels = overconfident_logits(size, num_classes, seed=seed * 3 + k)
        arrays[f"{split}_features"] = arrays[f"{split}_logits"] = logits.astype(np.float32)
        arrays[f"{split}_labels"] = labels
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial.npz")
    np.savez(partial, **arrays)
    os.replace(partial, path)
    return path
