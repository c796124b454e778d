"""Tests for calib/metrics/nll.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import log_loss

from calib.metrics import negative_log_likelihood


class TestNegativeLogLikelihood:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # p_{i,y_i} = [.9 .15 .65 .3 .85 .5]; -log: .10536 1.89712 .43078 1.20397 .16252 .69315
        # sum 4.49290 / 6 = .748817
        probs, labels = worked
        expected = -(math.log(0.9) + math.log(0.15) + math.log(0.65) + math.log(0.3) + math.log(0.85)
                     + math.log(0.5)) / 6  # fmt: skip
        assert expected == pytest.approx(0.748817, abs=1e-6)
        assert negative_log_likelihood(probs, labels) == pytest.approx(expected, abs=1e-12)

    def test_sklearn_log_loss(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = random_case
        probs = 0.98 * probs + 0.02 / probs.shape[1]  # keep every p_{i,y} far above the clip
        expected = log_loss(labels, probs, labels=np.arange(probs.shape[1]))
        assert negative_log_likelihood(probs, labels) == pytest.approx(expected, rel=1e-12)

    def test_clipped_at_1e_12(self) -> None:
        # Row 0 gives p_y = 0 -> clipped to 1e-12 -> -log = 27.631; row 1 gives p_y = 1 -> 0.
        probs = np.array([[1.0, 0.0], [0.0, 1.0]])
        value = negative_log_likelihood(probs, np.array([1, 1]))
        assert math.isfinite(value)
        assert value == pytest.approx(-math.log(1e-12) / 2, abs=1e-12)

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, _ = worked
        with pytest.raises(ValueError, match=r"got labels\[0\]=-1\."):
            negative_log_likelihood(probs, np.array([-1, 1, 1, 0, 2, 0]))
