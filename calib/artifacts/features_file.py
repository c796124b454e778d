"""Reading a file of precomputed features, from any model, to calibrate it as a Stage I.

A features file holds, for each of the splits ``train``, ``val`` and ``test``, what a trained model
computes before its last layer (the *features*, e.g. the pooled hidden state of a language-model
classifier), the true labels, and either that last linear layer (the *head*) or the logits. calib
turns it into a Stage-I artifact, so the two-stage and post-hoc calibration methods run on it
without training a Stage I.

Keys (N is the number of examples of a split, d the feature width, C the number of classes):

=========================  =========  ==============================  ==========================================
key                        shape      dtype                           meaning
=========================  =========  ==============================  ==========================================
``train_features``         (N, d)     floating (float16/32/64, bf16)  penultimate outputs, one row per example
``val_features``           (N, d)     floating                        the same width d in every split
``test_features``          (N, d)     floating
``train_labels``           (N,)       integer                         class indices in [0, C)
``val_labels``             (N,)       integer
``test_labels``            (N,)       integer
``head_weight``            (C, d)     floating                        the final linear layer's weight W
``head_bias``              (C,)       floating                        its bias b; optional, zeros when absent
``train_logits``           (N, C)     floating                        the model's logits, one row per example
``val_logits``             (N, C)     floating
``test_logits``            (N, C)     floating
``class_names``            (C,)       str                             optional, one name per class
=========================  =========  ==============================  ==========================================

The features and labels of all three splits are required, and at least one of:

- ``head_weight`` (with ``head_bias`` optional): the logits of every split are computed as
  ``features @ W.T + b`` in float64 (from the values as stored) and kept as float32;
- ``<split>_logits`` for every split (all three, not some): used as they are. When the head is given too,
  the file's logits are still used unchanged (they are the model's own, possibly computed in lower
  precision) and the head is kept for the methods that start from it.

Without a head, methods that need the Stage-I head cannot run on the file. No other keys are accepted:
an unknown key (a typo such as ``train_feature``) is an error, not ignored.

Two formats, chosen by the file's suffix:

- ``.pt`` / ``.pth``: a dict written with ``torch.save``, read with
  ``torch.load(path, map_location="cpu", weights_only=True)``. The values may be tensors, numpy arrays
  (with torch 2.5 or later) or (nested) lists of numbers; ``class_names`` a list of str. Only these are
  read: a pickled model or an object of another class is refused.
- ``.npz``: written with ``numpy.savez`` / ``numpy.savez_compressed`` with the keys as argument names,
  read with ``numpy.load(path, allow_pickle=False)``; ``class_names`` an array of str
  (``numpy.array(names, dtype=str)``), not an object array.

On reading, features, logits and the head become contiguous float32 tensors (values beyond the float32
range become inf and are refused) and labels int64. Everything is checked, and every problem raises
:class:`FeaturesFileError` naming the file, the key, the shapes or values involved and what is expected:
missing or unknown keys, wrong numbers of dimensions, non-numeric or non-integer arrays, row counts that
differ between a split's features, labels and logits, feature widths d or class counts C that differ
(between splits, head and logits), labels outside [0, C), NaN or inf values, fewer than 2 classes, an
empty split, a ``class_names`` that is not C strings.

Writing one with ``torch.save`` from a model's penultimate outputs (``backbone`` maps inputs to the
features, ``head`` is the model's final ``torch.nn.Linear``; ``splits`` maps each split name to its
inputs and labels)::

    out = {}
    with torch.no_grad():
        for split, (x, y) in splits.items():  # "train", "val", "test"
            out[f"{split}_features"] = backbone(x).float().cpu()  # (N, d)
            out[f"{split}_labels"] = y.long().cpu()  # (N,)
    torch.save({**out, "head_weight": head.weight.detach().cpu(), "head_bias": head.bias.detach().cpu()}, "feats.pt")
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calib._config import did_you_mean
from calib.artifacts.artifact import SPLITS, SplitCache

__all__ = ["FEATURES_FILE_SUFFIXES", "FeaturesFile", "FeaturesFileError", "read_features_file"]

FEATURES_FILE_SUFFIXES = (".pt", ".pth", ".npz")

_FEATURE_KEYS = tuple(f"{s}_features" for s in SPLITS)
_LABEL_KEYS = tuple(f"{s}_labels" for s in SPLITS)
_LOGIT_KEYS = tuple(f"{s}_logits" for s in SPLITS)
_REQUIRED = _FEATURE_KEYS + _LABEL_KEYS
_ACCEPTED = (*_REQUIRED, "head_weight", "head_bias", *_LOGIT_KEYS, "class_names")


class FeaturesFileError(ValueError):
    """A features file cannot be read or breaks the format; the message names file, key and values."""


@dataclass
class FeaturesFile:
    """The checked contents of a features file.

    ``splits`` holds train, val and test (features float32 (N, d), logits float32 (N, C), labels int64
    (N,)); ``head_state`` is ``{"weight": (C, d), "bias": (C,)}`` in float32, or ``None`` when the file
    has no head.
    """

    splits: dict[str, SplitCache]
    head_state: dict[str, torch.Tensor] | None
    num_classes: int
    num_features: int
    class_names: list[str] | None = None


def read_features_file(path: str | os.PathLike) -> FeaturesFile:
    """Read and check the features file at ``path`` (``.pt``/``.pth`` or ``.npz``; module docstring).

    Raises :class:`FeaturesFileError` on any problem, naming the file, the key and what is expected.
    """
    reader = _Reader(Path(path))
    return reader.read()


def _shape(t: Any) -> str:
    return "(" + ", ".join(str(n) for n in t.shape) + ("," if len(t.shape) == 1 else "") + ")"


def _numpy_globals() -> list[Any]:
    """What ``weights_only=True`` must allow for plain numpy arrays of numbers or str (no object arrays)."""
    kinds = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
             np.float16, np.float32, np.float64, np.complex64, np.complex128, np.str_)
    return [np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, *(type(np.dtype(k)) for k in kinds)]


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, message: str) -> FeaturesFileError:
        return FeaturesFileError(f"features file {self.path}: {message}")

    # -- loading -----------------------------------------------------------------------------------------

    def read(self) -> FeaturesFile:
        raw = self.load()
        self.check_keys(raw)
        features = {s: self.floating(raw[f"{s}_features"], f"{s}_features", "(N, d)", 2) for s in SPLITS}
        labels = {s: self.integer(raw[f"{s}_labels"], f"{s}_labels") for s in SPLITS}
        file_logits = ({s: self.floating(raw[f"{s}_logits"], f"{s}_logits", "(N, C)", 2) for s in SPLITS}
                       if _LOGIT_KEYS[0] in raw else None)
        weight = self.floating(raw["head_weight"], "head_weight", "(C, d)", 2) if "head_weight" in raw else None
        bias = self.floating(raw["head_bias"], "head_bias", "(C,)", 1) if "head_bias" in raw else None

        self.check_rows(features, labels, file_logits)
        num_features = self.check_widths(features, weight)
        num_classes = self.check_classes(file_logits, weight, bias)
        for s in SPLITS:
            self.check_label_range(f"{s}_labels", labels[s], num_classes)
        class_names = self.class_names(raw["class_names"], num_classes) if "class_names" in raw else None

        head_state = None
        if weight is not None:
            if bias is None:
                bias = torch.zeros(num_classes, dtype=weight.dtype)
            head_state = {"weight": self.float32("head_weight", weight), "bias": self.float32("head_bias", bias)}
        splits = {}
        for s in SPLITS:
            features32 = self.float32(f"{s}_features", features[s])
            if file_logits is not None:
                logits = self.float32(f"{s}_logits", file_logits[s])
            else:
                assert weight is not None and bias is not None
                z = features[s].to(torch.float64) @ weight.to(torch.float64).T + bias.to(torch.float64)
                logits = z.to(torch.float32).contiguous()
                bad = int((~torch.isfinite(logits)).sum())
                if bad:
                    raise self.error(f"the logits computed from head_weight/head_bias and `{s}_features` have "
                                     f"{bad} value(s) beyond the float32 range (|z| > 3.4e38); expected finite "
                                     "logits: check the scale of the features and the head")
            splits[s] = SplitCache(features32, logits, labels[s].contiguous())
        return FeaturesFile(splits=splits, head_state=head_state, num_classes=num_classes,
                            num_features=num_features, class_names=class_names)

    def load(self) -> dict[str, Any]:
        suffix = self.path.suffix.lower()
        if suffix not in FEATURES_FILE_SUFFIXES:
            raise self.error(f"unsupported file type {self.path.suffix or '(no suffix)'!r}; expected .pt or .pth "
                             "(a dict written with torch.save) or .npz (arrays written with numpy.savez)")
        if not self.path.exists():
            raise self.error("the file does not exist")
        if not self.path.is_file():
            raise self.error("the path is not a regular file")
        try:
            with self.path.open("rb"):
                pass
        except OSError as err:
            raise self.error(f"the file cannot be read ({type(err).__name__}: {err.strerror or err})") from err
        raw = self.load_torch() if suffix in (".pt", ".pth") else self.load_numpy()
        if not isinstance(raw, Mapping):
            raise self.error(f"expected a dict of named arrays at the top level, got {type(raw).__name__}")
        return dict(raw)

    def load_torch(self) -> Any:
        allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
        context = allow(_numpy_globals()) if allow is not None else contextlib.nullcontext()
        try:
            with context:
                return torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as err:
            detail = self.torch_problem(err)
            raise self.error(f"torch.load(weights_only=True) cannot load it ({detail}). Only tensors, numpy "
                             "arrays, lists, numbers and strings in a dict are read, never pickled objects "
                             "such as a model: save tensors (e.g. `features.detach().cpu()`)") from err

    @staticmethod
    def torch_problem(err: Exception) -> str:
        """The useful part of ``torch.load``'s long message."""
        text = str(err)
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        if found:
            return f"it holds an object of class {found.group(1)}"
        lines = [line.strip() for line in text.splitlines() if line.strip()] or [""]
        name = type(err).__name__
        name = name if name[:1].isupper() else f"{type(err).__module__}.{name}"  # struct.error
        for i, line in enumerate(lines):
            if "WeightsUnpickler error:" in line:
                rest = line.split("WeightsUnpickler error:", 1)[1].strip()
                return f"{name}: {(rest or (lines[i + 1] if i + 1 < len(lines) else ''))[:200]}"
        return f"{name}: {lines[0][:200]}"

    def load_numpy(self) -> dict[str, Any]:
        try:
            archive = np.load(self.path, allow_pickle=False)
        except Exception as err:
            raise self.error(f"numpy.load(allow_pickle=False) cannot load it ({type(err).__name__}: "
                             f"{str(err)[:200]}); expected an .npz archive written with numpy.savez") from err
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise self.error("it holds a single array (.npy), not an .npz archive of named arrays; write it "
                             "with numpy.savez(path, train_features=..., train_labels=..., ...)")
        raw = {}
        with archive:
            for key in archive.files:
                try:
                    raw[key] = archive[key]
                except ValueError as err:
                    if "allow_pickle" not in str(err):
                        raise self.error(f"`{key}` cannot be read ({err})") from err
                    raise self.error(f"`{key}` is an object array (pickled Python objects), which is not read: "
                                     "store numbers, and class_names as numpy.array(names, dtype=str)") from err
                except Exception as err:
                    raise self.error(f"`{key}` cannot be read ({type(err).__name__}: {err})") from err
        return raw

    # -- keys --------------------------------------------------------------------------------------------

    def check_keys(self, raw: dict[Any, Any]) -> None:
        unknown = [k for k in raw if k not in _ACCEPTED]
        missing = [k for k in _REQUIRED if k not in raw]
        logits = [k for k in _LOGIT_KEYS if k in raw]
        if logits and len(logits) < len(_LOGIT_KEYS):
            absent = [k for k in _LOGIT_KEYS if k not in raw]
            missing.append(f"{', '.join(absent)} (logits are given for {', '.join(logits)} only: give them for "
                           "every split, or for none and head_weight instead)")
        if "head_weight" not in raw:
            if "head_bias" in raw:
                missing.append("head_weight (head_bias is given without it)")
            elif not logits:
                missing.append(f"head_weight, or the logits of every split ({', '.join(_LOGIT_KEYS)})")
        if not unknown and not missing:
            return
        parts = []
        if missing:
            parts.append("missing required key(s): " + "; ".join(missing))
        if unknown:
            hints = [f"{k!r}" + did_you_mean(str(k), [a for a in _ACCEPTED if a not in raw], form=" (did you mean {}?)")
                     for k in unknown]
            parts.append("unknown key(s): " + ", ".join(hints))
        raise self.error("; ".join(parts) + f". Accepted keys: {', '.join(_ACCEPTED)} — the features and "
                         "labels of every split, and head_weight (head_bias optional) and/or the logits of "
                         "every split; class_names optional")

    # -- values ------------------------------------------------------------------------------------------

    def tensor(self, value: Any, key: str, expected: str) -> torch.Tensor:
        """``value`` as a dense CPU tensor without autograd, before any dtype conversion."""
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided:
                raise self.error(f"`{key}` must be a dense tensor {expected}, got layout {value.layout}")
            return value.detach().cpu()
        if isinstance(value, (list, tuple)):
            try:
                value = np.asarray(value)
            except ValueError as err:  # ragged
                raise self.error(f"`{key}` must be a rectangular array {expected}; the list does not "
                                 f"convert ({err})") from err
        if not isinstance(value, np.ndarray):
            raise self.error(f"`{key}` must be a tensor, numpy array or list {expected}, "
                             f"got {type(value).__name__}")
        if value.dtype.kind not in "iuf":
            raise self.error(f"`{key}` must be a real-valued numeric array {expected}, got dtype {value.dtype} "
                             f"(shape {_shape(value)})")
        if value.dtype.kind == "u":
            value = value.astype(np.int64)
        if not value.dtype.isnative:
            value = value.astype(value.dtype.newbyteorder("="))
        if not value.flags.writeable:
            value = value.copy()
        return torch.from_numpy(np.ascontiguousarray(value))

    def floating(self, value: Any, key: str, expected: str, ndim: int) -> torch.Tensor:
        t = self.tensor(value, key, expected)
        if not t.is_floating_point():
            raise self.error(f"`{key}` must be a floating-point array {expected}, got dtype "
                             f"{str(t.dtype).removeprefix('torch.')} (shape {_shape(t)})")
        if t.dim() != ndim:
            raise self.error(f"`{key}` must be {ndim}-D {expected}, got shape {_shape(t)}")
        return t

    def integer(self, value: Any, key: str) -> torch.Tensor:
        t = self.tensor(value, key, "(N,)")
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            whole = t.is_floating_point() and bool(torch.all(t == torch.round(t)))
            raise self.error(f"`{key}` must hold integer class indices (N,), got dtype "
                             f"{str(t.dtype).removeprefix('torch.')} (shape {_shape(t)})"
                             + ("; its values are whole numbers: store them as int64 (labels.long())"
                                if whole else ""))
        if t.dim() != 1:
            raise self.error(f"`{key}` must be 1-D (N,), got shape {_shape(t)}")
        return t.to(torch.int64)

    def float32(self, key: str, t: torch.Tensor) -> torch.Tensor:
        """``t`` as a contiguous float32 tensor, which must hold finite numbers only."""
        out = t.to(torch.float32).contiguous()
        finite = torch.isfinite(out)
        if not bool(finite.all()):
            nan = int(torch.isnan(out).sum())
            inf = int((~finite).sum()) - nan
            wide = t.dtype == torch.float64 and inf > int(torch.isinf(t).sum())
            where = " after conversion to float32 (values beyond ±3.4e38 become inf)" if wide else ""
            raise self.error(f"`{key}` {_shape(t)} has {nan + inf} non-finite value(s){where}: {nan} NaN, {inf} "
                             "inf; expected finite numbers")
        return out

    # -- consistency -------------------------------------------------------------------------------------

    def check_rows(self, features: dict[str, torch.Tensor], labels: dict[str, torch.Tensor],
                   logits: dict[str, torch.Tensor] | None) -> None:
        for s in SPLITS:
            if features[s].shape[0] == 0:
                raise self.error(f"split {s!r} is empty (`{s}_features` has shape {_shape(features[s])}); "
                                 "every split needs at least one example")
            parts = {f"{s}_features": features[s], f"{s}_labels": labels[s]}
            if logits is not None:
                parts[f"{s}_logits"] = logits[s]
            if len({t.shape[0] for t in parts.values()}) > 1:
                listed = ", ".join(f"`{k}` {_shape(t)}" for k, t in parts.items())
                raise self.error(f"the row counts N of split {s!r} differ: {listed}; expected one row per "
                                 "example in each")

    def check_widths(self, features: dict[str, torch.Tensor], weight: torch.Tensor | None) -> int:
        widths = {s: int(features[s].shape[1]) for s in SPLITS}
        d = widths[SPLITS[0]]
        if d == 0:
            raise self.error(f"`{SPLITS[0]}_features` has shape {_shape(features[SPLITS[0]])}: "
                             "expected at least one feature column (d >= 1)")
        if len(set(widths.values())) > 1:
            listed = ", ".join(f"`{s}_features` {_shape(features[s])}" for s in SPLITS)
            raise self.error(f"the feature widths d differ between splits: {listed}; expected the same d in every "
                             "split")
        if weight is not None and weight.shape[1] != d:
            raise self.error(f"`head_weight` has shape {_shape(weight)}, expected (C, d) with d={d} as in "
                             f"`{SPLITS[0]}_features` {_shape(features[SPLITS[0]])}")
        return d

    def check_classes(self, logits: dict[str, torch.Tensor] | None, weight: torch.Tensor | None,
                      bias: torch.Tensor | None) -> int:
        sources = {}
        if weight is not None:
            sources["head_weight"] = (weight, int(weight.shape[0]))
        if bias is not None:
            sources["head_bias"] = (bias, int(bias.shape[0]))
        for s, t in (logits or {}).items():
            sources[f"{s}_logits"] = (t, int(t.shape[1]))
        counts = {c for _, c in sources.values()}
        if len(counts) > 1:
            listed = ", ".join(f"`{k}` {_shape(t)} (C={c})" for k, (t, c) in sources.items())
            raise self.error(f"the class counts C differ: {listed}; expected the same C in the head and the "
                             "logits of every split")
        (num_classes,) = counts
        if num_classes < 2:
            key, (t, _) = next(iter(sources.items()))
            raise self.error(f"at least 2 classes are needed, got C={num_classes} (`{key}` has shape {_shape(t)})")
        return num_classes

    def check_label_range(self, key: str, labels: torch.Tensor, num_classes: int) -> None:
        outside = (labels < 0) | (labels >= num_classes)
        count = int(outside.sum())
        if count:
            bad = labels[outside]
            raise self.error(f"`{key}` has {count} label(s) outside [0, {num_classes}) (min {int(bad.min())}, max "
                             f"{int(bad.max())}); expected class indices 0..{num_classes - 1} for C={num_classes} "
                             "classes")

    def class_names(self, value: Any, num_classes: int) -> list[str]:
        if isinstance(value, np.ndarray):
            if value.ndim != 1 or value.dtype.kind not in "UO":
                raise self.error(f"`class_names` must be a 1-D array of str, got dtype {value.dtype} shape "
                                 f"{_shape(value)}")
            value = value.tolist()
        if not isinstance(value, (list, tuple)):
            raise self.error(f"`class_names` must be a list of {num_classes} strings, got {type(value).__name__}")
        for i, name in enumerate(value):
            if not isinstance(name, str):
                raise self.error(f"`class_names` must hold strings, got {type(name).__name__} {name!r} at index {i}")
        if len(value) != num_classes:
            raise self.error(f"`class_names` has {len(value)} name(s), expected C={num_classes}, one per class")
        return [str(name) for name in value]
