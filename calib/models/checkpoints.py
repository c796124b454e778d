"""Users' checkpoints: read a file safely, find the state dict in it, load it into a calib or external model.

:func:`read_checkpoint` reads a file with ``weights_only=True`` (tensors only, never pickled code) and
:func:`checkpoint_state_dict` unwraps the usual containers; :func:`load_checkpoint_into` maps the
original model's keys onto an :class:`~calib.models.external.ExternalModel` (``<head>.weight`` →
``head.weight``, the others → ``backbone.<key>``) and loads them strictly.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from calib.models._base import CalibModel
from calib.models.external import ExternalModel

__all__ = ["CheckpointError", "checkpoint_state_dict", "load_checkpoint_into", "read_checkpoint"]

STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "net", "module")
"""Keys under which a checkpoint dict may hold the state dict, tried in this order."""

STRIPPED_PREFIXES = ("module.", "_orig_mod.")
"""Key prefixes of DataParallel/DistributedDataParallel and of ``torch.compile``, removed on load."""

_MAX_LISTED_KEYS = 5


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, is not a state dict, or does not fit the model."""


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
