"""Tests for calib/models/resnet.py: FOCAL-R CIFAR and Tiny-ImageNet ResNets, shapes and exact parameter counts."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn

from calib.models import CifarResNet, create_model
from calib.models.resnet import Bottleneck

DEPTHS = {"resnet50": [3, 4, 6, 3], "resnet101": [3, 4, 23, 3], "resnet110": [3, 4, 26, 3]}


def conv_params(in_channels: int, out_channels: int, kernel: int) -> int:
    """A bias-free convolution: in · out · k²."""
    return in_channels * out_channels * kernel * kernel


def bn_params(channels: int) -> int:
    """BatchNorm affine weight and bias (running statistics are buffers, not parameters)."""
    return 2 * channels


def expected_parameter_count(
    blocks_per_stage: list[int], num_classes: int, in_channels: int = 3, pool_size: int = 1
) -> int:
    """Count derived from the architecture description (docs/methods.md §7.1), not from the module.

    total = stem + Σ_stages Σ_blocks block + head, with
      stem  = conv3×3(in_channels → 64) + BN(64)
      block = conv1×1(c_in → p) + BN(p) + conv3×3(p → p) + BN(p) + conv1×1(p → 4p) + BN(4p)
              + [conv1×1(c_in → 4p) + BN(4p) if stride ≠ 1 or c_in ≠ 4p]
      head  = 2048 · pool_size² · C + C   (pool_size 1 for CIFAR, 2 for resnet50_tiny)
    where p ∈ (64, 128, 256, 512) per stage, strides (1, 2, 2, 2) on the first block of each stage,
    and c_in = 64 for the first block, 4p of the previous block otherwise.
    """
    total = conv_params(in_channels, 64, 3) + bn_params(64)
    c_in = 64
    for planes, stage_stride, count in zip((64, 128, 256, 512), (1, 2, 2, 2), blocks_per_stage, strict=True):
        for block in range(count):
            stride = stage_stride if block == 0 else 1
            out = 4 * planes
            total += conv_params(c_in, planes, 1) + bn_params(planes)
            total += conv_params(planes, planes, 3) + bn_params(planes)
            total += conv_params(planes, out, 1) + bn_params(out)
            if stride != 1 or c_in != out:
                total += conv_params(c_in, out, 1) + bn_params(out)
            c_in = out
    total += 2048 * pool_size**2 * num_classes + num_classes
    return total


@pytest.mark.parametrize("name", sorted(DEPTHS))
@pytest.mark.parametrize("num_classes", [10, 100])
def test_parameter_count_matches_hand_derivation(name: str, num_classes: int) -> None:
    model = create_model(name, num_classes=num_classes)
    actual = sum(parameter.numel() for parameter in model.parameters())
    assert actual == expected_parameter_count(DEPTHS[name], num_classes)


def test_parameter_count_anchors() -> None:
    # The widely quoted size of the CIFAR ResNet-50 used by FOCAL-R (kuangliu's pytorch-cifar): 23,520,842.
    assert expected_parameter_count(DEPTHS["resnet50"], 10) == 23_520_842
    # ResNet-101 of the same code base ([3, 4, 23, 3]) has 42,512,970; three more stage-3 blocks of
    # 1024·256 + 256·256·9 + 256·1024 + 2·(256 + 256 + 1024) = 1,117,184 each give 45,864,522.
    assert expected_parameter_count(DEPTHS["resnet110"], 10) == 42_512_970 + 3 * 1_117_184 == 45_864_522


# torchvision's published size of the ImageNet ResNet-101 (ResNet101_Weights.IMAGENET1K_V1: num_params 44,549,160):
# a 7×7 stem (3·64·49 = 9,408) and a 1000-class head (2048·1000 + 1000), the same body as FEDLAS-R's.
TORCHVISION_RESNET101 = 44_549_160
RESNET101_BODY = TORCHVISION_RESNET101 - 3 * 64 * 49 - (2048 * 1000 + 1000) + 3 * 64 * 9  # 3×3 stem, no head


def test_resnet101_parameter_count_is_the_published_one() -> None:
    # FEDLAS-R's CIFAR ResNet-101 (resnet101_cifar10.yaml): 42,512,970 parameters for 10 classes, the body of the
    # published ImageNet ResNet-101 with a 3×3 stem and a 10-class head.
    assert RESNET101_BODY + 2048 * 10 + 10 == 42_512_970
    for num_classes in (10, 100):
        model = create_model("resnet101", num_classes=num_classes)
        assert sum(p.numel() for p in model.parameters()) == RESNET101_BODY + 2048 * num_classes + num_classes
    # FEDLAS-R's Tiny-ImageNet ResNet-101 (resnet101_tiny.yaml): 2×2 pool, an 8192-wide 200-class head.
    tiny101 = create_model("resnet101_tiny", num_classes=200)
    assert sum(p.numel() for p in tiny101.parameters()) == RESNET101_BODY + 8192 * 200 + 200 == 44_131_080
    assert (tiny101.num_features, tiny101.pool_size, tiny101.blocks_per_stage) == (8192, 2, (3, 4, 23, 3))
    torchvision = pytest.importorskip("torchvision")
    assert sum(p.numel() for p in torchvision.models.resnet101().parameters()) == TORCHVISION_RESNET101


@pytest.mark.parametrize("name", sorted(DEPTHS))
def test_architecture(name: str) -> None:
    model = create_model(name, num_classes=10)
    assert isinstance(model, CifarResNet)
    assert model.num_features == 2048
    assert model.blocks_per_stage == tuple(DEPTHS[name])
    stem_conv = model.stem[0]
    assert (stem_conv.kernel_size, stem_conv.stride, stem_conv.padding) == ((3, 3), (1, 1), (1, 1))
    assert not any(isinstance(module, nn.MaxPool2d) for module in model.modules())
    blocks = [module for module in model.modules() if isinstance(module, Bottleneck)]
    assert len(blocks) == sum(DEPTHS[name])
    with torch.no_grad():
        features = model.eval().features(torch.randn(2, 3, 32, 32))
    assert features.shape == (2, 2048)
    assert (features >= 0).all()  # average of post-ReLU activations


def test_stage_output_sizes_for_32x32() -> None:
    model = create_model("resnet50", num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = model.stem(x)
        assert out.shape == (2, 64, 32, 32)
        sizes = []
        for stage in model.stages:
            out = stage(out)
            sizes.append(tuple(out.shape[1:]))
    assert sizes == [(256, 32, 32), (512, 16, 16), (1024, 8, 8), (2048, 4, 4)]


@functools.cache
def tiny(num_classes: int) -> CifarResNet:
    """One seeded resnet50_tiny per class count, shared by the read-only tests below."""
    torch.manual_seed(0)
    model = create_model("resnet50_tiny", num_classes=num_classes)
    assert isinstance(model, CifarResNet)
    return model.eval()


@pytest.mark.parametrize("num_classes", [10, 100])
def test_tiny_parameter_count_matches_hand_derivation(num_classes: int) -> None:
    actual = sum(parameter.numel() for parameter in tiny(num_classes).parameters())
    assert actual == expected_parameter_count(DEPTHS["resnet50"], num_classes, pool_size=2)


def test_tiny_parameter_count_anchors() -> None:
    # The CIFAR ResNet-50 (23,520,842 for 10 classes) with its head 2048·10 + 10 = 20,490 replaced by
    # 8192·C + C: 23,500,352 + 81,930 for 10 classes, + 819,300 for 100, + 1,638,600 for Tiny-ImageNet's 200.
    assert expected_parameter_count(DEPTHS["resnet50"], 10, pool_size=2) == 23_520_842 - 20_490 + 81_930 == 23_582_282
    assert expected_parameter_count(DEPTHS["resnet50"], 100, pool_size=2) == 23_500_352 + 819_300 == 24_319_652
    assert expected_parameter_count(DEPTHS["resnet50"], 200, pool_size=2) == 23_500_352 + 1_638_600 == 25_138_952


def test_tiny_architecture() -> None:
    model = tiny(10)
    assert (model.num_features, model.pool_size, model.blocks_per_stage) == (8192, 2, (3, 4, 6, 3))
    assert isinstance(model.pool, nn.AdaptiveAvgPool2d) and model.pool.output_size == 2
    stem_conv = model.stem[0]
    assert (stem_conv.kernel_size, stem_conv.stride, stem_conv.padding) == ((3, 3), (1, 1), (1, 1))
    assert not any(isinstance(module, nn.MaxPool2d) for module in model.modules())
    assert sum(isinstance(module, Bottleneck) for module in model.modules()) == 16


@pytest.mark.parametrize("num_classes", [10, 100])
def test_tiny_output_shapes_for_64x64(num_classes: int) -> None:
    model = tiny(num_classes)
    maps: list[torch.Tensor] = []
    handles = [stage.register_forward_hook(lambda _m, _i, out: maps.append(out)) for stage in model.stages]
    with torch.no_grad():
        features = model.features(torch.randn(2, 3, 64, 64))
    for handle in handles:
        handle.remove()
    assert [tuple(out.shape[1:]) for out in maps] == [(256, 64, 64), (512, 32, 32), (1024, 16, 16), (2048, 8, 8)]
    assert features.shape == (2, 8192)
    # FOCAL-R: AdaptiveAvgPool2d(2) then view(N, -1), i.e. channel-major averages of the four 4×4 cells
    cells = maps[-1].reshape(2, 2048, 2, 4, 2, 4).mean(dim=(3, 5))
    torch.testing.assert_close(features, cells.flatten(1))
    assert model.head(features).shape == (2, num_classes)


def test_tiny_he_normal_fan_out_init() -> None:
    # FOCAL-R's resnet_tiny_imagenet.py draws conv weights N(0, 2 / (k² · out_channels)); its CIFAR resnet.py
    # keeps PyTorch's default (kaiming_uniform_ with a=√5: std 1/√(3 · fan_in)).
    torch.manual_seed(0)
    cifar = create_model("resnet50", num_classes=10)
    for model, expected_std in (
        (tiny(10), lambda c: math.sqrt(2.0 / (9 * c.out_channels))),
        (cifar, lambda c: 1.0 / math.sqrt(3 * 9 * c.in_channels)),
    ):
        conv = model.stages[3][1].conv2  # 512 → 512, 3×3: 2.4M weights
        assert abs(conv.weight.detach().std().item() / expected_std(conv) - 1) < 0.01
    for conv in (module for module in tiny(10).modules() if isinstance(module, nn.Conv2d)):
        std = math.sqrt(2.0 / (conv.kernel_size[0] * conv.kernel_size[1] * conv.out_channels))
        tolerance = 4.0 / math.sqrt(2 * conv.weight.numel())  # ~4 standard errors of a sample std
        assert abs(conv.weight.detach().std().item() / std - 1) < tolerance, conv


def test_errors() -> None:
    with pytest.raises(
        ValueError,
        match=r"`blocks_per_stage` must have 4 entries \(one per stage\), got blocks_per_stage=\[3, 4\]\.",
    ):
        CifarResNet([3, 4], num_classes=10)
    with pytest.raises(ValueError, match=r"got blocks_per_stage\[i\]=0\."):
        CifarResNet([3, 0, 6, 3], num_classes=10)
    with pytest.raises(ValueError, match=r"`pool_size` must be an integer >= 1, got pool_size=0\."):
        CifarResNet([3, 4, 6, 3], num_classes=10, pool_size=0)
