"""The model contract: a feature extractor plus a separate linear head (docs/architecture.md contract 2)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence

import torch
from torch import nn

__all__ = ["CalibModel", "conv_stem", "kaiming_init_convs", "residual_stages"]


def conv_stem(in_channels: int, width: int) -> nn.Sequential:
    """The CIFAR ResNets' stem: a 3×3 convolution (stride 1, no bias), batch norm and ReLU."""
    return nn.Sequential(nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False),
                         nn.BatchNorm2d(width), nn.ReLU(inplace=True))


def residual_stages(make_block: Callable[[int, int, int], nn.Module], in_planes: int,
                    stages: Sequence[tuple[int, int, int]], expansion: int = 1) -> nn.Sequential:
    """Stages of residual blocks, each ``(planes, stride, count)``: ``count`` blocks ``make_block(in_planes,
    planes, stride)``, the first with ``stride`` and the others 1; a block outputs ``planes · expansion``
    channels."""
    built = []
    for planes, stride, count in stages:
        blocks = []
        for block_stride in [stride] + [1] * (count - 1):
            blocks.append(make_block(in_planes, planes, block_stride))
            in_planes = planes * expansion
        built.append(nn.Sequential(*blocks))
    return nn.Sequential(*built)


def kaiming_init_convs(model: nn.Module) -> None:
    """He et al.'s initialisation of every convolution's weights (normal, fan out, ReLU gain)."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")


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
