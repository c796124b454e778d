"""MDCA: multi-class difference in confidence and accuracy (Hebbalaguppe, Prakash, Madan, Arora, CVPR 2022),
docs/methods.md §4.12.

A batch-level regulariser added to a classification loss. With p = softmax(z), B samples and C classes:

    MDCA = (1/C) · Σ_c | (1/B)·Σ_i p_{i,c} − (1/B)·Σ_i 1[y_i = c] |

    L̄ = mean_i ℓ_i + β · MDCA,   ℓ = CE (``base="nll"``, "NLL+MDCA") or focal −(1 − p_y)^γ·log p_y
                                   (``base="focal"``, "FL+MDCA")

The gradient flows through the mean probabilities; the label frequencies are constants. Source: MDCA-R
(``mdca-loss/MDCA-Calibration``, ``solvers/loss.py``: ``MDCA``, ``ClassficationAndMDCA``); defaults from its
README and ``scripts/cifar10.sh`` ("NLL+MDCA --beta 1.0"; "FL+MDCA --gamma 1.0 --beta 1.0"). FeDLaS's MDCA row is
copied from the ACLS paper, which does not say which variant it ran: NLL+MDCA with β = 1 is the default here
(ASSUMPTION). Batch reduction: see :mod:`calib.losses._reduction` (MDCA-R averages: ``reduction="mean"``;
"sum" is B · L̄).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch.nn import functional as F

from calib._config import check_fields, checked_field, number
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import scale_batch_mean
from calib.losses.focal import focal_terms

__all__ = ["MDCA", "MDCAConfig", "mdca_penalty"]

MDCABase = Literal["nll", "focal"]


@dataclass(frozen=True, kw_only=True)
class MDCAConfig:
    """Classification loss + β·MDCA (``mdca``). Defaults: MDCA-R's "NLL+MDCA --beta 1.0" (docs/methods.md §4.12).

    Attributes:
        penalty_weight: β, the weight of MDCA, >= 0 (1.0).
        base: the classification loss, "nll" (cross-entropy) or "focal" ("nll").
        gamma: the focal γ when ``base="focal"``, >= 0 (1.0, MDCA-R's FL+MDCA); unused with "nll".
    """

    penalty_weight: float = checked_field(1.0, number(at_least=0))
    base: MDCABase = "nll"
    gamma: float = checked_field(1.0, number(at_least=0))

    def __post_init__(self) -> None:
        check_fields(self)


def mdca_penalty(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """MDCA of the batch: the class mean of |mean_i p_{i,c} − frequency of c in the batch's labels|."""
    probs = F.softmax(logits, dim=1)
    frequency = F.one_hot(targets, logits.shape[1]).to(probs.dtype).mean(dim=0)
    return (probs.mean(dim=0) - frequency).abs().mean()


class MDCA(ConfiguredLoss):
    """mean_i ℓ_i + β·MDCA (ℓ = CE or focal), reduced by ``reduction`` (see the module docstring)."""

    def __init__(self, penalty_weight: float = MDCAConfig.penalty_weight, base: MDCABase = MDCAConfig.base,
                 gamma: float = MDCAConfig.gamma, reduction: Reduction = "mean") -> None:
        super().__init__(MDCAConfig, locals())

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.base == "nll":
            classification = F.cross_entropy(logits, targets)
        else:
            classification = focal_terms(logits, targets, self.gamma).mean()
        loss = classification + self.penalty_weight * mdca_penalty(logits, targets)
        return scale_batch_mean(loss, logits.shape[0], self.reduction)


register_loss("mdca", MDCAConfig, MDCA,
              "MDCA: CE + β·(class mean of |mean probability − label frequency|) (Hebbalaguppe et al. 2022)",
              label="MDCA", order=7.2)
