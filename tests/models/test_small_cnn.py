"""Tests for calib/models/small_cnn.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from calib.models import SmallCNN, create_model


class TestSmallCNN:
    def test_main(self) -> None:
        model = create_model("small_cnn", num_classes=10, in_channels=1)
        assert isinstance(model, SmallCNN)
        assert model.num_features == 128
        convs = [module for module in model.modules() if isinstance(module, nn.Conv2d)]
        assert [(conv.in_channels, conv.out_channels, conv.kernel_size, conv.padding) for conv in convs] == [
            (1, 32, (3, 3), (1, 1)),
            (32, 64, (3, 3), (1, 1)),
            (64, 128, (3, 3), (1, 1)),
        ]
        assert sum(isinstance(module, nn.BatchNorm2d) for module in model.modules()) == 3
        assert sum(isinstance(module, nn.MaxPool2d) for module in model.modules()) == 1
        # conv weights (no bias) + BN affine + head: 1·32·9 + 32·64·9 + 64·128·9 + 2·(32+64+128) + 128·10 + 10
        assert sum(p.numel() for p in model.parameters()) == 288 + 18432 + 73728 + 448 + 1290

    @pytest.mark.parametrize("side", [2, 3, 8, 28])
    def test_spatial_sizes(self, side: int) -> None:
        model = create_model("small_cnn", num_classes=10, in_channels=1).eval()
        with torch.no_grad():
            assert model.features(torch.randn(2, 1, side, side)).shape == (2, 128)
            assert model(torch.randn(2, 1, side, side)).shape == (2, 10)
