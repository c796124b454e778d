"""FOCAL-R's CIFAR DenseNet-121 (``Net/densenet.py``, after kuangliu/pytorch-cifar; docs/methods.md §7.1).

Huang et al., "Densely Connected Convolutional Networks" (CVPR 2017), DenseNet-BC in its CIFAR form:

* stem: conv3×3(in → 2k, stride 1), with no BN, ReLU or pooling after it;
* four dense blocks of [6, 12, 24, 16] pre-activation Bottleneck layers with growth rate k = 32; a
  layer computes BN-ReLU-conv1×1(→ 4k)-BN-ReLU-conv3×3(→ k) and concatenates it *before* its input
  (``cat([new, x])``, FOCAL-R's channel order);
* between blocks, a transition BN-ReLU-conv1×1(c → ⌊c · 0.5⌋)-avg_pool 2×2;
* a final BN-ReLU, then global average pool (adaptive to 1×1, equal to FOCAL-R's 4×4 average pool
  on 32×32 inputs) → 1024 features; a linear head.

Channels: 64 → 256 → 128 → 512 → 256 → 1024 → 512 → 1024. Every convolution is bias-free;
PyTorch's default initialisation, as in FOCAL-R.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from calib.models import MODELS
from calib.models._base import CalibModel
from calib.models._checks import check_positive_int

__all__ = ["DenseBottleneck", "DenseNet", "DenseTransition", "densenet121"]


class DenseBottleneck(nn.Module):
    """BN-ReLU-conv1×1(→ 4k)-BN-ReLU-conv3×3(→ k); output ``cat([new, x])`` with in_planes + k channels."""

    def __init__(self, in_planes: int, growth_rate: int) -> None:
        super().__init__()
        inner = 4 * growth_rate
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, inner, kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, growth_rate, kernel_size=3, padding=1, bias=False)
        self.relu = nn.ReLU(inplace=True)  # only ever applied to fresh BN outputs, never to ``x``

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.relu(self.bn1(x)))
        out = self.conv2(self.relu(self.bn2(out)))
        return torch.cat([out, x], 1)


class DenseTransition(nn.Module):
    """BN-ReLU-conv1×1(in_planes → out_planes), then 2×2 average pool with stride 2."""

    def __init__(self, in_planes: int, out_planes: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(in_planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(in_planes, out_planes, kernel_size=1, bias=False)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(self.relu(self.bn(x))))


class DenseNet(CalibModel):
    """FOCAL-R CIFAR DenseNet-BC; ``blocks_per_stage`` dense layers per block, growth rate k.

    Transitions keep ⌊c · reduction⌋ channels. Features: the channel count after the last dense block
    (1024 for DenseNet-121), after a final BN-ReLU and global average pooling.
    """

    def __init__(
        self,
        blocks_per_stage: Sequence[int],
        growth_rate: int,
        num_classes: int,
        in_channels: int = 3,
        reduction: float = 0.5,
    ) -> None:
        check_positive_int("num_classes", num_classes)
        check_positive_int("in_channels", in_channels)
        check_positive_int("growth_rate", growth_rate)
        if len(blocks_per_stage) == 0:
            raise ValueError("`blocks_per_stage` must have at least one entry, got blocks_per_stage=[].")
        for count in blocks_per_stage:
            check_positive_int("blocks_per_stage[i]", count)
        if not 0.0 < reduction <= 1.0:
            raise ValueError(f"`reduction` must be in (0, 1], got reduction={reduction!r}.")
        planes = 2 * growth_rate
        stem = nn.Conv2d(in_channels, planes, kernel_size=3, stride=1, padding=1, bias=False)
        stages: list[nn.Module] = []
        for index, count in enumerate(blocks_per_stage):
            layers = []
            for _ in range(count):
                layers.append(DenseBottleneck(planes, growth_rate))
                planes += growth_rate
            stages.append(nn.Sequential(*layers))
            if index < len(blocks_per_stage) - 1:
                out_planes = int(planes * reduction)  # floor, as FOCAL-R's math.floor
                stages.append(DenseTransition(planes, out_planes))
                planes = out_planes
        super().__init__(num_features=planes, num_classes=num_classes)
        self.blocks_per_stage = tuple(blocks_per_stage)
        self.growth_rate = growth_rate
        self.stem = stem
        self.stages = nn.Sequential(*stages)
        self.final = nn.Sequential(nn.BatchNorm2d(planes), nn.ReLU(inplace=True))
        self.pool = nn.AdaptiveAvgPool2d(1)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features, shape (N, num_features)."""
        return torch.flatten(self.pool(self.final(self.stages(self.stem(x)))), 1)


@MODELS.register("densenet121")
def densenet121(num_classes: int, in_channels: int = 3) -> DenseNet:
    """FOCAL-R CIFAR DenseNet-121: [6, 12, 24, 16] layers, growth 32, compression 0.5, 1024 features."""
    return DenseNet([6, 12, 24, 16], growth_rate=32, num_classes=num_classes, in_channels=in_channels)
