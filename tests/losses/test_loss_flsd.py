"""FLSD-53 (calib/losses/flsd.py)."""

import math

import pytest
import torch

from calib._config import ConfigError
from calib.losses import FLSD53, FLSD53Config, FocalLoss

LN2 = math.log(2)


def logits_for(probs):
    """Logits whose softmax is ``probs`` (rows)."""
    return torch.tensor(probs, dtype=torch.float64).log()


class TestFLSD53:
    def test_main(self):
        # Sample 1: p = (1/2, 1/4, 1/4), y = 0 → p_y = 1/2 >= 0.2 → γ = 3: (1/2)^3 · ln 2.
        # Sample 2: p = (0.1, 0.45, 0.45), y = 0 → p_y = 0.1 < 0.2 → γ = 5: 0.9^5 · ln 10.
        logits = logits_for([[0.5, 0.25, 0.25], [0.1, 0.45, 0.45]])
        targets = torch.tensor([0, 0])
        expected = (LN2 / 8 + 0.9**5 * math.log(10)) / 2
        loss = FLSD53()(logits, targets)
        assert loss.dim() == 0 and float(loss) == pytest.approx(expected, rel=1e-12)
        assert (FLSD53Config().gamma, FLSD53Config().gamma_low) == (3.0, 5.0)

    def test_gamma_switches_at_0_2(self):
        # p_y = 0.19 (below: γ = 5), 0.21 (above: γ = 3), 0.6 (above: γ = 3), built on both sides of 0.2.
        logits = logits_for([[0.19, 0.41, 0.40], [0.21, 0.39, 0.40], [0.6, 0.3, 0.1]]).requires_grad_()
        targets = torch.tensor([0, 0, 0])
        loss_fn = FLSD53(reduction="sum")
        assert loss_fn.sample_gamma(logits, targets).tolist() == [5.0, 3.0, 3.0]
        # 0.81^5·ln(1/0.19) + 0.79^3·ln(1/0.21) + 0.4^3·ln(1/0.6)
        expected = 0.81**5 * -math.log(0.19) + 0.79**3 * -math.log(0.21) + 0.4**3 * -math.log(0.6)
        loss = loss_fn(logits, targets)
        assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
        # Same gradients as per-sample focal losses with those γ: no gradient through the choice of γ.
        (grad,) = torch.autograd.grad(loss, logits)
        reference = FocalLoss(5.0, "sum")(logits[:1], targets[:1]) + FocalLoss(3.0, "sum")(logits[1:], targets[1:])
        (ref_grad,) = torch.autograd.grad(reference, logits)
        torch.testing.assert_close(grad, ref_grad)

    def test_both_gammas_are_configurable(self):
        logits = logits_for([[0.1, 0.45, 0.45], [0.5, 0.25, 0.25]])
        assert FLSD53(gamma=2.0, gamma_low=7.0).sample_gamma(logits, torch.tensor([0, 0])).tolist() == [7.0, 2.0]

    def test_sum_is_batch_size_times_mean(self):
        logits = torch.randn(6, 3, generator=torch.Generator().manual_seed(1)) * 3
        targets = torch.tensor([0, 1, 2, 1, 0, 2])
        torch.testing.assert_close(FLSD53(reduction="sum")(logits, targets), 6 * FLSD53()(logits, targets))

    def test_gradients_flow(self):
        logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(2), requires_grad=True)
        FLSD53()(logits, torch.tensor([0, 1, 2, 0])).backward()
        assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0

    @pytest.mark.parametrize(("key", "kwargs"), [("gamma", {"gamma": -1.0}), ("gamma_low", {"gamma_low": -2.0})])
    def test_errors(self, key, kwargs):
        value = next(iter(kwargs.values()))
        with pytest.raises(ConfigError, match=rf"`{key}` must be >= 0, got {key}={value}\."):
            FLSD53Config(**kwargs)
        with pytest.raises(ConfigError, match=rf"`{key}` must be >= 0"):
            FLSD53(**kwargs)
