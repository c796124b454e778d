"""Dual focal loss (Tao, Dong, Xu, ICML 2023), docs/methods.md §4.6.

With p = softmax(z), p_y the probability of the label and p_j the **largest probability strictly
smaller than p_y** (0 when no class has a smaller probability), the per-sample loss is

    DFL_i = −(1 − p_{i,y_i} + p_{i,j})^γ · log p_{i,y_i}.

- If y is the argmax, p_j is the runner-up probability.
- If y is not the argmax, p_j is *not* the top probability: classes above p_y are skipped.
- Classes tied with p_y are not strictly smaller and are skipped too.

This is the convention of DFL-R (``Losses/dual_focal_loss.py``): the comparison is on
probabilities, and the gradient flows through p_y, p_j and log p_y (nothing is detached). Batch
reduction: see :mod:`calib.losses._reduction` (DFL-R sums over the batch by default).

Numerics: 1 − p_y is computed as exp(log(1 − p_y)) from logsumexps (as in :mod:`calib.losses.focal`),
and the base is clamped at the dtype's smallest normal number so that γ < 1 keeps a finite gradient
when both 1 − p_y and p_j underflow; the clamp changes no value a float can tell from 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from calib._config import check_fields, checked_field, in_range
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import reduce_per_sample
from calib.losses.focal import target_log_probs

__all__ = ["DualFocalLoss", "DualFocalLossConfig", "next_smaller_probability"]


def next_smaller_probability(probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """p_j per sample, shape (B,): the largest of ``probs[i]`` strictly below ``probs[i, y_i]``, else 0."""
    p_y = probs.gather(1, targets[:, None])
    smaller = probs.masked_fill(probs >= p_y, 0.0)
    return smaller.max(dim=1).values


@dataclass(frozen=True, kw_only=True)
class DualFocalLossConfig:
    """Dual focal loss (``dual_focal``).

    Attributes:
        gamma: γ, the focusing exponent, >= 0 (5.0: ASSUMPTION, the CIFAR value a third-party port
            cites from the paper's hyper-parameter table; docs/methods.md §4.6). γ = 0 is cross-entropy.
    """

    gamma: float = checked_field(5.0, in_range(at_least=0))

    def __post_init__(self) -> None:
        check_fields(self)


class DualFocalLoss(ConfiguredLoss):
    """DFL_i = −(1 − p_y + p_j)^γ · log p_y, reduced over the batch by ``reduction`` (see the module docstring)."""

    def __init__(self, gamma: float = DualFocalLossConfig.gamma, reduction: Reduction = "mean") -> None:
        super().__init__(DualFocalLossConfig, locals())

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        log_p, log_rest = target_log_probs(logits, targets)
        p_j = next_smaller_probability(F.softmax(logits, dim=1), targets)
        one_minus_p = torch.exp(log_rest)
        base = (one_minus_p + p_j).clamp_min(torch.finfo(logits.dtype).tiny)
        return reduce_per_sample(-base.pow(self.gamma) * log_p, self.reduction)


register_loss("dual_focal", DualFocalLossConfig, DualFocalLoss,
              "dual focal loss −(1 − p_y + p_j)^γ·log p_y (Tao, Dong, Xu, ICML 2023)", label="DFL", order=4)
