"""Contract tests over every registered architecture (calib/models/__init__.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from calib.models import MODELS, CalibModel, create_model

NUM_CLASSES = 7
BATCH = 2
SIDE = 32  # every architecture accepts 32×32 inputs (small_cnn: any side ≥ 2)


@pytest.fixture(scope="module", params=MODELS.names(), ids=MODELS.names())
def model_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("in_channels", [1, 3])
def test_forward_and_features_shapes(model_name: str, in_channels: int) -> None:
    torch.manual_seed(0)
    model = create_model(model_name, num_classes=NUM_CLASSES, in_channels=in_channels).eval()
    assert isinstance(model, CalibModel)
    assert model.num_classes == NUM_CLASSES
    assert isinstance(model.head, nn.Linear)
    assert (model.head.in_features, model.head.out_features) == (model.num_features, NUM_CLASSES)
    x = torch.randn(BATCH, in_channels, SIDE, SIDE)
    with torch.no_grad():
        logits = model(x)
        features = model.features(x)
        assert logits.shape == (BATCH, NUM_CLASSES)
        assert features.shape == (BATCH, model.num_features)
        torch.testing.assert_close(logits, model.head(features))


def test_backward(model_name: str) -> None:
    torch.manual_seed(0)
    model = create_model(model_name, num_classes=NUM_CLASSES).train()
    x = torch.randn(BATCH, 3, SIDE, SIDE)
    loss = nn.functional.cross_entropy(model(x), torch.tensor([0, NUM_CLASSES - 1]))
    loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
    assert model.head.weight.grad.abs().sum() > 0


def test_factory_signature(model_name: str) -> None:
    model = MODELS.get(model_name)(NUM_CLASSES)  # in_channels defaults to 3
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, SIDE, SIDE)).shape == (1, NUM_CLASSES)


def test_errors(model_name: str) -> None:
    with pytest.raises(ValueError, match=r"`num_classes` must be an integer >= 1, got num_classes=0\."):
        create_model(model_name, num_classes=0)
    with pytest.raises(ValueError, match=r"`in_channels` must be an integer >= 1, got in_channels=0\."):
        create_model(model_name, num_classes=NUM_CLASSES, in_channels=0)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(
        KeyError,
        match=r"Unknown architecture 'resnet51'\. Did you mean 'resnet50'.*Valid architecture names: ",
    ):
        create_model("resnet51", num_classes=10)


def test_registered_names() -> None:
    assert {"small_cnn", "resnet50", "resnet110", "resnet50_tiny", "wrn26_10", "densenet121"} <= set(MODELS.names())
