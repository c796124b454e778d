"""ACLS: adaptive and conditional label smoothing (Park, Noh, Oh, Kim, Ham, ICCV 2023), docs/methods.md §4.3.

With logits z (B samples, C classes), z_max,i the max logit of sample i and j*_i its argmax (the
argmax, *not* the label), margin m, sg[·] a stop-gradient, the regulariser is

    R = λ1 · (1/B)·Σ_i relu(z_max,i − m)²
      + λ2 · (1/(B(C−1)))·Σ_i Σ_{j≠j*_i} relu(sg[z_max,i] − z_{i,j} − m)²

and the batch-mean form is L̄ = mean_i CE_i + λ·R (ACLS-R ``calibrate/losses/acls.py``; the same
code is FEDLAS-R ``acls.py``). The max logit gets a gradient from the first term (pushed down once
it exceeds m) but not from the second. Batch reduction: see :mod:`calib.losses._reduction`
("sum" = B · L̄).

Ties: ACLS-R marks *every* class equal to the max as a "positive" (so a tied max counts twice in
the first term); here j* is the single index ``torch.max`` returns, as docs/methods.md §4.3 writes it.
A tied runner-up then contributes relu(0 − m)² = 0 to the second term, so only exact logit ties,
which float training never produces in practice, can tell the two apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from calib._config import check_fields, checked_field, in_range
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import reduce_per_sample

__all__ = ["ACLS", "ACLSConfig", "acls_regularizer"]


@dataclass(frozen=True, kw_only=True)
class ACLSConfig:
    """ACLS (``acls``). Defaults: ACLS-R ``configs/loss/acls.yaml``, also used by FEDLAS-R/BALCAL-R on CIFAR.

    Attributes:
        penalty_weight: λ (ACLS-R ``alpha``), the weight of R, >= 0 (0.1). λ = 0 is cross-entropy.
        pos_weight: λ1 (``pos_lambda``), the weight of the max-logit term, >= 0 (1.0).
        neg_weight: λ2 (``neg_lambda``), the weight of the logit-gap term, >= 0 (0.1).
        margin: m, >= 0 (10.0).
    """

    penalty_weight: float = checked_field(0.1, in_range(at_least=0))
    pos_weight: float = checked_field(1.0, in_range(at_least=0))
    neg_weight: float = checked_field(0.1, in_range(at_least=0))
    margin: float = checked_field(10.0, in_range(at_least=0))

    def __post_init__(self) -> None:
        check_fields(self)


def acls_regularizer(
    logits: torch.Tensor, *, pos_weight: float, neg_weight: float, margin: float
) -> torch.Tensor:
    """Per-sample R_i, shape (B,), with mean_i R_i = R of the module docstring; needs C >= 2."""
    num_classes = logits.shape[1]
    max_logit, argmax = logits.max(dim=1)
    pos = F.relu(max_logit - margin).square()
    neg = F.relu(max_logit.detach()[:, None] - logits - margin).square()
    neg = neg.scatter(1, argmax[:, None], 0.0).sum(dim=1) / (num_classes - 1)
    return pos_weight * pos + neg_weight * neg


class ACLS(ConfiguredLoss):
    """CE + λ·R with the ACLS regulariser R, reduced by ``reduction`` (see the module docstring)."""

    def __init__(self, penalty_weight: float = ACLSConfig.penalty_weight, pos_weight: float = ACLSConfig.pos_weight,
                 neg_weight: float = ACLSConfig.neg_weight, margin: float = ACLSConfig.margin,
                 reduction: Reduction = "mean") -> None:
        super().__init__(ACLSConfig, locals())

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        ce = F.cross_entropy(logits, targets, reduction="none")
        reg = acls_regularizer(logits, pos_weight=self.pos_weight, neg_weight=self.neg_weight, margin=self.margin)
        return reduce_per_sample(ce + self.penalty_weight * reg, self.reduction)


register_loss("acls", ACLSConfig, ACLS, "ACLS: CE + λ·(max-logit and logit-gap penalties) (Park et al., ICCV 2023)",
              label="ACLS", order=6)
