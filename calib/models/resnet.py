"""The CIFAR ResNets of FOCAL-R (``Net/resnet.py``), which MaC-Cal uses (docs/methods.md §7.1).

A 3×3 stride-1 stem with 64 channels, BN, ReLU and no max-pool; four stages of Bottleneck blocks
(expansion 4) with widths 64/128/256/512 and strides 1/2/2/2; global average pooling to
512 × 4 = 2048 features; a linear head. PyTorch's default initialisation, as in FOCAL-R.

Note: FOCAL-R's "ResNet-110" is Bottleneck ×[3, 4, 26, 3], *not* He et al.'s CIFAR ResNet-110
(3 stages × 18 BasicBlocks, widths 16/32/64, 64 features).

``resnet50_tiny`` is FOCAL-R's Tiny-ImageNet ResNet-50 (``Net/resnet_tiny_imagenet.py``), for 64×64
inputs: the same body, but average pooling to 2×2 (2048 · 4 = 8192 features) and He-normal
convolution weights (normal with std sqrt(2 / (k² · out_channels)), i.e. ``kaiming_normal_`` with
``mode="fan_out"``); BatchNorm and the head keep PyTorch's defaults, as there.

``resnet101`` and ``resnet101_tiny`` are FeDLaS's ResNet-101 (FEDLAS-R ``configs/model/resnet101_*.yaml``:
``calibrate/net/resnet_cifar10.py`` and ``resnet_tiny_imagenet.py``, ``resnet101``): Bottleneck ×[3, 4, 23, 3]
in the same two variants (FEDLAS-R's ResNet-50s are these code bases' too, so ``resnet50`` and
``resnet50_tiny`` are also FeDLaS's).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from calib.models import MODELS
from calib.models._base import CalibModel, conv_stem, kaiming_init_convs, residual_stages
from calib.models._checks import check_positive_int

__all__ = [
    "STAGE_STRIDES",
    "STAGE_WIDTHS",
    "STEM_WIDTH",
    "Bottleneck",
    "CifarResNet",
    "resnet50",
    "resnet50_tiny",
    "resnet101",
    "resnet101_tiny",
    "resnet110",
]

STEM_WIDTH = 64
STAGE_WIDTHS = (64, 128, 256, 512)
STAGE_STRIDES = (1, 2, 2, 2)


class Bottleneck(nn.Module):
    """conv1×1-BN-ReLU, conv3×3(stride)-BN-ReLU, conv1×1(→4·planes)-BN, plus shortcut, then ReLU.

    The shortcut is the identity, or conv1×1(stride)+BN when the stride or the channel count changes.
    """

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_planes = self.expansion * planes
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.relu = nn.ReLU(inplace=True)
        if stride != 1 or in_planes != out_planes:
            self.shortcut: nn.Module = nn.Sequential(
                nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_planes),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(CalibModel):
    """FOCAL-R CIFAR ResNet with Bottleneck blocks; ``blocks_per_stage`` gives the depth.

    Features: adaptive average pool of the last stage to ``pool_size × pool_size``, flattened, so
    2048 · pool_size² values. ``pool_size=1`` (CIFAR) equals FOCAL-R's 4×4 average pool on 32×32
    inputs; ``pool_size=2`` is its Tiny-ImageNet ``AdaptiveAvgPool2d(2)``. ``he_init=True`` draws the
    convolution weights He-normal with fan-out (FOCAL-R's Tiny-ImageNet ResNets); otherwise PyTorch's
    default initialisation (FOCAL-R's CIFAR ResNets).
    """

    def __init__(
        self,
        blocks_per_stage: Sequence[int],
        num_classes: int,
        in_channels: int = 3,
        pool_size: int = 1,
        he_init: bool = False,
    ) -> None:
        check_positive_int("num_classes", num_classes)
        check_positive_int("in_channels", in_channels)
        check_positive_int("pool_size", pool_size)
        if len(blocks_per_stage) != len(STAGE_WIDTHS):
            raise ValueError(
                f"`blocks_per_stage` must have {len(STAGE_WIDTHS)} entries (one per stage), "
                f"got blocks_per_stage={list(blocks_per_stage)}."
            )
        for count in blocks_per_stage:
            check_positive_int("blocks_per_stage[i]", count)
        super().__init__(num_features=STAGE_WIDTHS[-1] * Bottleneck.expansion * pool_size**2, num_classes=num_classes)
        self.blocks_per_stage = tuple(blocks_per_stage)
        self.pool_size = pool_size
        self.stem = conv_stem(in_channels, STEM_WIDTH)
        self.stages = residual_stages(Bottleneck, STEM_WIDTH, list(zip(STAGE_WIDTHS, STAGE_STRIDES, blocks_per_stage,
                                                                       strict=True)), Bottleneck.expansion)
        self.pool = nn.AdaptiveAvgPool2d(pool_size)
        if he_init:
            kaiming_init_convs(self)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features, shape (N, 2048 · pool_size²), channel-major like FOCAL-R's ``view``."""
        return torch.flatten(self.pool(self.stages(self.stem(x))), 1)


@MODELS.register("resnet110")
def resnet110(num_classes: int, in_channels: int = 3) -> CifarResNet:
    """FOCAL-R ResNet-110: Bottleneck ×[3, 4, 26, 3], 2048 features."""
    return CifarResNet([3, 4, 26, 3], num_classes=num_classes, in_channels=in_channels)


@MODELS.register("resnet50")
def resnet50(num_classes: int, in_channels: int = 3) -> CifarResNet:
    """FOCAL-R CIFAR ResNet-50: Bottleneck ×[3, 4, 6, 3], 2048 features."""
    return CifarResNet([3, 4, 6, 3], num_classes=num_classes, in_channels=in_channels)


@MODELS.register("resnet50_tiny")
def resnet50_tiny(num_classes: int, in_channels: int = 3) -> CifarResNet:
    """FOCAL-R Tiny-ImageNet ResNet-50 (64×64 inputs): Bottleneck ×[3, 4, 6, 3], 2×2 pool, 8192 features."""
    return CifarResNet([3, 4, 6, 3], num_classes=num_classes, in_channels=in_channels, pool_size=2, he_init=True)


@MODELS.register("resnet101")
def resnet101(num_classes: int, in_channels: int = 3) -> CifarResNet:
    """FEDLAS-R CIFAR ResNet-101: Bottleneck ×[3, 4, 23, 3], 2048 features."""
    return CifarResNet([3, 4, 23, 3], num_classes=num_classes, in_channels=in_channels)


@MODELS.register("resnet101_tiny")
def resnet101_tiny(num_classes: int, in_channels: int = 3) -> CifarResNet:
    """FEDLAS-R Tiny-ImageNet ResNet-101 (64×64 inputs): Bottleneck ×[3, 4, 23, 3], 2×2 pool, 8192 features."""
    return CifarResNet([3, 4, 23, 3], num_classes=num_classes, in_channels=in_channels, pool_size=2, he_init=True)
