"""Dual focal loss (calib/losses/dual_focal.py)."""

import math

import pytest
import torch
from torch.nn import functional as F

from calib._config import ConfigError
from calib.losses import DualFocalLoss, DualFocalLossConfig
from calib.losses.dual_focal import next_smaller_probability


def logits_for(probs):
    """Logits whose softmax is ``probs`` (rows)."""
    return torch.tensor(probs, dtype=torch.float64).log()


class TestDualFocalLoss:
    def test_main(self):
        # γ = 5 (the default). p = (1/2, 1/4, 1/4), y = 0: p_j = 1/4, base = 1 − 1/2 + 1/4 = 3/4 → (3/4)^5 · ln 2.
        logits = logits_for([[0.5, 0.25, 0.25]])
        loss = DualFocalLoss()(logits, torch.tensor([0]))
        assert loss.dim() == 0 and float(loss) == pytest.approx(0.75**5 * math.log(2), rel=1e-12)
        assert DualFocalLossConfig().gamma == 5.0

    def test_next_smaller_probability(self):
        # Row 1: y = 0 is the argmax → the runner-up 1/4 (tied pair 1/4, 1/4: the value is 1/4 either way).
        # Row 2: y = 1 (p = 1/3) is not the argmax → 1/6, not the top 1/2.
        # Row 3: y = 1 (p = 1/4) ties with class 2 and nothing is smaller → 0.
        # Row 4: y = 0 ties with class 1 at 0.4 (not strictly smaller) → 0.2.
        probs = torch.tensor([[0.5, 0.25, 0.25], [0.5, 1 / 3, 1 / 6], [0.5, 0.25, 0.25], [0.4, 0.4, 0.2]])
        p_j = next_smaller_probability(probs, torch.tensor([0, 1, 1, 0]))
        torch.testing.assert_close(p_j, torch.tensor([0.25, 1 / 6, 0.0, 0.2]))

    def test_p_j_cases_by_hand(self):
        # γ = 2, reduction "sum", one row per case:
        # y not the argmax: p = (1/2, 1/3, 1/6), y = 1 → p_j = 1/6, base 1 − 1/3 + 1/6 = 5/6 → (5/6)^2 · ln 3.
        # tie with y, nothing smaller: p = (1/2, 1/4, 1/4), y = 1 → p_j = 0, base 3/4 → (3/4)^2 · ln 4.
        # y tied at the top: p = (0.4, 0.4, 0.2), y = 0 → p_j = 0.2, base 1 − 0.4 + 0.2 = 0.8 → 0.64 · ln 2.5.
        logits = logits_for([[0.5, 1 / 3, 1 / 6], [0.5, 0.25, 0.25], [0.4, 0.4, 0.2]])
        targets = torch.tensor([1, 1, 0])
        losses = [float(DualFocalLoss(2.0, "sum")(logits[i : i + 1], targets[i : i + 1])) for i in range(3)]
        assert losses == pytest.approx([(5 / 6) ** 2 * math.log(3), 0.75**2 * math.log(4), 0.64 * math.log(2.5)],
                                       rel=1e-12)

    def test_gamma_zero_is_cross_entropy(self):
        logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
        targets = torch.tensor([0, 1, 2, 3, 0, 1])
        torch.testing.assert_close(DualFocalLoss(0.0)(logits, targets), F.cross_entropy(logits, targets))

    def test_sum_is_batch_size_times_mean(self):
        logits = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
        targets = torch.tensor([0, 1, 2, 1, 0])
        torch.testing.assert_close(DualFocalLoss(reduction="sum")(logits, targets),
                                   5 * DualFocalLoss()(logits, targets))

    def test_gradients_flow(self):
        logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(2), requires_grad=True)
        DualFocalLoss()(logits, torch.tensor([0, 1, 2, 0])).backward()
        assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0

    @pytest.mark.parametrize("gamma", [0.5, 5.0])
    def test_confident_float32_sample_keeps_finite_gradients(self, gamma):
        logits = torch.tensor([[0.0, 40.0, -5.0], [0.0, 120.0, 0.0]], requires_grad=True)
        loss = DualFocalLoss(gamma)(logits, torch.tensor([1, 1]))
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()

    def test_errors(self):
        with pytest.raises(ConfigError, match=r"`gamma` must be >= 0, got gamma=-1\.0\."):
            DualFocalLossConfig(gamma=-1.0)
        with pytest.raises(ConfigError, match=r"`gamma` must be >= 0"):
            DualFocalLoss(-0.5)
