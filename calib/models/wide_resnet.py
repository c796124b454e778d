"""FOCAL-R's Wide ResNet WRN-26-10 (``Net/wide_resnet.py``; docs/methods.md §7.1).

Zagoruyko & Komodakis, "Wide Residual Networks" (BMVC 2016), in FOCAL-R's post-activation form:

* stem: conv3×3(in → 16, stride 1)-BN-ReLU;
* three groups of ``(depth - 2) / 6`` BasicBlocks (4 for depth 26) with widths 16·k, 32·k, 64·k
  (160/320/640 for k = 10) and strides 1/2/2 on the first block of each group;
* BasicBlock (post-activation): conv3×3(stride)-BN-ReLU-conv3×3-BN, plus the shortcut, then ReLU;
  the shortcut is the identity, or conv1×1(stride)+BN when the stride or the width changes (so also
  in the first block of group 1, 16 → 160);
* global average pool (adaptive to 1×1, equal to FOCAL-R's 8×8 average pool on 32×32 inputs) →
  64·k = 640 features; a linear head.

As in FOCAL-R: every convolution is bias-free, there is no dropout, and the convolution weights are
He-normal with fan-out, N(0, 2 / (k_h · k_w · out_channels)) (``kaiming_normal_``, ``mode="fan_out"``);
BatchNorm starts at weight 1, bias 0 and the head keeps PyTorch's default initialisation.

Depth convention: FOCAL-R counts 26 = 2 + 6·4 (stem, 2 convolutions × 4 blocks × 3 groups, head),
leaving out the three shortcut convolutions; Zagoruyko & Komodakis count them, so the same 4 blocks
per group are their "WRN-28-10" (which is pre-activation, though).
"""

from __future__ import annotations

import torch
from torch import nn

from calib.models import MODELS
from calib.models._base import CalibModel, conv_stem, kaiming_init_convs, residual_stages
from calib.models._checks import check_positive_int

__all__ = ["GROUP_STRIDES", "GROUP_WIDTHS", "STEM_WIDTH", "BasicBlock", "WideResNet", "wrn26_10"]

STEM_WIDTH = 16
GROUP_WIDTHS = (16, 32, 64)
"""Group widths before multiplying by the widen factor."""
GROUP_STRIDES = (1, 2, 2)


class BasicBlock(nn.Module):
    """conv3×3(stride)-BN-ReLU, conv3×3-BN, plus shortcut, then ReLU (post-activation).

    The shortcut is the identity, or conv1×1(stride)+BN when the stride or the channel count changes.
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        if stride != 1 or in_planes != planes:
            self.shortcut: nn.Module = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class WideResNet(CalibModel):
    """FOCAL-R post-activation Wide ResNet WRN-``depth``-``widen_factor``; 64 · widen_factor features.

    ``depth`` must be 2 + 6n with n ≥ 1 (n BasicBlocks per group).
    """

    def __init__(self, depth: int, widen_factor: int, num_classes: int, in_channels: int = 3) -> None:
        check_positive_int("num_classes", num_classes)
        check_positive_int("in_channels", in_channels)
        check_positive_int("widen_factor", widen_factor)
        check_positive_int("depth", depth)
        if depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"`depth` must be 2 + 6n with n >= 1 (8, 14, 20, 26, ...), got depth={depth}.")
        super().__init__(num_features=GROUP_WIDTHS[-1] * widen_factor, num_classes=num_classes)
        self.depth = depth
        self.widen_factor = widen_factor
        self.blocks_per_group = (depth - 2) // 6
        self.stem = conv_stem(in_channels, STEM_WIDTH)
        groups = [(width * widen_factor, stride, self.blocks_per_group)
                  for width, stride in zip(GROUP_WIDTHS, GROUP_STRIDES, strict=True)]
        self.groups = residual_stages(BasicBlock, STEM_WIDTH, groups)
        self.pool = nn.AdaptiveAvgPool2d(1)
        kaiming_init_convs(self)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features, shape (N, 64 · widen_factor)."""
        return torch.flatten(self.pool(self.groups(self.stem(x))), 1)


@MODELS.register("wrn26_10")
def wrn26_10(num_classes: int, in_channels: int = 3) -> WideResNet:
    """FOCAL-R WRN-26-10: BasicBlock ×[4, 4, 4], widths 160/320/640, 640 features."""
    return WideResNet(depth=26, widen_factor=10, num_classes=num_classes, in_channels=in_channels)
