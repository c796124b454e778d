"""CE + λ·MMCE (calib/losses/mmce.py)."""

import math

import pytest
import torch
from torch.nn import functional as F

from calib._config import ConfigError
from calib.losses import MMCE, MMCEConfig
from calib.losses.mmce import mmce_penalty

# Three samples, three classes, kernel width 0.4:
#   A: p = (1/2, 1/4, 1/4), y = 0 → correct,   r = 1/2
#   B: p = (2/3, 1/6, 1/6), y = 0 → correct,   r = 2/3
#   C: p = (1/2, 1/4, 1/4), y = 1 → incorrect, r = 1/2
# k(1/2, 1/2) = 1, k(1/2, 2/3) = exp(−(1/6)/0.4) = exp(−5/12) =: K.
PROBS = [[0.5, 0.25, 0.25], [2 / 3, 1 / 6, 1 / 6], [0.5, 0.25, 0.25]]
TARGETS = [0, 0, 1]
K = math.exp(-5 / 12)
CE = (math.log(2) + math.log(1.5) + math.log(4)) / 3

# MMCE_w, m = 2 correct (weights 1 − r = 1/2, 1/3), n = 1 incorrect (weight r = 1/2):
#   correct pairs: mean of [1/4, K/6; K/6, 1/9] = (1/4 + 1/9 + K/3)/4, divided by m² = 4;
#   incorrect pairs: mean of [1/4] = 1/4, divided by n² = 1;
#   cross pairs: mean of [1/2·1/2·1, 1/3·1/2·K] = (1/4 + K/6)/2, times 2/(m·n) = 1.
WEIGHTED = math.sqrt((1 / 4 + 1 / 9 + K / 3) / 4 / 4 + 1 / 4 - (1 / 4 + K / 6) / 2)
# MMCE_m: c − r = (1/2, 1/3, −1/2); Σ_ij = 1/4 + 1/9 + 1/4 + 2·(1/6)K − 2·(1/4) − 2·(1/6)K = 1/9; / B² = 1/81.
UNWEIGHTED = 1 / 81


def logits_for(probs):
    return torch.tensor(probs, dtype=torch.float64).log()


def brute_force(logits, targets, variant, width=0.4):
    """MMCE by explicit double loops in float64 (docs/methods.md §4.7, FOCAL-R normalisation)."""
    probs = torch.softmax(logits.double(), dim=1).tolist()
    r = [max(row) for row in probs]
    c = [float(row.index(max(row)) == int(t)) for row, t in zip(probs, targets, strict=True)]

    def k(a, b):
        return math.exp(-abs(a - b) / width)

    if variant == "unweighted":
        total = sum((c[i] - r[i]) * (c[j] - r[j]) * k(r[i], r[j]) for i in range(len(r)) for j in range(len(r)))
        return total / len(r) ** 2
    cor = [r[i] for i in range(len(r)) if c[i] == 1.0]
    inc = [r[i] for i in range(len(r)) if c[i] == 0.0]
    m, n = len(cor), len(inc)
    if m == 0 or n == 0:
        return 0.0
    cc = sum((1 - a) * (1 - b) * k(a, b) for a in cor for b in cor) / (m * m)
    ii = sum(a * b * k(a, b) for a in inc for b in inc) / (n * n)
    ci = sum((1 - a) * b * k(a, b) for a in cor for b in inc) / (m * n)
    return math.sqrt(cc / m**2 + ii / n**2 - 2 * ci / (m * n))


class TestMMCE:
    def test_main(self):
        logits, targets = logits_for(PROBS), torch.tensor(TARGETS)
        loss = MMCE()(logits, targets)
        assert loss.dim() == 0 and loss.dtype == torch.float64
        assert float(loss) == pytest.approx(CE + 2.0 * WEIGHTED, rel=1e-12)
        cfg = MMCEConfig()
        assert (cfg.penalty_weight, cfg.variant, cfg.kernel_width) == (2.0, "weighted", 0.4)

    def test_unweighted(self):
        logits, targets = logits_for(PROBS), torch.tensor(TARGETS)
        assert float(mmce_penalty(logits, targets, variant="unweighted")) == pytest.approx(UNWEIGHTED, rel=1e-12)
        loss = MMCE(penalty_weight=1.0, variant="unweighted")(logits, targets)
        assert float(loss) == pytest.approx(CE + UNWEIGHTED, rel=1e-12)

    @pytest.mark.parametrize("variant", ["weighted", "unweighted"])
    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_matches_brute_force(self, variant, seed):
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(12, 5, generator=gen, dtype=torch.float64) * 2
        targets = torch.randint(0, 5, (12,), generator=gen)
        expected = brute_force(logits, targets, variant, width=0.3)
        got = mmce_penalty(logits, targets, variant=variant, kernel_width=0.3)
        assert float(got) == pytest.approx(expected, rel=1e-10, abs=1e-12)

    def test_zero_without_correct_or_incorrect_samples(self):
        logits = torch.tensor([[3.0, 0.0, 1.0], [0.0, 2.0, 1.0], [0.5, 0.0, 2.5]], requires_grad=True)
        correct, wrong = torch.tensor([0, 1, 2]), torch.tensor([1, 0, 0])
        for targets in (correct, wrong):
            assert float(mmce_penalty(logits, targets)) == 0.0
            torch.testing.assert_close(MMCE()(logits, targets), F.cross_entropy(logits, targets))
        # The unweighted form is not 0 on an all-correct batch: (1/B²) Σ (1 − r_i)(1 − r_j) k.
        assert float(mmce_penalty(logits.detach(), correct, variant="unweighted")) > 0

    def test_sum_is_batch_size_times_mean(self):
        gen = torch.Generator().manual_seed(3)
        logits, targets = torch.randn(8, 4, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        for variant in ("weighted", "unweighted"):
            torch.testing.assert_close(MMCE(variant=variant, reduction="sum")(logits, targets),
                                       8 * MMCE(variant=variant)(logits, targets))

    def test_gradients_flow_through_the_penalty(self):
        logits = logits_for(PROBS).requires_grad_()
        targets = torch.tensor(TARGETS)
        (grad,) = torch.autograd.grad(MMCE()(logits, targets), logits)
        (ce_grad,) = torch.autograd.grad(F.cross_entropy(logits, targets), logits)
        assert torch.isfinite(grad).all() and (grad - ce_grad).abs().max() > 1e-3

    @pytest.mark.parametrize(("kwargs", "message"), [
        ({"penalty_weight": -1.0}, r"`penalty_weight` must be >= 0, got penalty_weight=-1\.0\."),
        ({"kernel_width": 0.0}, r"`kernel_width` must be > 0, got kernel_width=0\.0\."),
        ({"variant": "both"}, r"`variant` must be one of 'weighted', 'unweighted', got variant='both'\."),
    ])
    def test_errors(self, kwargs, message):
        with pytest.raises(ConfigError, match=message):
            MMCEConfig(**kwargs)
        with pytest.raises(ConfigError, match=message):
            MMCE(**kwargs)
