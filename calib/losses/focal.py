"""Focal loss (Lin et al., ICCV 2017; for calibration: Mukhoti et al., NeurIPS 2020), docs/methods.md §4.4.

With p = softmax(z) and p_y the probability of the label, the per-sample loss is

    FL_i = −(1 − p_{i,y_i})^γ · log p_{i,y_i},

with the gradient flowing through both factors (FOCAL-R ``Losses/focal_loss.py``). γ = 0 is
cross-entropy; γ = 3 (FL-3) is the calibration-literature default. Batch reduction: see
:mod:`calib.losses._reduction` (FOCAL-R sums over the batch: ``reduction="sum"``).

Numerics: log p_y comes from ``log_softmax`` and log(1 − p_y) from a logsumexp over the other
classes minus the logsumexp over all classes, and (1 − p_y)^γ = exp(γ·log(1 − p_y)). In float32,
1 − p_y computed as ``1 - exp(log p_y)`` rounds to exactly 0 once the label's logit leads by about
17, and then (1 − p_y)^γ has an infinite derivative for γ < 1 (a NaN gradient); this form does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from calib._config import check_fields, checked_field, in_range
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import reduce_per_sample

__all__ = ["FocalLoss", "FocalLossConfig", "focal_terms", "target_log_probs"]


def target_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p_y, log(1 − p_y)) per sample, both without cancellation when p_y is close to 0 or 1."""
    log_probs = F.log_softmax(logits, dim=1)
    log_p = log_probs.gather(1, targets[:, None]).squeeze(1)
    is_target = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, targets[:, None], True)
    others = logits.masked_fill(is_target, float("-inf"))
    log_rest = torch.logsumexp(others, dim=1) - torch.logsumexp(logits, dim=1)
    return log_p, log_rest


def focal_terms(logits: torch.Tensor, targets: torch.Tensor, gamma: float | torch.Tensor) -> torch.Tensor:
    """Per-sample −(1 − p_y)^γ · log p_y; ``gamma`` a number or a per-sample tensor of shape (B,)."""
    log_p, log_rest = target_log_probs(logits, targets)
    return -torch.exp(gamma * log_rest) * log_p


@dataclass(frozen=True, kw_only=True)
class FocalLossConfig:
    """Focal loss (``focal``).

    Attributes:
        gamma: γ, the focusing exponent, >= 0 (3.0: FL-3, FOCAL-R ``train_scripts`` and BALCAL-R).
            γ = 0 is cross-entropy.
    """

    gamma: float = checked_field(3.0, in_range(at_least=0))

    def __post_init__(self) -> None:
        check_fields(self)


class FocalLoss(ConfiguredLoss):
    """FL_i = −(1 − p_y)^γ · log p_y, reduced over the batch by ``reduction`` (see the module docstring)."""

    def __init__(self, gamma: float = FocalLossConfig.gamma, reduction: Reduction = "mean") -> None:
        super().__init__(FocalLossConfig, locals())

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        return reduce_per_sample(focal_terms(logits, targets, self.gamma), self.reduction)


register_loss("focal", FocalLossConfig, FocalLoss,
              "focal loss −(1 − p_y)^γ·log p_y (Lin et al. 2017; FL-3 in Mukhoti et al. 2020)", label="FL", order=2)
