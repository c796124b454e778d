"""Shared inputs for the metric tests: the hand-computed worked example and random data."""

from __future__ import annotations

import numpy as np
import pytest

# Worked example: N = 6 samples, C = 3 classes. The hand arithmetic lives next to each test.
#
#  i   p_i                   y_i  argmax  conf  correct
#  0   [0.90, 0.05, 0.05]    0    0       0.90  1
#  1   [0.70, 0.15, 0.15]    1    0       0.70  0
#  2   [0.10, 0.65, 0.25]    1    1       0.65  1
#  3   [0.30, 0.25, 0.45]    0    2       0.45  0
#  4   [0.10, 0.05, 0.85]    2    2       0.85  1
#  5   [0.50, 0.35, 0.15]    0    0       0.50  1
#
# No probability sits on an edge of 3 or 5 equal-width bins, so the results do not depend on
# float ties at the edges.
WORKED_PROBS = np.array(
    [
        [0.90, 0.05, 0.05],
        [0.70, 0.15, 0.15],
        [0.10, 0.65, 0.25],
        [0.30, 0.25, 0.45],
        [0.10, 0.05, 0.85],
        [0.50, 0.35, 0.15],
    ]
)
WORKED_LABELS = np.array([0, 1, 1, 0, 2, 0])


@pytest.fixture
def worked() -> tuple[np.ndarray, np.ndarray]:
    """The 6-sample, 3-class worked example above, as (probs, labels)."""
    return WORKED_PROBS.copy(), WORKED_LABELS.copy()


def _random_case(seed: int, n: int = 2000, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=3.0, size=(n, num_classes))
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    # Labels drawn from a sharpened version of probs: an over-confident, imperfect model.
    sharp = probs**0.5
    sharp /= sharp.sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(num_classes, p=row) for row in sharp])
    return probs, labels


@pytest.fixture(params=[0, 1, 2], ids=lambda s: f"seed{s}")
def random_case(request: pytest.FixtureRequest) -> tuple[np.ndarray, np.ndarray]:
    """Random (probs, labels), N = 2000, C = 10, for comparisons with reference implementations."""
    return _random_case(request.param)
