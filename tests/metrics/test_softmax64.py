"""Tests for calib/metrics/softmax.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calib.metrics import softmax64


class TestSoftmax64:
    def test_main(self) -> None:
        # Row [0, log 3]: e^0 = 1, e^{log 3} = 3 -> [1/4, 3/4]. Row [1, 1, 1] -> 1/3 each.
        np.testing.assert_allclose(softmax64([[0.0, math.log(3.0)]]), [[0.25, 0.75]], atol=1e-15)
        np.testing.assert_allclose(softmax64(np.ones((1, 3))), [[1 / 3, 1 / 3, 1 / 3]], atol=1e-15)

    def test_float32_saturates_float64_does_not(self) -> None:
        torch = pytest.importorskip("torch")
        logits = torch.tensor([[20.0, 0.0]], dtype=torch.float32)
        # 1 - e^-20 = 1 - 2.1e-9 rounds to 1.0 in float32 (eps 1.2e-7) but not in float64.
        assert torch.softmax(logits, dim=1)[0, 0].item() == 1.0
        p = softmax64(logits)
        assert p.dtype == np.float64
        assert p[0, 0] < 1.0
        assert p[0, 1] == pytest.approx(math.exp(-20.0) / (1 + math.exp(-20.0)), rel=1e-12)

    def test_shift_invariant_and_no_overflow(self) -> None:
        p = softmax64([[1000.0, 999.0], [0.0, -1.0]])
        np.testing.assert_allclose(p[0], p[1], rtol=1e-14)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-15)

    def test_last_axis(self) -> None:
        p = softmax64(np.zeros((2, 3, 4)))
        assert p.shape == (2, 3, 4)
        np.testing.assert_allclose(p, 0.25)

    def test_errors(self) -> None:
        with pytest.raises(
            ValueError, match=r"^`logits` must be finite \(no NaN or inf\), got logits\[0, 1\]=nan\.$"
        ):
            softmax64([[0.0, float("nan")]])
        with pytest.raises(
            ValueError, match=r"`logits` must have at least one class on its last axis, got shape \(\)"
        ):
            softmax64(1.0)
        with pytest.raises(ValueError, match=r"`logits` must be a real numeric array, got dtype <U1\."):
            softmax64(["a", "b"])
