"""The registry entry of a training loss: its config dataclass and how to build it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

__all__ = ["LossSpec", "Reduction"]

Reduction = Literal["mean", "sum"]


@dataclass(frozen=True)
class LossSpec:
    """``build(config, num_classes=..., reduction=...)`` returns an ``nn.Module`` called as
    ``loss(logits, targets, features)``; ``config`` is the loss's frozen config dataclass.

    What the studies read from the spec (``calib.study.rows``): ``label``, the row of a Stage I trained with the
    loss (its defaults) in the tables and ``--methods`` (None: no row); ``order``, its place among the loss rows
    (ties: registration order); ``dataset_defaults``, config changes per dataset that the rows apply (FeDLaS's
    CIFAR-100 values); ``added_fields``, fields added after results were stored, with their defaults (left out
    of the identities at their default, so stored trials keep their ids).
    """

    config: type
    build: Callable[..., nn.Module]
    description: str
    label: str | None = None
    order: float = math.inf
    dataset_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    added_fields: Mapping[str, Any] = field(default_factory=dict)

    def create(self, params: Any, *, num_classes: int, reduction: Reduction) -> nn.Module:
        return self.build(params, num_classes=num_classes, reduction=reduction)
