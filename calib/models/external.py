"""torchvision and timm classifiers as Stage-I backbones (their checkpoints: :mod:`calib.models.checkpoints`).

An external architecture is named ``"torchvision:<name>"`` (a classification model of
``torchvision.models.list_models(module=torchvision.models)``) or ``"timm:<name>"`` (a name of
``timm.list_models()``; needs ``pip install timm``). :func:`external_model` builds it with random
weights and splits it into a backbone and its final ``nn.Linear``: the linear layer becomes the
:class:`ExternalModel`'s ``head`` and is replaced by ``nn.Identity()`` inside the backbone, so
``features(x)`` is the backbone's output flattened to (N, d) and ``head(features(x))`` is the
original model's forward.

The head is found automatically (timm: the module its ``pretrained_cfg["classifier"]`` names, else
``get_classifier()``; torchvision: the last ``nn.Linear`` of ``named_modules()``) or given as a dotted
module path (``head="classifier.3"``; ``--head`` / ``source.head``). Give ``input_shape`` to verify the
split with one forward pass at construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from calib._config import did_you_mean
from calib._registry import UnknownNameError
from calib.models import MODELS
from calib.models._base import CalibModel
from calib.models._checks import check_positive_int

__all__ = ["EXTERNAL_SOURCES", "ExternalModel", "HeadNotFoundError", "check_arch", "external_model", "is_external"]

EXTERNAL_SOURCES = ("torchvision", "timm")
"""The prefixes of external architecture names, ``"<source>:<model>"``."""

_LIST_HINT = {
    "torchvision": 'python -c "import torchvision; print(torchvision.models.list_models(module=torchvision.models))"',
    "timm": "python -c \"import timm; print(timm.list_models('*resnet*'))\"",
}
_MAX_LISTED_LINEARS = 12


class HeadNotFoundError(ValueError):
    """The model's final linear layer could not be found, or splitting there does not reproduce its logits."""


# ---------------------------------------------------------------------------------------------------------------------
# Names


def is_external(name: str) -> bool:
    """Whether ``name`` is an external architecture name (``"<source>:<model>"``); a name registered in
    ``MODELS`` (by calib or a plugin) never is, even with a colon."""
    return ":" in name and name not in MODELS


def _import_timm() -> Any:
    try:
        # optional dependency (the `timm` extra)
        import timm
    except ImportError as error:
        raise ImportError(
            "timm architectures ('timm:<name>') need the timm package, which is not installed: pip install timm"
        ) from error
    return timm


def _unknown(kind: str, name: str, candidates: Sequence[str], prefix: str, how_to_list: str) -> UnknownNameError:
    hint = did_you_mean(name, candidates, n=3, show=lambda c: repr(prefix + c))
    return UnknownNameError(f"Unknown {kind} {prefix + name!r}.{hint} List the valid names with: {how_to_list}")


def _split(name: str) -> tuple[str, str]:
    """``"torchvision:resnet18"`` → ``("torchvision", "resnet18")``; an unknown prefix is an UnknownNameError."""
    source, _, model = name.partition(":")
    if source not in EXTERNAL_SOURCES:
        hint = did_you_mean(source, EXTERNAL_SOURCES, show=lambda c: f"'{c}:{model}'")
        raise UnknownNameError(
            f"Unknown architecture source {source + ':'!r} in {name!r}.{hint} External architectures are named "
            f"'torchvision:<name>' or 'timm:<name>'; calib's own architectures have no prefix "
            f"({', '.join(MODELS.names())})."
        )
    return source, model


def check_arch(name: str) -> None:
    """Raise unless ``name`` is a valid architecture name: calib's own (``MODELS``), ``torchvision:<name>``
    or ``timm:<name>``.

    An unknown name raises :class:`calib._registry.UnknownNameError` (a ``KeyError``) with close
    matches and how to list the valid names; a ``timm:`` name without timm installed raises
    ``ImportError`` saying ``pip install timm``. Builds nothing.
    """
    if not is_external(name):
        MODELS.get(name)
        return
    source, model = _split(name)
    if source == "torchvision":
        # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
        import torchvision

        valid = torchvision.models.list_models(module=torchvision.models)
        if model not in valid:
            raise _unknown("torchvision classification model", model, valid, "torchvision:", _LIST_HINT[source])
    else:
        timm = _import_timm()
        if not model or not timm.is_model(model):
            raise _unknown("timm model", model, timm.list_models(), "timm:", _LIST_HINT[source])


# ---------------------------------------------------------------------------------------------------------------------
# The wrapper


