"""Tests for calib/models/lenet.py: LeNet-5's layers, parameter count, padding of 28×28 inputs, seeding."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional

from calib.models import MODELS, LeNet5, create_model


def expected_parameter_count(num_classes: int, in_channels: int) -> int:
    """LeCun et al. 1998's layer sizes, counted by hand (weights + biases):
    C1 = 5·5·in·6 + 6, C3 = 5·5·6·16 + 16, F5 = 16·5·5·120 + 120, F6 = 120·84 + 84, head = 84·K + K."""
    c1 = 5 * 5 * in_channels * 6 + 6
    c3 = 5 * 5 * 6 * 16 + 16
    f5 = 16 * 5 * 5 * 120 + 120
    f6 = 120 * 84 + 84
    return c1 + c3 + f5 + f6 + 84 * num_classes + num_classes


def test_parameter_count_is_lenet5s():
    gray = create_model("lenet5", num_classes=10, in_channels=1)
    assert isinstance(gray, LeNet5) and "lenet5" in MODELS.names()
    assert sum(p.numel() for p in gray.parameters()) == expected_parameter_count(10, 1) == 61_706  # the usual "61.7k"
    color = create_model("lenet5", num_classes=10, in_channels=3)
    assert sum(p.numel() for p in color.parameters()) == expected_parameter_count(10, 3) == 62_006
    assert sum(p.numel() for p in create_model("lenet5", 100).parameters()) == expected_parameter_count(100, 3)


def test_layers():
    model = create_model("lenet5", num_classes=10, in_channels=1)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (1, 6, (5, 5), (0, 0)), (6, 16, (5, 5), (0, 0))]
    linears = [m for m in model.body if isinstance(m, nn.Linear)] + [model.head]
    assert [(fc.in_features, fc.out_features) for fc in linears] == [(400, 120), (120, 84), (84, 10)]
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 3 and model.num_features == 84
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 2
    assert not any(isinstance(m, nn.BatchNorm2d | nn.Tanh) for m in model.modules())


@pytest.mark.parametrize(("in_channels", "side"), [(1, 28), (3, 32), (1, 32)])
def test_shapes_and_features(in_channels: int, side: int):
    torch.manual_seed(0)
    model = create_model("lenet5", num_classes=10, in_channels=in_channels).eval()
    x = torch.randn(4, in_channels, side, side)
    with torch.no_grad():
        features, logits = model.features(x), model(x)
    assert features.shape == (4, 84) and logits.shape == (4, 10)
    assert (features >= 0).all()  # the penultimate layer's ReLU
    torch.testing.assert_close(logits, model.head(features))


def test_28_pixel_input_is_the_first_convolution_padded_by_2():
    """A 28×28 image gives what LeNet-5 with ``padding=2`` on its first convolution gives, computed here layer by
    layer with torch's functional ops."""
    torch.manual_seed(1)
    model = create_model("lenet5", num_classes=10, in_channels=1).eval()
    conv1, _, _, conv2, _, _, _, fc1, _, fc2, _ = model.body
    x = torch.randn(3, 1, 28, 28)
    h = functional.max_pool2d(functional.relu(functional.conv2d(x, conv1.weight, conv1.bias, padding=2)), 2)
    assert h.shape == (3, 6, 14, 14)
    h = functional.max_pool2d(functional.relu(functional.conv2d(h, conv2.weight, conv2.bias)), 2)
    assert h.shape == (3, 16, 5, 5)
    h = functional.relu(functional.linear(h.flatten(1), fc1.weight, fc1.bias))
    expected = functional.relu(functional.linear(h, fc2.weight, fc2.bias))
    with torch.no_grad():
        torch.testing.assert_close(model.features(x), expected)


def test_he_normal_weights_and_zero_biases():
    torch.manual_seed(0)
    model = create_model("lenet5", num_classes=10, in_channels=1)
    fc1 = model.body[7]
    assert fc1.weight.std().item() == pytest.approx(math.sqrt(2 / 400), rel=0.02)  # 48,000 draws of N(0, 2/fan_in)
    assert all((m.bias == 0).all() for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear))


def test_a_seed_reproduces_the_weights():
    def weights(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return create_model("lenet5", num_classes=10, in_channels=1).state_dict()

    first, again, other = weights(5), weights(5), weights(6)
    assert first.keys() == again.keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["body.0.weight"], other["body.0.weight"])


def test_larger_inputs_are_refused():
    model = create_model("lenet5", num_classes=10, in_channels=3)
    with pytest.raises(ValueError, match=r"lenet5 takes inputs of at most 32×32 pixels .* got 64×64\."):
        model(torch.randn(1, 3, 64, 64))
