"""The model contract: a feature extractor plus a separate linear head (docs/architecture.md contract 2)."""

from __future__ import annotations

import abc

import torch
from torch import nn

__all__ = ["CalibModel"]


class CalibModel(nn.Module, abc.ABC):
    """Base class: subclasses implement :meth:`features`; ``head`` maps features to logits.

    Two-stage methods call ``features`` on a frozen model and replace ``head``; nothing else of
    the model is touched.
    """

    head: nn.Linear

    def __init__(self, num_features: int, num_classes: int) -> None:
        super().__init__()
        self.num_features = num_features
        self.num_classes = num_classes
        self.head = nn.Linear(num_features, num_classes)

    @abc.abstractmethod
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate pooled features h = f_θ(x), shape (N, num_features)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
