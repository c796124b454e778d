"""Tests for calib/metrics/accuracy.py."""

from __future__ import annotations

import numpy as np
import pytest

from calib.metrics import accuracy


class TestAccuracy:
    def test_main(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        # argmax [0 0 1 2 2 0] vs labels [0 1 1 0 2 0]: rows 0, 2, 4, 5 right -> 4/6.
        probs, labels = worked
        assert accuracy(probs, labels) == pytest.approx(4 / 6, abs=1e-15)

    def test_ties_go_to_lowest_index(self) -> None:
        assert accuracy(np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([0, 1])) == 0.5

    def test_returns_fraction(self, random_case: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = random_case
        value = accuracy(probs, labels)
        assert isinstance(value, float)
        assert value == pytest.approx(np.mean(probs.argmax(axis=1) == labels))
        assert 0.0 <= value <= 1.0

    def test_errors(self, worked: tuple[np.ndarray, np.ndarray]) -> None:
        probs, labels = worked
        with pytest.raises(ValueError, match=r"`labels` must have an integer dtype, got dtype float64\."):
            accuracy(probs, labels.astype(float))
