"""MbLS (calib/losses/mbls.py)."""

import math

import pytest
import torch
from torch.nn import functional as F

from calib._config import ConfigError
from calib.losses import MbLS, MbLSConfig


class TestMbLS:
    def test_main(self):
        # m = 6, λ = 0.1 (the defaults).
        # Sample 1: z = (10, 0, 3), y = 0: gaps d = (0, 10, 7) → relu(d − 6) = (0, 4, 1);
        #   CE_1 = log(e^10 + 1 + e^3) − 10.
        # Sample 2: z = (0, 2, 1), y = 2: gaps (2, 0, 1), all <= 6 → 0; CE_2 = log(1 + e^2 + e) − 1.
        # Penalty = mean over the 2 × 3 entries = (4 + 1)/6.
        logits = torch.tensor([[10.0, 0.0, 3.0], [0.0, 2.0, 1.0]], dtype=torch.float64)
        targets = torch.tensor([0, 2])
        ce1 = math.log(math.exp(10) + 1 + math.exp(3)) - 10
        ce2 = math.log(1 + math.exp(2) + math.e) - 1
        expected = (ce1 + ce2) / 2 + 0.1 * 5 / 6
        loss = MbLS()(logits, targets)
        assert loss.dim() == 0 and float(loss) == pytest.approx(expected, rel=1e-12)
        assert (MbLSConfig().margin, MbLSConfig().penalty_weight) == (6.0, 0.1)

    def test_no_penalty_when_gaps_within_margin(self):
        logits = torch.tensor([[3.0, 0.0, -2.9], [1.0, 1.0, 1.0], [-1.0, 4.0, 1.0]])
        targets = torch.tensor([1, 0, 2])
        torch.testing.assert_close(MbLS(margin=6.0, penalty_weight=5.0)(logits, targets),
                                   F.cross_entropy(logits, targets))

    def test_penalty_gradient_reaches_the_max_logit(self):
        # Sample 1 of test_main: the active gaps are k = 1, 2; with "mean" over 2 × 3 entries,
        # d/dz_max of λ·mean relu(d − m) = λ · 2/6 and d/dz_k = −λ/6 for each active k.
        logits = torch.tensor([[10.0, 0.0, 3.0], [0.0, 2.0, 1.0]], dtype=torch.float64, requires_grad=True)
        targets = torch.tensor([0, 2])
        (grad,) = torch.autograd.grad(MbLS()(logits, targets), logits)
        (ce_grad,) = torch.autograd.grad(F.cross_entropy(logits, targets), logits)
        expected = torch.tensor([[0.2 / 6, -0.1 / 6, -0.1 / 6], [0.0, 0.0, 0.0]], dtype=torch.float64)
        torch.testing.assert_close(grad - ce_grad, expected)

    def test_sum_is_batch_size_times_mean(self):
        logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(1)) * 8
        targets = torch.tensor([0, 1, 2, 3, 0])
        torch.testing.assert_close(MbLS(reduction="sum")(logits, targets), 5 * MbLS()(logits, targets))

    def test_gradients_flow(self):
        logits = (torch.randn(4, 3, generator=torch.Generator().manual_seed(2)) * 10).requires_grad_()
        MbLS()(logits, torch.tensor([0, 1, 2, 0])).backward()
        assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0

    @pytest.mark.parametrize(("key", "value"), [("margin", -1.0), ("penalty_weight", -0.1)])
    def test_errors(self, key, value):
        with pytest.raises(ConfigError, match=rf"`{key}` must be >= 0, got {key}={value}\."):
            MbLSConfig(**{key: value})
        with pytest.raises(ConfigError, match=rf"`{key}` must be >= 0"):
            MbLS(**{key: value})
