"""Tests for calib/models/densenet.py: FOCAL-R CIFAR DenseNet-121, shapes and exact parameter counts."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from calib.models import DenseNet, create_model
from calib.models.densenet import DenseBottleneck, DenseTransition

LAYERS = (6, 12, 24, 16)
GROWTH = 32
STAGE_SHAPES_32 = [
    (256, 32, 32),  # dense block 1: 64 + 6·32
    (128, 16, 16),  # transition 1
    (512, 16, 16),  # dense block 2: 128 + 12·32
    (256, 8, 8),
    (1024, 8, 8),  # dense block 3: 256 + 24·32
    (512, 4, 4),
    (1024, 4, 4),  # dense block 4: 512 + 16·32; FOCAL-R's avg_pool2d(·, 4) averages this 4×4 map
]
"""(C, H, W) after each dense block and transition for a 32×32 input."""


def conv_params(in_channels: int, out_channels: int, kernel: int) -> int:
    """A bias-free convolution: in · out · k²."""
    return in_channels * out_channels * kernel * kernel


def bn_params(channels: int) -> int:
    """BatchNorm affine weight and bias (running statistics are buffers, not parameters)."""
    return 2 * channels


def expected_parameter_count(num_classes: int, in_channels: int = 3) -> int:
    """Count derived from the architecture description (docs/methods.md §7.1), not from the module.

    total = stem + Σ_blocks (Σ_layers layer + transition) + final BN + head, with
      stem       = conv3×3(in_channels → 2k)
      layer      = BN(c) + conv1×1(c → 4k) + BN(4k) + conv3×3(4k → k), after which c ← c + k
      transition = BN(c) + conv1×1(c → ⌊c/2⌋), after which c ← ⌊c/2⌋ (not after the last block)
      head       = BN(c) + c · C + C
    with k = 32, c = 2k = 64 at the start and [6, 12, 24, 16] layers per block.
    """
    total = conv_params(in_channels, 2 * GROWTH, 3)
    channels = 2 * GROWTH
    for index, layers in enumerate(LAYERS):
        for _ in range(layers):
            total += bn_params(channels) + conv_params(channels, 4 * GROWTH, 1)
            total += bn_params(4 * GROWTH) + conv_params(4 * GROWTH, GROWTH, 3)
            channels += GROWTH
        if index < len(LAYERS) - 1:
            total += bn_params(channels) + conv_params(channels, channels // 2, 1)
            channels //= 2
    return total + bn_params(channels) + channels * num_classes + num_classes


@functools.cache
def built(num_classes: int) -> DenseNet:
    """One seeded DenseNet-121 per class count, shared by the read-only tests below."""
    torch.manual_seed(0)
    model = create_model("densenet121", num_classes=num_classes)
    assert isinstance(model, DenseNet)
    return model.eval()


@pytest.mark.parametrize("num_classes", [10, 100])
def test_parameter_count_matches_hand_derivation(num_classes: int) -> None:
    actual = sum(parameter.numel() for parameter in built(num_classes).parameters())
    assert actual == expected_parameter_count(num_classes)


def test_parameter_count_in_channels() -> None:
    model = create_model("densenet121", num_classes=7, in_channels=1)
    assert sum(parameter.numel() for parameter in model.parameters()) == expected_parameter_count(7, in_channels=1)


def test_parameter_count_anchors() -> None:
    # kuangliu/pytorch-cifar's DenseNet121 (the code FOCAL-R's Net/densenet.py follows) is widely quoted at
    # 6,956,298 parameters for CIFAR-10.
    assert expected_parameter_count(10) == 6_956_298
    # 100 classes: 90 more head rows of 1024 weights + 1 bias.
    assert expected_parameter_count(100) == 6_956_298 + 90 * 1025 == 7_048_548


def test_architecture() -> None:
    model = built(10)
    assert model.num_features == 1024
    assert (model.blocks_per_stage, model.growth_rate) == (LAYERS, GROWTH)
    # the stem is a lone convolution: no BN, ReLU or pooling after it
    assert isinstance(model.stem, nn.Conv2d)
    assert (model.stem.in_channels, model.stem.out_channels) == (3, 64)
    assert (model.stem.kernel_size, model.stem.stride, model.stem.padding) == ((3, 3), (1, 1), (1, 1))
    assert not any(isinstance(module, nn.MaxPool2d) for module in model.modules())
    assert all(module.bias is None for module in model.modules() if isinstance(module, nn.Conv2d))
    dense_blocks = [stage for stage in model.stages if not isinstance(stage, DenseTransition)]
    assert [len(block) for block in dense_blocks] == list(LAYERS)
    assert sum(isinstance(module, DenseBottleneck) for module in model.modules()) == 58
    transitions = [stage for stage in model.stages if isinstance(stage, DenseTransition)]
    assert [(t.conv.in_channels, t.conv.out_channels) for t in transitions] == [(256, 128), (512, 256), (1024, 512)]
    layer = dense_blocks[0][0]
    assert (layer.conv1.in_channels, layer.conv1.out_channels, layer.conv1.kernel_size) == (64, 128, (1, 1))
    assert (layer.conv2.in_channels, layer.conv2.out_channels, layer.conv2.kernel_size) == (128, 32, (3, 3))
    assert isinstance(model.final[0], nn.BatchNorm2d) and model.final[0].num_features == 1024


def test_layer_concatenates_new_features_first() -> None:
    torch.manual_seed(0)
    layer = DenseBottleneck(16, growth_rate=4).eval()
    x = torch.randn(2, 16, 5, 5)
    with torch.no_grad():
        out = layer(x)
    assert out.shape == (2, 20, 5, 5)
    torch.testing.assert_close(out[:, 4:], x)  # cat([new, x]); x itself is left unchanged by the in-place ReLUs


@pytest.mark.parametrize("num_classes", [10, 100])
def test_output_shapes(num_classes: int) -> None:
    model = built(num_classes)
    shapes: list[tuple[int, ...]] = []
    handles = [
        stage.register_forward_hook(lambda _m, _i, out: shapes.append(tuple(out.shape[1:]))) for stage in model.stages
    ]
    with torch.no_grad():
        features = model.features(torch.randn(2, 3, 32, 32))
        for handle in handles:
            handle.remove()
        assert shapes == STAGE_SHAPES_32
        assert features.shape == (2, 1024)
        assert (features >= 0).all()  # average of post-ReLU activations
        assert model.head(features).shape == (2, num_classes)
        if num_classes == 10:
            # adaptive pooling: other input sizes give the same feature size
            assert model(torch.randn(2, 3, 16, 16)).shape == (2, 10)


def test_errors() -> None:
    with pytest.raises(ValueError, match=r"`growth_rate` must be an integer >= 1, got growth_rate=0\."):
        DenseNet(LAYERS, growth_rate=0, num_classes=10)
    with pytest.raises(ValueError, match=r"got blocks_per_stage\[i\]=0\."):
        DenseNet([6, 0], growth_rate=32, num_classes=10)
    with pytest.raises(ValueError, match=r"`blocks_per_stage` must have at least one entry"):
        DenseNet([], growth_rate=32, num_classes=10)
    with pytest.raises(ValueError, match=r"`reduction` must be in \(0, 1\], got reduction=0\.0\."):
        DenseNet(LAYERS, growth_rate=32, num_classes=10, reduction=0.0)
