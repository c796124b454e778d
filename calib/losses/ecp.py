"""ECP: the confidence penalty (Pereyra, Tucker, Chorowski, Kaiser, Hinton, ICLR workshop 2017), docs/methods.md §4.11.

With p = softmax(z), the per-sample loss is cross-entropy minus β times the entropy of p:

    ECP_i = CE_i − β · H̄_i,   H̄_i = (1/C) · Σ_k −p_{i,k} · log p_{i,k}      (``entropy_reduction="mean"``)

The paper writes the full entropy H_i = Σ_k −p_{i,k} log p_{i,k} (``entropy_reduction="sum"``). FeDLaS's
ECP row is copied from the ACLS paper (FEDLAS-P Table 1, "values are from [33]"), and ACLS is built on the
MbLS code base, whose ``PenaltyEntropy`` (``calibrate/losses/penalty_entropy.py``, config
``configs/loss/penalty_ent.yaml``: α = 0.1) averages −p·log p over the batch *and the classes*, i.e. uses
H̄ = H/C; that is the default here (ASSUMPTION: ACLS's own baseline code is not public). As there, p is
clamped to [1e-10, 1 − 1e-10] inside the entropy (a clamped probability passes no gradient through it).

Batch reduction: see :mod:`calib.losses._reduction` (the MbLS code averages: ``reduction="mean"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch.nn import functional as F

from calib._config import check_fields, checked_field, number
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import reduce_per_sample

__all__ = ["ECP", "ECPConfig", "entropy_terms"]

EntropyReduction = Literal["mean", "sum"]
PROBABILITY_CLAMP = 1e-10
"""p is clamped to [1e-10, 1 − 1e-10] inside the entropy (the MbLS code's ``EPS``)."""


@dataclass(frozen=True, kw_only=True)
class ECPConfig:
    """Confidence penalty (``ecp``). Defaults: the MbLS code's ``penalty_ent.yaml`` (docs/methods.md §4.11).

    Attributes:
        penalty_weight: β, the weight of the entropy, >= 0 (0.1). β = 0 is cross-entropy.
        entropy_reduction: "mean" (H/C, the MbLS/ACLS code) or "sum" (H, the paper's formula) ("mean").
    """

    penalty_weight: float = checked_field(0.1, number(at_least=0))
    entropy_reduction: EntropyReduction = "mean"

    def __post_init__(self) -> None:
        check_fields(self)


def entropy_terms(logits: torch.Tensor, entropy_reduction: EntropyReduction = "mean") -> torch.Tensor:
    """H̄_i (``"mean"``: over the classes) or H_i (``"sum"``) per sample, shape (B,), with p clamped as above."""
    probs = F.log_softmax(logits, dim=1).exp().clamp(PROBABILITY_CLAMP, 1.0 - PROBABILITY_CLAMP)
    terms = -probs * probs.log()
    return terms.mean(dim=1) if entropy_reduction == "mean" else terms.sum(dim=1)


class ECP(ConfiguredLoss):
    """ECP_i = CE_i − β·H̄_i (or − β·H_i), reduced over the batch by ``reduction`` (see the module docstring)."""

    def __init__(self, penalty_weight: float = ECPConfig.penalty_weight,
                 entropy_reduction: EntropyReduction = ECPConfig.entropy_reduction,
                 reduction: Reduction = "mean") -> None:
        super().__init__(ECPConfig, locals())

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        ce = F.cross_entropy(logits, targets, reduction="none")
        entropy = entropy_terms(logits, self.entropy_reduction)
        return reduce_per_sample(ce - self.penalty_weight * entropy, self.reduction)


register_loss("ecp", ECPConfig, ECP, "ECP: CE − β·entropy, the confidence penalty (Pereyra et al. 2017)",
              label="ECP", order=7.1)
