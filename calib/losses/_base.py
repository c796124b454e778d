"""The registry entry of a training loss: its config dataclass and how to build it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import nn

__all__ = ["LossSpec", "Reduction", "TrainingStateLoss"]

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


class TrainingStateLoss(nn.Module):
    """A loss that keeps state across steps and epochs; Stage I (:func:`calib.training.stage1.train_stage1`) calls
    its hooks. The state lives in buffers, so a Stage-I checkpoint saves it with the loss's ``state_dict``.

    - ``needs_sample_indices``: the loss is called as ``loss(logits, targets, features, indices=...)``, ``indices``
      the batch's positions in the training split (CRL's correctness history).
    - :meth:`start_training` once, before the first epoch (and before a checkpoint's state is loaded back).
    - :meth:`end_epoch` after each epoch's training steps; :meth:`observe_validation` after each epoch with the
      validation split's logits and labels (AdaFocal's γ update).
    """

    needs_sample_indices: ClassVar[bool] = False

    def start_training(self, num_samples: int) -> None:
        """Size the state for a training split of ``num_samples`` samples."""

    def end_epoch(self, epoch: int) -> None:
        """``epoch`` (0-based) has finished its training steps."""

    def observe_validation(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """The validation split's logits (N, C) and labels (N,) after an epoch, from the model in eval mode."""
