"""The registry entry of a training loss: its config dataclass and how to build it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

__all__ = ["LossSpec", "Reduction"]

Reduction = Literal["mean", "sum"]


@dataclass(frozen=True)
class LossSpec:
    """``build(config, num_classes=..., reduction=...)`` returns an ``nn.Module`` called as
    ``loss(logits, targets, features)``; ``config`` is the loss's frozen config dataclass."""

    config: type
    build: Callable[..., nn.Module]
    description: str

    def create(self, params: Any, *, num_classes: int, reduction: Reduction) -> nn.Module:
        return self.build(params, num_classes=num_classes, reduction=reduction)
