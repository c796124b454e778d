"""Architectures by registered name: ``create_model("resnet110", num_classes=10)``.

Every model is a :class:`CalibModel`: ``model.features(x)`` gives the penultimate pooled features,
``model.head`` (an ``nn.Linear``) maps them to logits. ``calib.models.MODELS.names()`` lists the
valid architecture names. torchvision and timm classifiers are named ``"torchvision:<name>"`` and
``"timm:<name>"`` (:mod:`calib.models.external`); :func:`check_arch` validates any name. Users'
checkpoints load into either kind through :mod:`calib.models.checkpoints`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from calib.models._base import CalibModel
from calib.registries import MODELS

__all__ = [
    "MODELS",
    "BasicBlock",
    "Bottleneck",
    "CalibModel",
    "CheckpointError",
    "CifarResNet",
    "DenseBottleneck",
    "DenseNet",
    "DenseTransition",
    "ExternalModel",
    "HeResNet",
    "HeadNotFoundError",
    "LeNet5",
    "ModelFactory",
    "OptionABlock",
    "SmallCNN",
    "WideResNet",
    "check_arch",
    "checkpoint_state_dict",
    "create_model",
    "external_model",
    "load_checkpoint_into",
    "read_checkpoint",
]

ModelFactory = Callable[..., CalibModel]
"""An entry of :data:`MODELS`: ``factory(num_classes: int, in_channels: int = 3) -> CalibModel``."""

# Architecture name → factory; the modules below register into it (calib.registries).

# Importing the modules runs their registrations; they import MODELS from this package.
from calib.models.checkpoints import (  # noqa: E402
    CheckpointError,
    checkpoint_state_dict,
    load_checkpoint_into,
    read_checkpoint,
)
from calib.models.densenet import DenseBottleneck, DenseNet, DenseTransition  # noqa: E402
from calib.models.external import (  # noqa: E402
    ExternalModel,
    HeadNotFoundError,
    check_arch,
    external_model,
    is_external,
)
from calib.models.he_resnet import HeResNet, OptionABlock  # noqa: E402
from calib.models.lenet import LeNet5  # noqa: E402
from calib.models.resnet import Bottleneck, CifarResNet  # noqa: E402
from calib.models.small_cnn import SmallCNN  # noqa: E402
from calib.models.wide_resnet import BasicBlock, WideResNet  # noqa: E402


def create_model(
    name: str,
    num_classes: int,
    in_channels: int = 3,
    *,
    head: str | None = None,
    input_shape: Sequence[int] | None = None,
) -> CalibModel:
    """Build the architecture registered under ``name``, or an external ``"torchvision:<name>"`` /
    ``"timm:<name>"`` one through :func:`calib.models.external.external_model` (``head``: the dotted path of
    its final linear layer, found automatically when ``None``; ``input_shape``: (C, H, W) to verify the
    split with one forward pass).

    calib's own architectures take no ``head`` (a ``ValueError``) and ignore ``input_shape``. An unknown
    name raises a ``KeyError`` that lists close matches and how to find the valid names.
    """
    if is_external(name):
        return external_model(name, num_classes, in_channels, head=head, input_shape=input_shape)
    if head is not None:
        raise ValueError(
            f"`head` selects the final linear layer of a torchvision or timm model; calib's own architecture "
            f"{name!r} has its head built in, so leave it out (got head={head!r})."
        )
    return MODELS.get(name)(num_classes=num_classes, in_channels=in_channels)
