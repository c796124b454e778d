"""ACLS (calib/losses/acls.py)."""

import math

import pytest
import torch
from torch.nn import functional as F

from calib._config import ConfigError
from calib.losses import ACLS, ACLSConfig


class TestACLS:
    # Sample 1: z = (12, 0, 5), y = 1 (the argmax j* = 0 is *not* the label); m = 10.
    #   First term: relu(12 − 10)^2 = 4. Second term, j ≠ j*: gaps 12, 7 → relu(2)^2 = 4, relu(−3)^2 = 0.
    # Sample 2: z = (0, 1, 2), y = 2: relu(2 − 10) = 0; gaps 2, 1 → 0.
    # R = λ1 · (4 + 0)/2 + λ2 · (4 + 0)/(2 · 2) = 1 · 2 + 0.1 · 1 = 2.1; L = mean CE + λ · R = mean CE + 0.21.
    LOGITS = ((12.0, 0.0, 5.0), (0.0, 1.0, 2.0))
    TARGETS = (1, 2)

    def test_main(self):
        logits = torch.tensor(self.LOGITS, dtype=torch.float64)
        ce1 = math.log(math.exp(12) + 1 + math.exp(5)) - 0
        ce2 = math.log(1 + math.e + math.exp(2)) - 2
        loss = ACLS()(logits, torch.tensor(self.TARGETS))
        assert loss.dim() == 0 and float(loss) == pytest.approx((ce1 + ce2) / 2 + 0.21, rel=1e-12)
        cfg = ACLSConfig()
        assert (cfg.penalty_weight, cfg.pos_weight, cfg.neg_weight, cfg.margin) == (0.1, 1.0, 0.1, 10.0)

    def test_max_logit_detached_only_in_second_term(self):
        # Gradient of λ·R on sample 1 ("mean" over B = 2):
        #   first term → z_max: λ·λ1·2·(12 − 10)/B = 0.1 · 4 / 2 = 0.2;
        #   second term → z_1: λ·λ2·2·(12 − 10)·(−1)/(B(C − 1)) = −0.1 · 0.1 · 4 / 4 = −0.01,
        #   and nothing to z_max from it (it would get +0.01 if the max were not detached there).
        logits = torch.tensor(self.LOGITS, dtype=torch.float64, requires_grad=True)
        targets = torch.tensor(self.TARGETS)
        (grad,) = torch.autograd.grad(ACLS()(logits, targets), logits)
        (ce_grad,) = torch.autograd.grad(F.cross_entropy(logits, targets), logits)
        expected = torch.tensor([[0.2, -0.01, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
        torch.testing.assert_close(grad - ce_grad, expected)

    def test_no_penalty_below_margin(self):
        logits = torch.tensor([[3.0, 0.0, -2.9], [1.0, 1.0, 1.0], [-1.0, 4.0, 1.0]])
        targets = torch.tensor([1, 0, 2])
        torch.testing.assert_close(ACLS(penalty_weight=3.0)(logits, targets), F.cross_entropy(logits, targets))

    def test_sum_is_batch_size_times_mean(self):
        logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(1)) * 10
        targets = torch.tensor([0, 1, 2, 3, 0])
        torch.testing.assert_close(ACLS(reduction="sum")(logits, targets), 5 * ACLS()(logits, targets))

    def test_gradients_flow(self):
        logits = (torch.randn(4, 3, generator=torch.Generator().manual_seed(2)) * 12).requires_grad_()
        ACLS()(logits, torch.tensor([0, 1, 2, 0])).backward()
        assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0

    @pytest.mark.parametrize("key", ["penalty_weight", "pos_weight", "neg_weight", "margin"])
    def test_errors(self, key):
        with pytest.raises(ConfigError, match=rf"`{key}` must be >= 0, got {key}=-1\.0\."):
            ACLSConfig(**{key: -1.0})
        with pytest.raises(ConfigError, match=rf"`{key}` must be >= 0"):
            ACLS(**{key: -1.0})
