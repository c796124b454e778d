"""ECP, the confidence penalty (calib/losses/ecp.py).

Reference: the MbLS code's ``PenaltyEntropy`` (``by-liu/MbLS``, ``calibrate/losses/penalty_entropy.py``, the code
base of ACLS, whose ECP numbers FeDLaS Table 1 copies), reconstructed below from its formula, not copied:
mean cross-entropy minus α times −p·log p averaged over the batch and the classes, p clamped to [1e-10, 1 − 1e-10].
Checked: value and gradient on seeded float64 logits to 1e-6 (in fact to rounding); Pereyra et al.'s full-entropy
form; a hand-computed case.
"""

import math

import pytest
import torch

from calib._config import ConfigError
from calib.losses import ECP, LOSSES, ECPConfig


def reference_penalty_entropy(logits: torch.Tensor, targets: torch.Tensor, alpha: float) -> torch.Tensor:
    """MbLS ``PenaltyEntropy`` as published: CE(mean) − α · mean_{i,k}(−p_ik log p_ik), written sample by sample."""
    batch, classes = logits.shape
    ce, entropy = logits.new_zeros(()), logits.new_zeros(())
    for i in range(batch):
        log_z = torch.logsumexp(logits[i], dim=0)
        ce = ce + (log_z - logits[i, targets[i]])
        for k in range(classes):
            p = torch.exp(logits[i, k] - log_z).clamp(1e-10, 1 - 1e-10)
            entropy = entropy - p * torch.log(p)
    return ce / batch - alpha * entropy / (batch * classes)


def seeded(batch=16, classes=10, seed=0, scale=4.0):
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, classes, generator=generator, dtype=torch.float64) * scale).requires_grad_()
    return logits, torch.randint(0, classes, (batch,), generator=generator)


@pytest.mark.parametrize("alpha", [0.1, 1.0])
def test_value_and_gradient_match_the_reference(alpha):
    logits, targets = seeded()
    loss = ECP(alpha)(logits, targets)
    reference = reference_penalty_entropy(logits, targets, alpha)
    assert float(loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-12)
    (grad,) = torch.autograd.grad(loss, logits)
    (ref_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=0)


def test_full_entropy_is_the_papers_form_and_sum_is_batch_times_mean():
    logits, targets = seeded(seed=1)
    # Pereyra et al.: CE − β·H with H = Σ_k −p log p (= C × the class mean)
    paper = ECP(0.1, entropy_reduction="sum")(logits, targets)
    torch.testing.assert_close(paper, reference_penalty_entropy(logits, targets, 0.1 * 10))
    torch.testing.assert_close(ECP(0.1, reduction="sum")(logits, targets), 16 * ECP(0.1)(logits, targets))


def test_hand_computed_uniform_case():
    # Uniform logits over C = 4: CE = ln 4, (1/C)·H = (1/4)·ln 4 → 0.1 penalty: ln 4 − 0.1 · ln 4 / 4.
    logits = torch.zeros(3, 4, dtype=torch.float64)
    loss = ECP(0.1)(logits, torch.tensor([0, 1, 3]))
    assert float(loss) == pytest.approx(math.log(4) * (1 - 0.1 / 4), rel=1e-14)
    assert float(ECP(0.0)(logits, torch.tensor([0, 1, 3]))) == pytest.approx(math.log(4), rel=1e-14)


def test_defaults_and_registration():
    assert (ECPConfig().penalty_weight, ECPConfig().entropy_reduction) == (0.1, "mean")
    spec = LOSSES.get("ecp")
    assert spec.label == "ECP" and spec.config is ECPConfig


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"penalty_weight": -0.1}, r"`penalty_weight` must be a finite number >= 0, got penalty_weight=-0\.1"),
    ({"entropy_reduction": "max"}, r"`entropy_reduction` must be one of 'mean', 'sum', got entropy_reduction='max'"),
])
def test_bad_config_names_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ECPConfig(**kwargs)