def _linear_listing(model: nn.Module) -> str:
    linears = [(path, module) for path, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not linears:
        return "The model has no nn.Linear module."
    shown = linears[-_MAX_LISTED_LINEARS:]
    lines = [f"  {path}: Linear({m.in_features} → {m.out_features})" for path, m in shown]
    earlier = f" (the last {len(shown)} of {len(linears)})" if len(shown) < len(linears) else ""
    return "Its nn.Linear modules" + earlier + ":\n" + "\n".join(lines)


def _head_error(arch: str, model: nn.Module | str, problem: str) -> HeadNotFoundError:
    """``model``: the model whose linear layers to list, or that listing already made."""
    listing = model if isinstance(model, str) else _linear_listing(model)
    return HeadNotFoundError(
        f"{arch}: {problem} {listing}\nPass the path of the final linear layer (the one that "
        f"outputs the class logits) with `--head` (trial-config key `source.head`); calib splits a model into "
        f"features and that one nn.Linear, so a model without one cannot be used."
    )


def _resolve_head(model: nn.Module, arch: str, source: str, head: str | None, num_classes: int | None) -> str:
    """The dotted path of the model's final linear layer, checked to be an ``nn.Linear`` with ``num_classes``
    outputs."""
    if head is None:
        head = _auto_head(model, source)
        if head is None:
            classifier = (getattr(model, "pretrained_cfg", None) or {}).get("classifier")
            several = f" Its logits combine several classifiers ({', '.join(classifier)})." if (
                isinstance(classifier, (list, tuple)) and len(classifier) > 1) else ""
            raise _head_error(arch, model, f"cannot find the final linear layer automatically.{several}")
    module = _get(model, head) if head else None
    if module is None:
        problem = f"the model has no module {head!r}."
    else:
        problem = f"the module {head!r} is {type(module).__name__}, not an nn.Linear."
    if not isinstance(module, nn.Linear):
        raise _head_error(arch, model, problem)
    if num_classes is not None and module.out_features != num_classes:
        problem = f"the head {head!r} has {module.out_features} outputs, but the dataset has {num_classes} classes."
        raise _head_error(arch, model, problem)
    return head


def _auto_head(model: nn.Module, source: str) -> str | None:
    if source == "timm":
        classifier = (getattr(model, "pretrained_cfg", None) or {}).get("classifier")
        if isinstance(classifier, str) and isinstance(_get(model, classifier), nn.Linear):
            return classifier
        if isinstance(classifier, (list, tuple)) and len(classifier) > 1:
            return None  # e.g. distilled DeiT: the logits average two heads, no single linear layer gives them
        get_classifier = getattr(model, "get_classifier", None)
        found = get_classifier() if callable(get_classifier) else None
        for path, module in model.named_modules():
            if module is found and isinstance(module, nn.Linear):
                return path
        return None
    last = None
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = path
    return last


def _get(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _main_output(output: Any) -> torch.Tensor:
    """The logits of a model output; torchvision's Inception/GoogLeNet return (logits, aux...) in training."""
    return output if isinstance(output, torch.Tensor) else output[0]


class ExternalModel(CalibModel):
    """A classifier split at its final linear layer: ``features`` = the rest, ``head`` = that layer.

    ``model`` is modified in place: the module at ``head_name`` (an ``nn.Linear``) moves to
    ``self.head`` and is replaced by ``nn.Identity()``; the rest is ``self.backbone``. ``features(x)``
    is ``backbone(x)`` flattened to (N, head.in_features), so ``self(x)`` equals the original forward.
    When the backbone returns a tuple (torchvision's Inception v3 and GoogLeNet in training mode:
    logits plus auxiliary logits), the first entry is used and the auxiliary heads get no gradient.

    ``repeat_channels=3`` repeats a 1-channel input to 3 channels before the backbone (torchvision
    models have a fixed 3-channel stem; this is how they take grayscale images). Attributes:
    ``arch`` (the architecture name), ``head_name`` (the dotted path of the head in the original
    model), ``num_features``, ``num_classes``.
    """

    def __init__(self, model: nn.Module, head_name: str, *, arch: str, repeat_channels: int = 1) -> None:
        head = _get(model, head_name) if head_name else None
        if not isinstance(head, nn.Linear):
            raise _head_error(arch, model, f"{head_name!r} is not an nn.Linear module of the model.")
        # nn.Module.__init__, not CalibModel.__init__: the base class would draw a throwaway nn.Linear from the
        # global RNG, so a seeded external_model would differ from the same model built directly.
        nn.Module.__init__(self)
        self.arch = arch
        self.head_name = head_name
        self.repeat_channels = repeat_channels
        self.num_features = head.in_features
        self.num_classes = head.out_features
        parent_path, _, attribute = head_name.rpartition(".")
        setattr(model.get_submodule(parent_path), attribute, nn.Identity())
        self.backbone = model
        self.head = head

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The backbone's output flattened to (N, num_features) (a 1-channel input repeated to 3 channels first
        when ``repeat_channels`` is 3)."""
        if self.repeat_channels != 1:
            x = x.repeat(1, self.repeat_channels, 1, 1)
        features = torch.flatten(_main_output(self.backbone(x)), 1)
        if features.shape[1] != self.num_features:
            raise HeadNotFoundError(
                f"{self.arch}: the backbone gives {features.shape[1]} features per input, but the head "
                f"{self.head_name!r} expects {self.num_features}: {self.head_name!r} is not the final linear layer "
                f"applied to pooled features. Pass the right one with `--head` (trial-config key `source.head`)."
            )
        return features

    def extra_repr(self) -> str:
        return f"arch={self.arch!r}, head_name={self.head_name!r}"


def external_model(
    name: str,
    num_classes: int,
    in_channels: int = 3,
    *,
    head: str | None = None,
    input_shape: Sequence[int] | None = None,
) -> ExternalModel:
    """Build ``"torchvision:<name>"`` or ``"timm:<name>"`` with random weights, split at its final linear layer.

    torchvision: ``torchvision.models.get_model(model, weights=None, num_classes=num_classes)``; it takes
    3 channels, or 1 channel repeated to 3 by the wrapper (``in_channels=1``); other counts are a
    ``ValueError``. timm: ``timm.create_model(model, pretrained=False, num_classes=num_classes,
    in_chans=in_channels)``.

    ``head`` is the dotted module path of the final ``nn.Linear`` (``"fc"``, ``"classifier.3"``,
    ``"heads.head"``); ``None`` finds it (timm: ``pretrained_cfg["classifier"]`` or ``get_classifier()``;
    torchvision: the last ``nn.Linear`` of ``named_modules()``). A missing or non-linear head, or one
    without ``num_classes`` outputs, is a :class:`HeadNotFoundError` listing the model's linear layers.
    With ``input_shape`` = (C, H, W), one eval-mode forward of a fixed random input checks that the features have
    ``head.in_features`` values and that the wrapper's logits equal the original model's
    (:class:`HeadNotFoundError` otherwise).
    """
    check_arch(name)
    if not is_external(name):
        raise ValueError(f"external_model builds 'torchvision:<name>' or 'timm:<name>' architectures, got {name!r}.")
    check_positive_int("num_classes", num_classes)
    check_positive_int("in_channels", in_channels)
    if input_shape is not None:
        input_shape = tuple(input_shape)
        if len(input_shape) != 3 or input_shape[0] != in_channels:
            raise ValueError(
                f"`input_shape` must be (C, H, W) with C = in_channels = {in_channels}, got input_shape={input_shape}."
            )
    source, model_name = _split(name)
    repeat = 1
    if source == "torchvision":
        # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
        import torchvision

        if in_channels not in (1, 3):
            raise ValueError(
                f"{name}: torchvision models take 3-channel images (1-channel ones are repeated to 3), got "
                f"in_channels={in_channels}. timm models take any channel count (in_chans)."
            )
        repeat = 3 if in_channels == 1 else 1
        model = torchvision.models.get_model(model_name, weights=None, num_classes=num_classes)
    else:
        timm = _import_timm()
        model = timm.create_model(model_name, pretrained=False, num_classes=num_classes, in_chans=in_channels)
    head_name = _resolve_head(model, name, source, head, num_classes)
    if input_shape is None:
        return ExternalModel(model, head_name, arch=name, repeat_channels=repeat)
    was_training = model.training
    # A fixed-seed random input (not zeros: a fresh network maps zeros to all-zero features, which any split passes).
    x = torch.randn(2, *input_shape, generator=torch.Generator().manual_seed(0))
    listing = _linear_listing(model)  # before the split replaces the head by nn.Identity
    with torch.no_grad():
        try:
            expected = _main_output(model.eval()(x.repeat(1, repeat, 1, 1)))
        except Exception as error:
            raise ValueError(f"{name} cannot take inputs of shape {input_shape}: {error}") from error
        wrapper = ExternalModel(model, head_name, arch=name, repeat_channels=repeat).eval()
        try:
            features = torch.flatten(_main_output(wrapper.backbone(x.repeat(1, repeat, 1, 1))), 1)
        except Exception as error:
            raise _head_error(
                name, listing,
                f"with {head_name!r} replaced by nn.Identity the model fails on a {input_shape} input ({error}); "
                f"{head_name!r} is not its final linear layer.",
            ) from error
        if features.shape != (2, wrapper.num_features):
            raise _head_error(
                name, listing,
                f"with {head_name!r} as the head, the features of one {input_shape} input have shape "
                f"{tuple(features.shape[1:])}, not ({wrapper.num_features},) as {head_name!r} takes.",
            )
        logits = wrapper.head(features)
        if logits.shape != expected.shape or not torch.allclose(logits, expected, rtol=1e-4, atol=1e-5):
            raise _head_error(
                name, listing,
                f"splitting at {head_name!r} does not reproduce the model's logits (the model transforms the output "
                f"of {head_name!r} further, or {head_name!r} is not its final linear layer).",
            )
    return wrapper.train(was_training)
