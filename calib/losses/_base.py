"""A training loss as a registry entry: its config dataclass, which declares each hyperparameter once (its default
and its rule, :func:`~calib._config.checked_field`), and its ``nn.Module`` class, built from the config's fields by
name (:func:`build_loss`). :func:`register_loss` registers the pair; :class:`ConfiguredLoss` gives a loss class its
fields as attributes, checked by the config's rules, and its ``repr``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from calib._config import check, field_types
from calib._deprecation import warn_renamed
from calib.registries import LOSSES

__all__ = ["ConfiguredLoss", "LossSpec", "Reduction", "TrainingStateLoss", "build_loss", "check_reduction",
           "register_loss"]

Reduction = Literal["mean", "sum"]


def check_reduction(reduction: str) -> Reduction:
    """``reduction`` itself if it is "mean" or "sum"; otherwise a ``ConfigError`` naming both choices."""
    check(reduction in ("mean", "sum"), "reduction", reduction, "be 'mean' or 'sum'")
    return reduction  # type: ignore[return-value]


def build_loss(loss: type[nn.Module], params: Any, *, num_classes: int, reduction: Reduction) -> nn.Module:
    """``loss(**params' fields, reduction=reduction)``, and ``num_classes=num_classes`` when its constructor takes
    it: the one rule that builds a registered loss from its config."""
    values = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    sized = "num_classes" in inspect.signature(loss).parameters
    return loss(**values, reduction=reduction, **({"num_classes": num_classes} if sized else {}))


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: ``create(config, num_classes=..., reduction=...)`` returns an ``nn.Module`` called as
    ``loss(logits, targets, features)``; ``config`` is the loss's frozen config dataclass, ``loss`` its class
    (:func:`register_loss`).

    What the studies read from the spec (``calib.study.rows``): ``label``, the row of a Stage I trained with the
    loss (its defaults) in the tables and ``--methods`` (None: no row); ``order``, its place among the loss rows
    (ties: registration order); ``dataset_defaults``, config changes per dataset that the rows apply (FeDLaS's
    CIFAR-100 values); ``added_fields``, fields added after results were stored, with their defaults (left out
    of the identities at their default, so stored trials keep their ids).

    ``build``, a hand-written ``build(config, *, num_classes, reduction)`` factory instead of ``loss``, is the form
    before :func:`register_loss`: still accepted, with a ``DeprecationWarning``.
    """

    config: type
    build: Callable[..., nn.Module] | None
    description: str
    label: str | None = None
    order: float = math.inf
    dataset_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    added_fields: Mapping[str, Any] = field(default_factory=dict)
    loss: type[nn.Module] | None = None

    def __post_init__(self) -> None:
        if (self.build is None) == (self.loss is None):
            raise TypeError(f"LossSpec of {self.config.__name__} needs its loss class (`loss`) or, the older form, "
                            "a `build` factory: exactly one of them.")
        if self.build is not None:
            warn_renamed("LossSpec(build=...)", stacklevel=4)

    def create(self, params: Any, *, num_classes: int, reduction: Reduction) -> nn.Module:
        if self.loss is not None:
            return build_loss(self.loss, params, num_classes=num_classes, reduction=reduction)
        assert self.build is not None  # __post_init__: one of the two
        return self.build(params, num_classes=num_classes, reduction=reduction)


def _check_takes_fields(config: type, loss: type[nn.Module]) -> None:
    """``TypeError`` unless ``loss`` takes each field of ``config`` and ``reduction`` as keyword arguments."""
    parameters = inspect.signature(loss).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    missing = [name for name in [*field_types(config), "reduction"] if name not in parameters
               or parameters[name].kind is inspect.Parameter.POSITIONAL_ONLY]
    if missing:
        raise TypeError(f"{loss.__name__} must take each field of {config.__name__} and `reduction` as keyword "
                        f"arguments of the same name; it has no {', '.join(repr(m) for m in missing)}.")


def register_loss(
    name: str,
    config: type,
    loss: type[nn.Module],
    description: str,
    *,
    label: str | None = None,
    order: float = math.inf,
    dataset_defaults: Mapping[str, Mapping[str, Any]] | None = None,
    added_fields: Mapping[str, Any] | None = None,
) -> None:
    """Register training loss ``name``: its ``config`` dataclass and its ``loss`` class, which takes each config
    field, ``reduction`` and (if it needs it) ``num_classes`` as keyword arguments (checked here) and is built
    from the config by :func:`build_loss`. ``label``, ``order``, ``dataset_defaults`` and ``added_fields``: see
    :class:`LossSpec`."""
    _check_takes_fields(config, loss)
    LOSSES.register(name)(LossSpec(config, None, description, label=label, order=order,
                                   dataset_defaults=dict(dataset_defaults or {}),
                                   added_fields=dict(added_fields or {}), loss=loss))


class ConfiguredLoss(nn.Module):
    """A loss whose hyperparameters are the fields of its config dataclass: ``super().__init__(Config, locals())``
    in the loss's ``__init__`` (whose keyword defaults are read from ``Config``) checks them by the config's rules
    (it builds ``Config`` from them: one message, the config's), sets each as an attribute (ints of a float
    field as floats), and checks ``reduction``. ``extra_repr`` lists them."""

    def __init__(self, config: type, values: Mapping[str, Any]) -> None:
        super().__init__()
        types = field_types(config)
        params = config(**{name: values[name] for name in types})
        self._field_names = tuple(types)
        for name, tp in types.items():
            value = getattr(params, name)
            setattr(self, name, float(value) if tp is float and not isinstance(value, bool) else value)
        self.reduction = check_reduction(values["reduction"])

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in (*self._field_names, "reduction"))


class TrainingStateLoss(nn.Module):
    """A loss that keeps state across steps and epochs; Stage I (:func:`calib.training.stage1.train_stage1`) calls
    its hooks. The state lives in buffers, so a Stage-I checkpoint saves it with the loss's ``state_dict``.

    - ``needs_sample_indices``: the loss is called as ``loss(logits, targets, features, indices=...)``, ``indices``
      the batch's positions in the training split (CRL's correctness history).
    - :meth:`start_training` once, before the first epoch (and before a checkpoint's state is loaded back).
    - :meth:`end_epoch` after each epoch's training steps; :meth:`observe_validation` after each epoch with the
      validation split's logits and labels (AdaFocal's γ update).
    """

    needs_sample_indices: ClassVar[bool] = False

    def start_training(self, num_samples: int) -> None:
        """Size the state for a training split of ``num_samples`` samples."""

    def end_epoch(self, epoch: int) -> None:
        """``epoch`` (0-based) has finished its training steps."""

    def observe_validation(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """The validation split's logits (N, C) and labels (N,) after an epoch, from the model in eval mode."""
