"""Classifier heads retrained in Stage II, with weights that can be masked in the forward pass."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["MaskableHead"]


class MaskableHead(nn.Module):
    """Linear layers ``widths[0] → widths[1] → … → widths[-1]`` with ReLU between them.

    ``MaskableHead([d, C])`` is the linear classifier; ``MaskableHead([d, r, C])`` is MaC-Cal's
    bottleneck z = W2·ReLU(W1·h + b1) + b2 (docs/methods.md §1.3). In :meth:`forward`, layer i uses the
    weight ``weight_scale · (masks[i] ⊙ W_i)``; biases are never masked.
    """

    def __init__(self, widths: Sequence[int]) -> None:
        super().__init__()
        if len(widths) < 2 or min(widths) < 1:
            raise ValueError(f"`widths` must list at least two sizes >= 1, got widths={list(widths)}.")
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))

    @property
    def weights(self) -> list[nn.Parameter]:
        return [layer.weight for layer in self.layers]

    def forward(
        self, h: torch.Tensor, masks: Sequence[torch.Tensor] | None = None, weight_scale: float = 1.0
    ) -> torch.Tensor:
        x = h
        for i, layer in enumerate(self.layers):
            weight = layer.weight if masks is None else layer.weight * masks[i]
            if weight_scale != 1.0:
                weight = weight * weight_scale
            x = F.linear(x, weight, layer.bias)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x
