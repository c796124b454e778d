"""Tests for calib/metrics/brier.py."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import mean_squared_error

from calib.metrics import brier_score


class TestBrierScore:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # Σ_k (p_k - onehot_k)^2 per row:
        # 0: .1^2 + .05^2 + .05^2 = .015           1: .7^2 + .85^2 + .15^2 = 1.235
        # 2: .1^2 + .35^2 + .25^2 = .195           3: .7^2 + .25^2 + .45^2 = .755
        # 4: .1^2 + .05^2 + .15^2 = .035           5: .5^2 + .35^2 + .15^2 = .395
        # mean = 2.63 / 6 = .438333...
        probs, labels = worked
        assert brier_score(probs, labels) == pytest.approx(2.63 / 6, abs=1e-12)

    def test_numpy_formula(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = random_case
        onehot = np.eye(probs.shape[1])[labels]
        expected = np.mean(np.sum((probs - onehot) ** 2, axis=1))
        assert brier_score(probs, labels) == pytest.approx(expected, rel=1e-12)

    def test_c_times_sklearn_mse(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        # TST-R / BALCAL-R use mean_squared_error(onehot, p): the mean over N*C entries.
        probs, labels = random_case
        num_classes = probs.shape[1]
        mse = mean_squared_error(np.eye(num_classes)[labels], probs)
        assert brier_score(probs, labels) == pytest.approx(num_classes * mse, rel=1e-12)

    def test_range(self) -> None:
        # Confident and right -> 0; confident and wrong -> 1^2 + 1^2 = 2.
        assert brier_score(np.array([[1.0, 0.0]]), np.array([0])) == 0.0
        assert brier_score(np.array([[1.0, 0.0]]), np.array([1])) == 2.0

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        with pytest.raises(ValueError, match=r"`labels` must be a 1-D array of shape \(N,\) = \(6,\)"):
            brier_score(probs, labels[:5])
