"""CPC (calib/losses/cpc.py) against BALCAL-R's ``CPCLoss`` formula, reconstructed here element by element.

What is checked against what: BALCAL-R ``src/utils/losses.py`` ``CPCLoss(lambd_bdc=0.1, lambd_bec=1.0)`` (the
configuration behind the MaC-Cal seed's CPC row) computes mean CE + λ_bdc·BDC + λ_bec·BEC with
BDC = −Σ_i Σ_{j≠y_i} log σ(z_iy − z_ij) / (C−1) / B and
BEC = −Σ_i Σ_{j≠y_i} Σ_{k≠y_i} ½·log σ(z_ij − z_ik + 1e-10) / (C−1) / (C−2) / B (j = k included). The reference
below writes those sums as explicit Python loops over scalars (torch ops, so autograd gives the reference
gradient); calib's vectorised loss must match its value and its gradient to 1e-6.
"""

import math

import pytest
import torch

from calib._config import ConfigError
from calib.losses import CPC, LOSSES, CPCConfig
from calib.losses.cpc import pairwise_constraints


def official_formula(logits, targets, bdc_weight=0.1, bec_weight=1.0):
    """BALCAL-R CPCLoss, one scalar term at a time."""
    batch, classes = logits.shape
    ce = bdc = bec = logits.new_zeros(())
    for i in range(batch):
        y = int(targets[i])
        ce = ce - torch.log_softmax(logits[i], 0)[y]
        rest = [j for j in range(classes) if j != y]
        for j in rest:
            bdc = bdc - torch.nn.functional.logsigmoid(logits[i, y] - logits[i, j])
            for k in rest:
                bec = bec - 0.5 * torch.nn.functional.logsigmoid(logits[i, j] - logits[i, k] + 1e-10)
    ce = ce / batch
    bdc = bdc / (classes - 1) / batch
    bec = bec / (classes - 1) / (classes - 2) / batch
    return ce + bdc_weight * bdc + bec_weight * bec


def test_hand_computed_three_classes():
    # z = (2, 0, 0), y = 0: CE = log(e² + 2) − 2; BDC = 2·log(1 + e⁻²)/2; BEC = −(4·½·log σ(ε))/2 = log 2 (ε → 0).
    logits, targets = torch.tensor([[2.0, 0.0, 0.0]], dtype=torch.float64), torch.tensor([0])
    bdc, bec = pairwise_constraints(logits, targets)
    assert float(bdc) == pytest.approx(math.log1p(math.exp(-2)), rel=1e-12)
    assert float(bec) == pytest.approx(math.log(2), rel=1e-9)
    expected = math.log(math.exp(2) + 2) - 2 + 0.1 * math.log1p(math.exp(-2)) + math.log(2)
    assert float(CPC(num_classes=3)(logits, targets)) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("weights", [(0.1, 1.0), (0.5, 0.3)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_value_and_gradient_match_official_formula(seed, weights):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(6, 5, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    targets = torch.randint(0, 5, (6,), generator=gen)
    reference = official_formula(logits, targets, *weights)
    (expected_grad,) = torch.autograd.grad(reference, logits)
    loss = CPC(*weights, num_classes=5)(logits, targets)
    (grad,) = torch.autograd.grad(loss, logits)
    assert float(loss) == pytest.approx(float(reference), abs=1e-6)
    torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=0)


def test_sum_reduction_is_batch_times_mean():
    gen = torch.Generator().manual_seed(3)
    logits, targets = torch.randn(7, 4, generator=gen, dtype=torch.float64), torch.randint(0, 4, (7,), generator=gen)
    mean = CPC(num_classes=4)(logits, targets)
    assert float(CPC(num_classes=4, reduction="sum")(logits, targets)) == pytest.approx(7 * float(mean), rel=1e-12)


def test_defaults_and_registry():
    cfg = CPCConfig()
    assert (cfg.discrimination_weight, cfg.exclusion_weight) == (0.1, 1.0)
    spec = LOSSES.get("cpc")
    assert spec.label == "CPC"
    assert isinstance(spec.create(cfg, num_classes=10, reduction="sum"), CPC)


def test_bad_input_names_key_and_rule():
    with pytest.raises(ConfigError, match=r"`exclusion_weight` must be >= 0, got exclusion_weight=-1"):
        CPCConfig(exclusion_weight=-1.0)
    with pytest.raises(ConfigError, match=r"`num_classes` must be >= 3 for the CPC loss"):
        LOSSES.get("cpc").create(CPCConfig(), num_classes=2, reduction="mean")
