"""Label smoothing (calib/losses/label_smoothing.py)."""

import math

import pytest
import torch
from torch.nn import functional as F

from calib._config import ConfigError
from calib.losses import LabelSmoothing, LabelSmoothingConfig

LN2 = math.log(2)


class TestLabelSmoothing:
    def test_main(self):
        # Sample 1: logits (ln 2, 0, 0) → p = (1/2, 1/4, 1/4), y = 0: CE = ln 2,
        #   E = −(1/3)(ln 1/2 + 2 ln 1/4) = (1/3)(ln 2 + 4 ln 2) = (5/3) ln 2.
        # Sample 2: logits (0, 0, ln 2) → p = (1/4, 1/4, 1/2), y = 0: CE = ln 4 = 2 ln 2, E = (5/3) ln 2.
        # α = 0.1: LS_1 = 0.9 ln 2 + (1/6) ln 2, LS_2 = 1.8 ln 2 + (1/6) ln 2.
        logits = torch.tensor([[LN2, 0.0, 0.0], [0.0, 0.0, LN2]], dtype=torch.float64)
        targets = torch.tensor([0, 0])
        expected = ((0.9 + 1 / 6) * LN2 + (1.8 + 1 / 6) * LN2) / 2
        loss = LabelSmoothing(0.1)(logits, targets)
        assert loss.dim() == 0 and loss.dtype == torch.float64
        assert float(loss) == pytest.approx(expected, rel=1e-12)

    def test_default_is_0_05(self):
        # Sample 1 above alone, α = 0.05: 0.95 ln 2 + 0.05 (5/3) ln 2.
        logits = torch.tensor([[LN2, 0.0, 0.0]], dtype=torch.float64)
        expected = 0.95 * LN2 + 0.05 * (5 / 3) * LN2
        assert float(LabelSmoothing()(logits, torch.tensor([0]))) == pytest.approx(expected, rel=1e-12)
        assert LabelSmoothingConfig().smoothing == 0.05

    def test_zero_smoothing_is_cross_entropy(self):
        logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
        targets = torch.tensor([0, 1, 2, 3, 0, 1])
        torch.testing.assert_close(LabelSmoothing(0.0)(logits, targets), F.cross_entropy(logits, targets))

    def test_sum_is_batch_size_times_mean(self):
        logits = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
        targets = torch.tensor([0, 1, 2, 1, 0])
        mean = LabelSmoothing(0.2, reduction="mean")(logits, targets)
        total = LabelSmoothing(0.2, reduction="sum")(logits, targets)
        torch.testing.assert_close(total, 5 * mean)

    def test_gradients_flow(self):
        logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(2), requires_grad=True)
        LabelSmoothing(0.1)(logits, torch.tensor([0, 1, 2, 0])).backward()
        assert logits.grad is not None and torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0

    @pytest.mark.parametrize("value", [-0.1, 1.0, 1.2])
    def test_errors(self, value):
        with pytest.raises(ConfigError, match=rf"`smoothing` must be in \[0, 1\), got smoothing={value}\."):
            LabelSmoothingConfig(smoothing=value)
        with pytest.raises(ConfigError, match=r"`smoothing` must be in \[0, 1\)"):
            LabelSmoothing(value)
        with pytest.raises(ConfigError, match=r"`reduction` must be 'mean' or 'sum', got reduction='none'\."):
            LabelSmoothing(0.1, reduction="none")
