"""torchvision and timm classifiers as Stage-I backbones, and users' checkpoints loaded into them.

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

Checkpoints: :func:`read_checkpoint` reads a file with ``weights_only=True`` (tensors only, never
pickled code) and :func:`checkpoint_state_dict` unwraps the usual containers; :func:`load_checkpoint_into`
maps the original model's keys onto the wrapper (``<head>.weight`` → ``head.weight``, the others →
``backbone.<key>``) and loads them strictly.
"""

from __future__ import annotations

import difflib
import os
import pickle
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from calib._registry import UnknownNameError
from calib.models import MODELS
from calib.models._base import CalibModel
from calib.models._checks import check_positive_int

__all__ = [
    "EXTERNAL_SOURCES",
    "CheckpointError",
    "ExternalModel",
    "HeadNotFoundError",
    "check_arch",
    "checkpoint_state_dict",
    "external_model",
    "is_external",
    "load_checkpoint_into",
    "read_checkpoint",
]

EXTERNAL_SOURCES = ("torchvision", "timm")
"""The prefixes of external architecture names, ``"<source>:<model>"``."""

STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "net", "module")
"""Keys under which a checkpoint dict may hold the state dict, tried in this order."""

STRIPPED_PREFIXES = ("module.", "_orig_mod.")
"""Key prefixes of DataParallel/DistributedDataParallel and of ``torch.compile``, removed on load."""

_LIST_HINT = {
    "torchvision": 'python -c "import torchvision; print(torchvision.models.list_models(module=torchvision.models))"',
    "timm": "python -c \"import timm; print(timm.list_models('*resnet*'))\"",
}
_MAX_LISTED_LINEARS = 12
_MAX_LISTED_KEYS = 5


class HeadNotFoundError(ValueError):
    """The model's final linear layer could not be found, or splitting there does not reproduce its logits."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, is not a state dict, or does not fit the model."""


# ---------------------------------------------------------------------------------------------------------------------
# Names


def is_external(name: str) -> bool:
    """Whether ``name`` is an external architecture name (``"<source>:<model>"``); a name registered in
    ``MODELS`` (by calib or a plugin) never is, even with a colon."""
    return ":" in name and name not in MODELS


def _import_timm() -> Any:
    try:
        import timm
    except ImportError as error:
        raise ImportError(
            "timm architectures ('timm:<name>') need the timm package, which is not installed: pip install timm"
        ) from error
    return timm


def _unknown(kind: str, name: str, candidates: Sequence[str], prefix: str, how_to_list: str) -> UnknownNameError:
    close = difflib.get_close_matches(name, candidates, n=3)
    hint = f" Did you mean {' or '.join(repr(prefix + c) for c in close)}?" if close else ""
    return UnknownNameError(f"Unknown {kind} {prefix + name!r}.{hint} List the valid names with: {how_to_list}")


def _split(name: str) -> tuple[str, str]:
    """``"torchvision:resnet18"`` → ``("torchvision", "resnet18")``; an unknown prefix is an UnknownNameError."""
    source, _, model = name.partition(":")
    if source not in EXTERNAL_SOURCES:
        close = difflib.get_close_matches(source, EXTERNAL_SOURCES, n=1)
        hint = f" Did you mean '{close[0]}:{model}'?" if close else ""
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


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoints


def _is_state_dict(obj: object) -> bool:
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def _describe(obj: object) -> str:
    if isinstance(obj, Mapping):
        keys = list(obj)
        shown = ", ".join(repr(k) for k in keys[:10]) + (f", … ({len(keys)} keys)" if len(keys) > 10 else "")
        return f"a {type(obj).__name__} with top-level keys [{shown}]" if keys else f"an empty {type(obj).__name__}"
    return f"an object of type {type(obj).__module__}.{type(obj).__qualname__}"


def _strip_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    stripping = True
    while stripping:
        stripping = False
        for prefix in STRIPPED_PREFIXES:
            if state and all(key.startswith(prefix) for key in state):
                state = {key[len(prefix) :]: value for key, value in state.items()}
                stripping = True
    return state


