"""Architectures by registered name: ``create_model("resnet110", num_classes=10)``.

Every model is a :class:`CalibModel`: ``model.features(x)`` gives the penultimate pooled features,
``model.head`` (an ``nn.Linear``) maps them to logits. ``calib.models.MODELS.names()`` lists the
valid architecture names.
"""

from __future__ import annotations

from collections.abc import Callable

from calib._registry import Registry
from calib.models._base import CalibModel

__all__ = [
    "MODELS",
    "BasicBlock",
    "Bottleneck",
    "CalibModel",
    "CifarResNet",
    "DenseBottleneck",
    "DenseNet",
    "DenseTransition",
    "HeResNet",
    "ModelFactory",
    "OptionABlock",
    "SmallCNN",
    "WideResNet",
    "create_model",
]

ModelFactory = Callable[..., CalibModel]
"""An entry of :data:`MODELS`: ``factory(num_classes: int, in_channels: int = 3) -> CalibModel``."""

MODELS: Registry[ModelFactory] = Registry("architecture")
"""Architecture name → factory. Defined before the modules below import it to register."""

# Importing the modules runs their registrations; they import MODELS from this package.
from calib.models.densenet import DenseBottleneck, DenseNet, DenseTransition  # noqa: E402
from calib.models.he_resnet import HeResNet, OptionABlock  # noqa: E402
from calib.models.resnet import Bottleneck, CifarResNet  # noqa: E402
from calib.models.small_cnn import SmallCNN  # noqa: E402
from calib.models.wide_resnet import BasicBlock, WideResNet  # noqa: E402


def create_model(name: str, num_classes: int, in_channels: int = 3) -> CalibModel:
    """Build the architecture registered under ``name``.

    An unknown name raises a ``KeyError`` that lists close matches and every valid name.
    """
    return MODELS.get(name)(num_classes=num_classes, in_channels=in_channels)
