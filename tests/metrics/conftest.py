"""Shared inputs for the metric tests: the hand-computed worked example and random data."""

from __future__ import annotations

import numpy as np
import pytest
from metric_cases import overconfident_probs

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


@pytest.fixture(params=[0, 1, 2], ids=lambda s: f"seed{s}")
def random_case(request: pytest.FixtureRequest) -> tuple[np.ndarray, np.ndarray]:
    """Random (probs, labels), N = 2000, C = 10, for comparisons with reference implementations."""
    return overconfident_probs(2000, 10, request.param)