def checkpoint_state_dict(obj: object) -> dict[str, torch.Tensor]:
    """The state dict in a loaded checkpoint ``obj``, with DataParallel/DDP (``module.``) and ``torch.compile``
    (``_orig_mod.``) key prefixes removed.

    ``obj`` may be a state dict (a mapping of str → Tensor), a dict holding one under ``"state_dict"``,
    ``"model_state_dict"``, ``"model"``, ``"net"`` or ``"module"`` (the first that holds one), or an
    ``nn.Module``. Anything else is a :class:`CheckpointError` naming what was found.
    """
    if isinstance(obj, nn.Module):
        return _strip_prefixes(dict(obj.state_dict()))
    if _is_state_dict(obj):
        return _strip_prefixes(dict(obj))  # type: ignore[call-overload]
    if isinstance(obj, Mapping):
        for key in STATE_DICT_KEYS:
            value = obj.get(key)
            if isinstance(value, nn.Module) or _is_state_dict(value):
                return checkpoint_state_dict(value)
    raise CheckpointError(
        f"The checkpoint is not a state dict: found {_describe(obj)}. Expected a mapping of parameter names to "
        f"tensors (torch.save(model.state_dict(), path)), or a dict holding one under one of the keys "
        f"{', '.join(repr(k) for k in STATE_DICT_KEYS)}."
    )


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Load the file at ``path`` with ``torch.load(map_location="cpu", weights_only=True)`` and return
    :func:`checkpoint_state_dict` of it.

    A missing file, a directory, an unreadable file or one torch cannot load is a :class:`CheckpointError`
    naming the path and the reason.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"Checkpoint {path!r}: no such file.")
    if os.path.isdir(path):
        raise CheckpointError(f"Checkpoint {path!r} is a directory, not a file saved with torch.save.")
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise CheckpointError(f"Checkpoint {path!r} cannot be read: {error.strerror or error}.") from error
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        match = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\n\s*\n|$)", str(error), re.DOTALL)
        reason = " ".join((match.group(1) if match else str(error)).split())
        raise CheckpointError(
            f"Checkpoint {path!r} cannot be loaded: {reason[:400]}. calib loads only weights (torch.load with "
            f"weights_only=True, never pickled code), so save a state dict: torch.save(model.state_dict(), path). "
            f"A corrupt file or one not written by torch.save fails the same way."
        ) from error
    except Exception as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise CheckpointError(
            f"Checkpoint {path!r} cannot be loaded by torch.load (corrupt, truncated or not a torch.save file): "
            f"{type(error).__name__}: {reason[:400]}"
        ) from error
    try:
        return checkpoint_state_dict(obj)
    except CheckpointError as error:
        raise CheckpointError(f"Checkpoint {path!r}: {error}") from None


def _listed(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:_MAX_LISTED_KEYS])
    return shown + (f", … ({len(keys)} in all)" if len(keys) > _MAX_LISTED_KEYS else "")


def load_checkpoint_into(model: CalibModel, state: Mapping[str, torch.Tensor]) -> None:
    """Load ``state`` (see :func:`checkpoint_state_dict`) into ``model`` strictly.

    For an :class:`ExternalModel`, ``state`` holds the original model's keys: ``<head_name>.weight/bias``
    go to ``head.weight/bias``, every other key to ``backbone.<key>`` (a state dict of the wrapper itself,
    with exactly its keys, is used as it is). calib's own models take the keys as they are. A head of
    another shape, missing or unexpected keys, or other mismatched shapes are a :class:`CheckpointError`.
    """
    expected = model.state_dict()
    if isinstance(model, ExternalModel) and set(state) != set(expected):
        head_keys = {f"{model.head_name}.weight": "head.weight", f"{model.head_name}.bias": "head.bias"}
        mapped = {head_keys.get(key, "backbone." + key): value for key, value in state.items()}
        back = {v: k for k, v in head_keys.items()}

        def original(key: str) -> str:
            return back.get(key, key.removeprefix("backbone."))

        head_label = f"{model.head_name}.weight"
    else:
        mapped = dict(state)

        def original(key: str) -> str:
            return key

        head_label = "head.weight"

    head_weight = mapped.get("head.weight")
    if head_weight is not None and tuple(head_weight.shape) != tuple(model.head.weight.shape):
        if head_weight.ndim == 2 and head_weight.shape[0] != model.num_classes:
            problem = f"has {head_weight.shape[0]} outputs, the dataset has {model.num_classes} classes"
        elif head_weight.ndim == 2:
            problem = f"takes {head_weight.shape[1]} features, the model gives {model.num_features}"
        else:
            problem = f"has shape {tuple(head_weight.shape)}, the model's head {tuple(model.head.weight.shape)}"
        raise CheckpointError(
            f"The checkpoint does not fit {getattr(model, 'arch', type(model).__name__)}: the checkpoint's head "
            f"{head_label} {problem}."
        )

    missing = [original(k) for k in expected if k not in mapped]
    unexpected = [original(k) for k in mapped if k not in expected]
    mismatched = [
        f"{original(k)} {tuple(v.shape)} vs the model's {tuple(expected[k].shape)}"
        for k, v in mapped.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or mismatched:
        parts = [f"The checkpoint does not fit {getattr(model, 'arch', type(model).__name__)}:"]
        if missing:
            parts.append(f"{len(missing)} missing key(s): {_listed(missing)}.")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {_listed(unexpected)}.")
        if mismatched:
            parts.append(f"{len(mismatched)} shape mismatch(es): {_listed(mismatched)}.")
        first = {key.split(".", 1)[0] for key in state}
        if len(first) == 1 and all("." in key for key in state):
            stripped = {key.split(".", 1)[1] for key in state}
            if stripped == {original(key) for key in expected}:
                parts.append(
                    f"Every checkpoint key starts with {next(iter(first)) + '.'!r}, and without it the keys fit: "
                    f"it was saved from a wrapper (e.g. a LightningModule); save the inner model's state_dict."
                )
        raise CheckpointError(" ".join(parts))
    try:
        model.load_state_dict(mapped, strict=True)
    except RuntimeError as error:
        raise CheckpointError(f"The checkpoint does not fit the model: {error}") from error
