"""Tests for calib/models/wide_resnet.py: FOCAL-R WRN-26-10, shapes, exact parameter count, He init."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn

from calib.models import WideResNet, create_model
from calib.models.wide_resnet import BasicBlock


def conv_params(in_channels: int, out_channels: int, kernel: int) -> int:
    """A bias-free convolution: in · out · k²."""
    return in_channels * out_channels * kernel * kernel


def bn_params(channels: int) -> int:
    """BatchNorm affine weight and bias (running statistics are buffers, not parameters)."""
    return 2 * channels


def expected_parameter_count(num_classes: int, in_channels: int = 3, blocks: int = 4, widen: int = 10) -> int:
    """Count derived from the architecture description (docs/methods.md §7.1), not from the module.

    total = stem + Σ_groups Σ_blocks block + head, with
      stem  = conv3×3(in_channels → 16) + BN(16)
      block = conv3×3(c_in → w) + BN(w) + conv3×3(w → w) + BN(w) + [conv1×1(c_in → w) + BN(w) if c_in ≠ w
              or stride ≠ 1]
      head  = 64·widen · C + C
    where w ∈ (16, 32, 64) · widen per group, c_in = 16 for the first block, w of the previous block
    otherwise (the first block of every group changes the width, so it has the projection shortcut).
    """
    total = conv_params(in_channels, 16, 3) + bn_params(16)
    c_in = 16
    for width in (16 * widen, 32 * widen, 64 * widen):
        for _ in range(blocks):
            total += conv_params(c_in, width, 3) + bn_params(width) + conv_params(width, width, 3) + bn_params(width)
            if c_in != width:
                total += conv_params(c_in, width, 1) + bn_params(width)
            c_in = width
    return total + 64 * widen * num_classes + num_classes


@functools.cache
def built(num_classes: int) -> WideResNet:
    """One seeded WRN-26-10 per class count, shared by the read-only tests below (construction ~0.5 s)."""
    torch.manual_seed(0)
    model = create_model("wrn26_10", num_classes=num_classes)
    assert isinstance(model, WideResNet)
    return model.eval()


@pytest.mark.parametrize("num_classes", [10, 100])
def test_parameter_count_matches_hand_derivation(num_classes: int) -> None:
    actual = sum(parameter.numel() for parameter in built(num_classes).parameters())
    assert actual == expected_parameter_count(num_classes)


def test_parameter_count_in_channels() -> None:
    model = WideResNet(depth=8, widen_factor=2, num_classes=5, in_channels=1)
    actual = sum(parameter.numel() for parameter in model.parameters())
    assert actual == expected_parameter_count(5, in_channels=1, blocks=1, widen=2)


def test_parameter_count_anchors() -> None:
    # Zagoruyko & Komodakis' pre-activation WRN-28-10 (4 blocks per group, widths 160/320/640; its 28 counts
    # the 3 shortcut convolutions, so it has exactly our convolutions) has the widely quoted 36,479,194
    # parameters for CIFAR-10 (xternalz/WideResNet-pytorch, RobustBench). It differs from FOCAL-R's
    # post-activation block only in the BatchNorms:
    #   pre-act  BN(c_in) + BN(w) per block + final BN(640):
    #            2·(16 + 3·160 + 4·160) + 2·(160 + 3·320 + 4·320) + 2·(320 + 3·640 + 4·640) + 2·640 = 17,952
    #   post-act stem BN(16) + 2·BN(w) per block + BN(w) per projection shortcut:
    #            2·16 + 18·(160 + 320 + 640) = 20,192
    assert expected_parameter_count(10) == 36_479_194 - 17_952 + 20_192 == 36_481_434
    # 100 classes: 90 more head rows of 640 weights + 1 bias.
    assert expected_parameter_count(100) == 36_481_434 + 90 * 641 == 36_539_124


def test_architecture() -> None:
    model = built(10)
    assert model.num_features == 640
    assert (model.depth, model.widen_factor, model.blocks_per_group) == (26, 10, 4)
    stem_conv = model.stem[0]
    assert (stem_conv.in_channels, stem_conv.out_channels) == (3, 16)
    assert (stem_conv.kernel_size, stem_conv.stride, stem_conv.padding) == ((3, 3), (1, 1), (1, 1))
    assert isinstance(model.stem[1], nn.BatchNorm2d) and isinstance(model.stem[2], nn.ReLU)
    assert not any(isinstance(module, nn.MaxPool2d | nn.Dropout) for module in model.modules())
    assert all(module.bias is None for module in model.modules() if isinstance(module, nn.Conv2d))
    assert [len(group) for group in model.groups] == [4, 4, 4]
    assert sum(isinstance(module, BasicBlock) for module in model.modules()) == 12
    for group, width, stride in zip(model.groups, (160, 320, 640), (1, 2, 2), strict=True):
        assert [block.conv1.stride for block in group] == [(stride, stride)] + [(1, 1)] * 3
        assert [block.conv2.out_channels for block in group] == [width] * 4
        # projection shortcut (conv1×1 + BN) on the first block only
        assert isinstance(group[0].shortcut, nn.Sequential)
        assert group[0].shortcut[0].kernel_size == (1, 1) and group[0].shortcut[0].stride == (stride, stride)
        assert all(isinstance(block.shortcut, nn.Identity) for block in group[1:])


@pytest.mark.parametrize("num_classes", [10, 100])
def test_output_shapes(num_classes: int) -> None:
    model = built(num_classes)
    shapes: list[tuple[int, ...]] = []
    handles = [
        group.register_forward_hook(lambda _m, _i, out: shapes.append(tuple(out.shape[1:]))) for group in model.groups
    ]
    with torch.no_grad():
        features = model.features(torch.randn(2, 3, 32, 32))
        for handle in handles:
            handle.remove()
        # the final 8×8 map is what FOCAL-R's AvgPool2d(8) averages
        assert shapes == [(160, 32, 32), (320, 16, 16), (640, 8, 8)]
        assert features.shape == (2, 640)
        assert (features >= 0).all()  # average of post-ReLU activations
        assert model.head(features).shape == (2, num_classes)
        if num_classes == 10:
            # adaptive pooling: other input sizes give the same feature size
            assert model(torch.randn(2, 3, 16, 16)).shape == (2, 10)


def test_he_normal_fan_out_init() -> None:
    model = built(10)
    convs = [module for module in model.modules() if isinstance(module, nn.Conv2d)]
    assert len(convs) == 1 + 24 + 3
    for conv in convs:
        kernel_area = conv.kernel_size[0] * conv.kernel_size[1]
        fan_out_std = math.sqrt(2.0 / (kernel_area * conv.out_channels))
        weight = conv.weight.detach()
        tolerance = 4.0 / math.sqrt(2 * weight.numel())  # ~4 standard errors of a sample std
        assert abs(weight.std().item() / fan_out_std - 1) < tolerance, conv
        assert abs(weight.mean().item()) < 4 * fan_out_std / math.sqrt(weight.numel()), conv
    # fan-out, not fan-in: the first conv of group 2 (160 → 320) would have a √2 larger std with fan-in
    first = model.groups[1][0].conv1.weight.detach()
    assert abs(first.std().item() - math.sqrt(2.0 / (9 * 320))) < 0.02 * math.sqrt(2.0 / (9 * 320))
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            assert (module.weight == 1).all() and (module.bias == 0).all()


def test_errors() -> None:
    with pytest.raises(
        ValueError, match=r"`depth` must be 2 \+ 6n with n >= 1 \(8, 14, 20, 26, \.\.\.\), got depth=28\."
    ):
        WideResNet(depth=28, widen_factor=10, num_classes=10)
    with pytest.raises(ValueError, match=r"got depth=2\."):
        WideResNet(depth=2, widen_factor=10, num_classes=10)
    with pytest.raises(ValueError, match=r"`widen_factor` must be an integer >= 1, got widen_factor=0\."):
        WideResNet(depth=26, widen_factor=0, num_classes=10)
