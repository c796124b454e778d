"""Focal loss (calib/losses/focal.py)."""

import math

import pytest
import torch
from torch.nn import functional as F

from calib._config import ConfigError
from calib.losses import FocalLoss, FocalLossConfig

LN2 = math.log(2)


class TestFocalLoss:
    def test_main(self):
        # γ = 3 (the default). Sample 1: logits (ln 2, 0, 0), y = 0 → p_y = 1/2: (1/2)^3 · ln 2 = ln 2 / 8.
        # Sample 2: logits (0, 0, ln 2), y = 0 → p_y = 1/4: (3/4)^3 · ln 4 = (27/64) · 2 ln 2.
        logits = torch.tensor([[LN2, 0.0, 0.0], [0.0, 0.0, LN2]], dtype=torch.float64)
        targets = torch.tensor([0, 0])
        expected = (LN2 / 8 + 27 / 64 * 2 * LN2) / 2
        loss = FocalLoss()(logits, targets)
        assert loss.dim() == 0 and loss.dtype == torch.float64
        assert float(loss) == pytest.approx(expected, rel=1e-12)
        assert FocalLossConfig().gamma == 3.0

    def test_gamma_zero_is_cross_entropy(self):
        logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
        targets = torch.tensor([0, 1, 2, 3, 0, 1])
        loss = FocalLoss(0.0)(logits, targets)
        torch.testing.assert_close(loss, F.cross_entropy(logits, targets))
        (grad,) = torch.autograd.grad(loss, logits)
        (ce_grad,) = torch.autograd.grad(F.cross_entropy(logits, targets), logits)
        torch.testing.assert_close(grad, ce_grad)

    def test_sum_is_batch_size_times_mean(self):
        logits = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
        targets = torch.tensor([0, 1, 2, 1, 0])
        torch.testing.assert_close(FocalLoss(2.0, reduction="sum")(logits, targets),
                                   5 * FocalLoss(2.0, reduction="mean")(logits, targets))

    def test_gradients_flow(self):
        logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(2), requires_grad=True)
        FocalLoss()(logits, torch.tensor([0, 1, 2, 0])).backward()
        assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0

    def test_gradient_through_the_focal_weight(self):
        # One sample, two classes, logits (0, 0) → p_y = 1/2, γ = 1: L = −(1 − p)·log p with p = sigmoid(z_0 − z_1).
        # dL/dp = log p − (1 − p)/p = −ln 2 − 1; dp/dz_0 = p(1 − p) = 1/4 → dL/dz_0 = −(ln 2 + 1)/4.
        logits = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
        FocalLoss(1.0)(logits, torch.tensor([0])).backward()
        assert float(logits.grad[0, 0]) == pytest.approx(-(LN2 + 1) / 4, rel=1e-12)

    @pytest.mark.parametrize("gamma", [0.5, 3.0])
    def test_confident_float32_sample_keeps_finite_gradients(self, gamma):
        # p_y rounds to 1 in float32 here; (1 − p_y)^γ with γ < 1 would have an infinite derivative.
        logits = torch.tensor([[0.0, 40.0, 0.0], [1.0, 0.0, 0.0]], requires_grad=True)
        loss = FocalLoss(gamma)(logits, torch.tensor([1, 0]))
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()

    @pytest.mark.parametrize("value", [-1.0, -0.01])
    def test_errors(self, value):
        with pytest.raises(ConfigError, match=rf"`gamma` must be >= 0, got gamma={value}\."):
            FocalLossConfig(gamma=value)
        with pytest.raises(ConfigError, match=r"`gamma` must be >= 0"):
            FocalLoss(value)
