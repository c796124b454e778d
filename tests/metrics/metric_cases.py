"""Inputs the metrics' tests share: over-confident random predictions, and two-class cases built from given
confidences and correctness."""

from __future__ import annotations

import numpy as np


def overconfident_probs(n: int, num_classes: int, seed: int, *, scale: float = 3.0, round_logits: bool = False,
                        below_confidence: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Softmax of N(0, scale²) logits, with labels drawn from a sharpened version of the probabilities (p^½,
    renormalised): an over-confident, imperfect model. ``round_logits`` makes many confidences tie;
    ``below_confidence`` drops the rows whose confidence reaches it."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(n, num_classes))
    if round_logits:
        logits = np.round(logits)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    if below_confidence is not None:
        probs = probs[probs.max(axis=1) < below_confidence]
    sharp = probs**0.5
    sharp /= sharp.sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(num_classes, p=row) for row in sharp])
    return probs, labels


def binary(confidences: list[float], correct: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Two-class probs whose top-label confidences and correctness are the given ones (class 0 predicted)."""
    conf = np.asarray(confidences, dtype=float)
    return np.stack([conf, 1.0 - conf], axis=1), np.where(np.asarray(correct) == 1, 0, 1)
