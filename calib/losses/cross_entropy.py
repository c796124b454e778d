"""Cross-entropy, the vanilla Stage-I loss: CE_i = −log p_{i,y_i} (docs/methods.md §0)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.registries import DEFAULT_LOSS

__all__ = ["CrossEntropy", "CrossEntropyConfig"]


@dataclass(frozen=True, kw_only=True)
class CrossEntropyConfig:
    """Cross-entropy has no hyperparameters."""


class CrossEntropy(ConfiguredLoss):
    """Batch cross-entropy with ``reduction`` "mean" or "sum" (FOCAL-R trains with "sum", docs/methods.md §4)."""

    def __init__(self, reduction: Reduction = "mean") -> None:
        super().__init__(CrossEntropyConfig, locals())

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        return F.cross_entropy(logits, targets, reduction=self.reduction)


register_loss(DEFAULT_LOSS, CrossEntropyConfig, CrossEntropy, "cross-entropy (vanilla)")
