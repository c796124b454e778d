"""MbLS: margin-based label smoothing (Liu, Ben Ayed, Galdran, Dolz, CVPR 2022), docs/methods.md §4.2.

With logits z, d_{i,k} = max_l z_{i,l} − z_{i,k} >= 0 (the gap to the max logit), margin m and
weight λ, the batch-mean form is

    L̄ = mean_i CE_i + λ · mean_{i,k} relu(d_{i,k} − m),

the penalty averaged over batch × classes as the code does (ACLS-R / FEDLAS-R ``mbls.py``; the
paper's formula sums over classes, which is C times larger). The gradient flows through the max
logit as well (nothing is detached). The label's own term vanishes when it is the argmax (d = 0).
Batch reduction: see :mod:`calib.losses._reduction` ("sum" = B · L̄).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from calib._config import check_fields, checked_field, in_range
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import reduce_per_sample

__all__ = ["MbLS", "MbLSConfig", "margin_penalty"]


@dataclass(frozen=True, kw_only=True)
class MbLSConfig:
    """MbLS (``mbls``). Defaults: CIFAR (ACLS/FeDLaS/BALCAL repos); Tiny-ImageNet uses m = 10.

    Attributes:
        margin: m, the tolerated logit gap, >= 0 (6.0).
        penalty_weight: λ, the weight of the margin penalty, >= 0 (0.1). λ = 0 is cross-entropy.
    """

    margin: float = checked_field(6.0, in_range(at_least=0))
    penalty_weight: float = checked_field(0.1, in_range(at_least=0))

    def __post_init__(self) -> None:
        check_fields(self)


def margin_penalty(logits: torch.Tensor, margin: float) -> torch.Tensor:
    """Per-sample (1/C) Σ_k relu(d_{i,k} − m), shape (B,), with d = max logit − logit (not detached)."""
    gaps = logits.max(dim=1, keepdim=True).values - logits
    return F.relu(gaps - margin).mean(dim=1)


class MbLS(ConfiguredLoss):
    """CE + λ · mean_{i,k} relu(max_l z_l − z_k − m), reduced by ``reduction`` (see the module docstring)."""

    def __init__(self, margin: float = MbLSConfig.margin, penalty_weight: float = MbLSConfig.penalty_weight,
                 reduction: Reduction = "mean") -> None:
        super().__init__(MbLSConfig, locals())

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        ce = F.cross_entropy(logits, targets, reduction="none")
        per_sample = ce + self.penalty_weight * margin_penalty(logits, self.margin)
        return reduce_per_sample(per_sample, self.reduction)


register_loss("mbls", MbLSConfig, MbLS, "MbLS: CE + λ·mean relu(logit gap − m) (Liu et al., CVPR 2022)",
              label="MbLS", order=5)
