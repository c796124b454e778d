"""CPC: calibration by pairwise constraints (Cheng & Vasconcelos, CVPR 2022), docs/methods.md §4.10.

With logits z of B samples over C classes, the label y_i and its complement R_i = {j ≠ y_i} (C − 1 classes),
σ the logistic function and ε = 1e-10, the batch-mean form is

    L̄ = mean_i CE_i + λ_bdc · BDC + λ_bec · BEC

    BDC = −1/(B·(C−1))        · Σ_i Σ_{j ∈ R_i}            log σ(z_{i,y_i} − z_{i,j})
    BEC = −1/(B·(C−1)·(C−2))  · Σ_i Σ_{j ∈ R_i} Σ_{k ∈ R_i} ½ · log σ(z_{i,j} − z_{i,k} + ε)

BDC, the one-vs-one *binary discrimination* constraints, asks the label's logit to beat each other one; BEC,
the *binary exclusion* constraints, asks every pair of non-label classes to be indistinguishable (each ordered
pair (j, k) and (k, j) once, so log σ(a) + log σ(−a) is maximal at a = 0). As in BALCAL-R ``CPCLoss``
(``src/utils/losses.py``), which the MaC-Cal seed ran, the sum over (j, k) includes j = k: those C − 1 terms
are the constant ½·log σ(ε) ≈ −½·log 2 each (no gradient), kept so the value is the official one. BEC needs
C >= 3 (it divides by C − 2). Batch reduction: see :mod:`calib.losses._reduction` ("sum" = B · L̄).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from calib._config import check, check_fields, checked_field, in_range
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import scale_batch_mean

__all__ = ["CPC", "CPCConfig", "pairwise_constraints"]

EXCLUSION_EPS = 1e-10
"""ε inside BEC's log σ(z_j − z_k + ε), as BALCAL-R."""


@dataclass(frozen=True, kw_only=True)
class CPCConfig:
    """CE + λ_bdc·BDC + λ_bec·BEC (``cpc``). Defaults: BALCAL-R ``CPCLoss(lambd_bdc=0.1, lambd_bec=1.0)``, the
    configuration the MaC-Cal seed's CPC row was run with.

    Attributes:
        discrimination_weight: λ_bdc, the weight of the binary discrimination constraints, >= 0 (0.1).
        exclusion_weight: λ_bec, the weight of the binary exclusion constraints, >= 0 (1.0).
    """

    discrimination_weight: float = checked_field(0.1, in_range(at_least=0))
    exclusion_weight: float = checked_field(1.0, in_range(at_least=0))

    def __post_init__(self) -> None:
        check_fields(self)


def pairwise_constraints(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(BDC, BEC) of the batch, scalars as in the module docstring."""
    batch, num_classes = logits.shape
    is_label = F.one_hot(targets, num_classes).bool()
    label_logit = logits[is_label].view(batch, 1)
    others = logits[~is_label].view(batch, num_classes - 1)  # each row's non-label logits, in class order
    bdc = -F.logsigmoid(label_logit - others).sum() / (batch * (num_classes - 1))
    differences = others[:, :, None] - others[:, None, :] + EXCLUSION_EPS
    bec = -0.5 * F.logsigmoid(differences).sum() / (batch * (num_classes - 1) * (num_classes - 2))
    return bdc, bec


class CPC(ConfiguredLoss):
    """mean CE + λ_bdc·BDC + λ_bec·BEC, reduced by ``reduction`` (see the module docstring)."""

    def __init__(self, discrimination_weight: float = CPCConfig.discrimination_weight,
                 exclusion_weight: float = CPCConfig.exclusion_weight, *, num_classes: int,
                 reduction: Reduction = "mean") -> None:
        super().__init__(CPCConfig, locals())
        check(num_classes >= 3, "num_classes", num_classes,
              "be >= 3 for the CPC loss (its exclusion constraints compare pairs of non-label classes)")

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        bdc, bec = pairwise_constraints(logits, targets)
        mean_loss = F.cross_entropy(logits, targets) + self.discrimination_weight * bdc + self.exclusion_weight * bec
        return scale_batch_mean(mean_loss, logits.shape[0], self.reduction)


register_loss("cpc", CPCConfig, CPC,
              "CPC: CE + binary discrimination and exclusion constraints (Cheng & Vasconcelos, CVPR 2022)",
              label="CPC", order=7.5)  # after MMCE, before the FeDLaS rows: MaC-Cal Table 1 lists CPC with them
