"""Tests for calib/models/he_resnet.py: He et al.'s CIFAR ResNet-20, shapes, option-A shortcuts, parameter count."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from calib.models import HeResNet, OptionABlock, create_model


def expected_parameter_count(num_classes: int, in_channels: int = 3, blocks: int = 3) -> int:
    """Count derived from the architecture description (He et al. 2016 §4.2), not from the module.

    total = stem + Σ_stages Σ_blocks block + head, with
      stem  = conv3×3(in_channels → 16) + BN(16)
      block = conv3×3(c_in → w) + BN(w) + conv3×3(w → w) + BN(w)   (option-A shortcuts have no parameters)
      head  = 64 · C + C
    where w ∈ (16, 32, 64) per stage and c_in = 16 for the first block, w of the previous block otherwise.
    """
    total = in_channels * 16 * 9 + 2 * 16
    c_in = 16
    for width in (16, 32, 64):
        for _ in range(blocks):
            total += c_in * width * 9 + 2 * width + width * width * 9 + 2 * width
            c_in = width
    return total + 64 * num_classes + num_classes


class TestResNet20:
    def test_main(self) -> None:
        model = create_model("resnet20", num_classes=10)
        assert isinstance(model, HeResNet) and model.num_features == 64 and model.blocks_per_stage == 3
        count = sum(parameter.numel() for parameter in model.parameters())
        assert count == expected_parameter_count(10) == 269_722  # the paper's "0.27M"
        gray = create_model("resnet20", num_classes=10, in_channels=1)
        assert sum(p.numel() for p in gray.parameters()) == expected_parameter_count(10, 1) == 269_722 - 2 * 16 * 9
        assert sum(p.numel() for p in create_model("resnet20", 100).parameters()) == expected_parameter_count(100)
        convs = [module for module in model.modules() if isinstance(module, nn.Conv2d)]
        assert len(convs) == 19 and all(conv.kernel_size == (3, 3) and conv.bias is None for conv in convs)
        assert sum(isinstance(module, OptionABlock) for module in model.modules()) == 9
        assert not any(isinstance(module, nn.MaxPool2d) for module in model.modules())

    @pytest.mark.parametrize(("in_channels", "side", "maps"), [
        (1, 28, [(16, 28, 28), (32, 14, 14), (64, 7, 7)]),
        (3, 32, [(16, 32, 32), (32, 16, 16), (64, 8, 8)]),
    ])
    def test_shapes(self, in_channels: int, side: int, maps: list[tuple[int, int, int]]) -> None:
        torch.manual_seed(0)
        model = create_model("resnet20", num_classes=10, in_channels=in_channels).eval()
        outputs: list[torch.Tensor] = []
        hooks = [stage.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for stage in model.stages]
        x = torch.randn(2, in_channels, side, side)
        with torch.no_grad():
            features = model.features(x)
            logits = model(x)
        for hook in hooks:
            hook.remove()
        assert [tuple(out.shape[1:]) for out in outputs[:3]] == maps
        assert features.shape == (2, 64) and logits.shape == (2, 10)
        torch.testing.assert_close(features, outputs[2].mean(dim=(2, 3)))  # global average pool
        torch.testing.assert_close(logits, model.head(features))

    def test_option_a_shortcut(self) -> None:
        block = OptionABlock(16, 32, stride=2)
        x = torch.randn(2, 16, 7, 7)
        shortcut = block.shortcut(x)
        assert shortcut.shape == (2, 32, 4, 4)  # ⌈7 / 2⌉, as the stride-2 convolution gives
        assert torch.equal(shortcut[:, :16], x[:, :, ::2, ::2])
        assert torch.equal(shortcut[:, 16:], torch.zeros(2, 16, 4, 4))
        assert block(x).shape == (2, 32, 4, 4)
        same = OptionABlock(16, 16)
        assert same.shortcut(x) is x
        # With the residual branch zeroed (BN weight 0), a block is ReLU of its shortcut.
        nn.init.zeros_(block.bn2.weight)
        with torch.no_grad():
            torch.testing.assert_close(block.eval()(x), torch.relu(shortcut))

    def test_he_normal_fan_out_init(self) -> None:
        torch.manual_seed(0)
        conv = create_model("resnet20", num_classes=10).stages[2][1].conv2  # 64 → 64, 36,864 weights
        assert abs(conv.weight.std().item() / math.sqrt(2.0 / (9 * 64)) - 1) < 0.02

    def test_errors(self) -> None:
        with pytest.raises(ValueError, match=r"`depth` must be 6n \+ 2 with n >= 1 .*, got depth=21\."):
            HeResNet(depth=21, num_classes=10)
        with pytest.raises(ValueError, match=r"`depth` must be an integer >= 1, got depth=0\."):
            HeResNet(depth=0, num_classes=10)
        with pytest.raises(ValueError, match=r"`planes` must be >= in_planes=32 \(option A only pads\), got planes=16"):
            OptionABlock(32, 16)
