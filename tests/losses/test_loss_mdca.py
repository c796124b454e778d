"""MDCA (calib/losses/mdca.py).

Reference: MDCA-R (``mdca-loss/MDCA-Calibration``, ``solvers/loss.py``: ``MDCA`` and ``ClassficationAndMDCA``),
reconstructed below from its formula, not copied: a loop over the classes of |mean_i p_ic − mean_i 1[y_i = c]|,
divided by C, added with weight β to the mean cross-entropy ("NLL+MDCA") or to the mean focal loss with
p_t = exp(log p_t) ("FL+MDCA"). Checked: value and gradient on seeded float64 logits to 1e-6 (in fact to
rounding), and a hand-computed case.
"""

import math

import pytest
import torch

from calib._config import ConfigError
from calib.losses import LOSSES, MDCA, MDCAConfig


def reference_mdca(logits: torch.Tensor, targets: torch.Tensor, beta: float, base: str = "nll",
                   gamma: float = 1.0) -> torch.Tensor:
    probs = torch.softmax(logits, dim=1)
    classes = logits.shape[1]
    penalty = logits.new_zeros(())
    for c in range(classes):
        penalty = penalty + torch.abs(probs[:, c].mean() - (targets == c).to(logits.dtype).mean())
    penalty = penalty / classes
    log_pt = torch.log_softmax(logits, dim=1).gather(1, targets[:, None]).view(-1)
    if base == "nll":
        classification = -log_pt.mean()
    else:
        classification = (-(1 - log_pt.exp()) ** gamma * log_pt).mean()
    return classification + beta * penalty


def seeded(batch=32, classes=10, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, classes, generator=generator, dtype=torch.float64) * 3).requires_grad_()
    return logits, torch.randint(0, classes, (batch,), generator=generator)


@pytest.mark.parametrize(("beta", "base", "gamma"), [(1.0, "nll", 1.0), (5.0, "nll", 1.0), (1.0, "focal", 1.0),
                                                     (10.0, "focal", 3.0)])
def test_value_and_gradient_match_the_reference(beta, base, gamma):
    logits, targets = seeded()
    loss = MDCA(beta, base, gamma)(logits, targets)
    reference = reference_mdca(logits, targets, beta, base, gamma)
    assert float(loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-12)
    (grad,) = torch.autograd.grad(loss, logits)
    (ref_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=0)


def test_hand_computed_case():
    # Two samples, two classes: p = (0.8, 0.2) and (0.4, 0.6), labels 0 and 0 → mean p = (0.6, 0.4), frequency
    # (1, 0): MDCA = (|0.6 − 1| + |0.4 − 0|) / 2 = 0.4; CE = −(ln 0.8 + ln 0.4) / 2.
    logits = torch.tensor([[0.8, 0.2], [0.4, 0.6]], dtype=torch.float64).log()
    targets = torch.tensor([0, 0])
    ce = -(math.log(0.8) + math.log(0.4)) / 2
    assert float(MDCA(1.0)(logits, targets)) == pytest.approx(ce + 0.4, rel=1e-12)
    assert float(MDCA(2.0, reduction="sum")(logits, targets)) == pytest.approx(2 * (ce + 0.8), rel=1e-12)


def test_defaults_and_registration():
    default = MDCAConfig()
    assert (default.penalty_weight, default.base, default.gamma) == (1.0, "nll", 1.0)
    assert LOSSES.get("mdca").label == "MDCA"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"penalty_weight": float("nan")}, r"`penalty_weight` must be a finite number >= 0"),
    ({"base": "ls"}, r"`base` must be one of 'nll', 'focal', got base='ls'"),
    ({"gamma": -1.0}, r"`gamma` must be a finite number >= 0, got gamma=-1\.0"),
])
def test_bad_config_names_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        MDCAConfig(**kwargs)
