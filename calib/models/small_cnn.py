"""A small CNN for 8×8 inputs (the embedded ``digits`` / ``digits-noisy`` default)."""

from __future__ import annotations

import torch
from torch import nn

from calib.models import MODELS
from calib.models._base import CalibModel
from calib.models._checks import check_positive_int

__all__ = ["SmallCNN", "small_cnn"]


def _conv_bn_relu(in_channels: int, out_channels: int) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    ]


class SmallCNN(CalibModel):
    """conv3×3(in→32)-BN-ReLU, conv3×3(32→64)-BN-ReLU, max-pool 2, conv3×3(64→128)-BN-ReLU, global avg pool.

    128 features; works on any spatial size ≥ 2 (the max-pool halves it, the pool averages the rest).
    Convolutions have no bias (each is followed by BatchNorm).
    """

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        check_positive_int("num_classes", num_classes)
        check_positive_int("in_channels", in_channels)
        super().__init__(num_features=128, num_classes=num_classes)
        self.body = nn.Sequential(
            *_conv_bn_relu(in_channels, 32),
            *_conv_bn_relu(32, 64),
            nn.MaxPool2d(2),
            *_conv_bn_relu(64, 128),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features, shape (N, 128)."""
        return self.body(x)


@MODELS.register("small_cnn")
def small_cnn(num_classes: int, in_channels: int = 3) -> SmallCNN:
    """The small CNN of the embedded default (for 8×8 digits: ``in_channels=1``)."""
    return SmallCNN(num_classes=num_classes, in_channels=in_channels)
