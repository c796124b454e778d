"""He et al.'s CIFAR ResNets ("Deep Residual Learning for Image Recognition", CVPR 2016, §4.2), docs/methods.md §7.1.

* stem: conv3×3(in → 16, stride 1)-BN-ReLU;
* three stages of n BasicBlocks (depth 6n + 2; n = 3 for ResNet-20) with 16/32/64 channels and strides
  1/2/2 on the first block of each stage (feature maps 32/16/8 on 32×32 inputs, 28/14/7 on 28×28);
* BasicBlock: conv3×3(stride)-BN-ReLU-conv3×3-BN, plus the shortcut, then ReLU;
* shortcut option A, the paper's for CIFAR: the identity, or, where a block halves the map and doubles
  the channels, the input subsampled by 2 (every other row and column) with zero channels appended
  (fb.resnet.torch's ``shortcutType A``); parameter-free;
* global average pool → 64 features; a linear head.

Every convolution is bias-free; convolution weights are He-normal with fan-out (``kaiming_normal_``,
``mode="fan_out"``, as fb.resnet.torch); BatchNorm starts at weight 1, bias 0; the head keeps PyTorch's
default. ResNet-20 has 0.27M parameters (269,722 for 3 input channels and 10 classes).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from calib.models import MODELS
from calib.models._base import CalibModel, conv_stem, kaiming_init_convs, residual_stages
from calib.models._checks import check_positive_int

__all__ = ["STAGE_STRIDES", "STAGE_WIDTHS", "STEM_WIDTH", "HeResNet", "OptionABlock", "resnet20"]

STEM_WIDTH = 16
STAGE_WIDTHS = (16, 32, 64)
STAGE_STRIDES = (1, 2, 2)


class OptionABlock(nn.Module):
    """conv3×3(stride)-BN-ReLU, conv3×3-BN, plus the option-A shortcut, then ReLU.

    The shortcut is the identity, or ``x[:, :, ::stride, ::stride]`` followed by ``planes − in_planes``
    zero channels when the stride or the channel count changes.
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        if planes < in_planes:
            raise ValueError(f"`planes` must be >= in_planes={in_planes} (option A only pads), got planes={planes}.")
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.stride = stride
        self.extra_channels = planes - in_planes

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        """Subsampled by ``stride``, zero-padded to ``planes`` channels (the identity when neither changes)."""
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.extra_channels:
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class HeResNet(CalibModel):
    """He et al.'s CIFAR ResNet-``depth`` with option-A shortcuts; 64 features.

    ``depth`` must be 6n + 2 with n ≥ 1 (n BasicBlocks per stage). Any input side works (the two
    stride-2 stages give ⌈side / 2⌉ and ⌈side / 4⌉; the pool averages what is left).
    """

    def __init__(self, depth: int, num_classes: int, in_channels: int = 3) -> None:
        check_positive_int("num_classes", num_classes)
        check_positive_int("in_channels", in_channels)
        check_positive_int("depth", depth)
        if depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"`depth` must be 6n + 2 with n >= 1 (8, 14, 20, 32, 56, 110, ...), got depth={depth}.")
        super().__init__(num_features=STAGE_WIDTHS[-1], num_classes=num_classes)
        self.depth = depth
        self.blocks_per_stage = (depth - 2) // 6
        self.stem = conv_stem(in_channels, STEM_WIDTH)
        stages = [(planes, stride, self.blocks_per_stage)
                  for planes, stride in zip(STAGE_WIDTHS, STAGE_STRIDES, strict=True)]
        self.stages = residual_stages(OptionABlock, STEM_WIDTH, stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        kaiming_init_convs(self)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features, shape (N, 64)."""
        return torch.flatten(self.pool(self.stages(self.stem(x))), 1)


@MODELS.register("resnet20")
def resnet20(num_classes: int, in_channels: int = 3) -> HeResNet:
    """He et al.'s CIFAR ResNet-20: BasicBlock ×[3, 3, 3], widths 16/32/64, option-A shortcuts, 64 features."""
    return HeResNet(depth=20, num_classes=num_classes, in_channels=in_channels)
