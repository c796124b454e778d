"""Stage I from a given file instead of a training: a checkpoint of a trained model, precomputed features, or a
model's predictions.

The study resolves the file once (:func:`resolve_source`: its SHA-256 goes into the trial config and the
Stage-I identity) and checks it against the dataset before any trial starts (:func:`check_source`). The
trial that makes the artifact reads the file through :func:`local_copy`, which refuses a file whose
content changed since. Everything after Stage I (two-stage and post-hoc methods, OOD and corruption
sets) then runs on the artifact as on a trained one.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from calib import storage
from calib._config import ConfigError
from calib.artifacts.features_file import FeaturesFile, FeaturesFileError, read_features_file
from calib.artifacts.predictions_file import (
    Predictions,
    PredictionsFileError,
    calibration_test_split,
    read_predictions,
    split_pair,
)
from calib.config import TrialConfig
from calib.datasets import load_dataset
from calib.models import CalibModel, create_model
from calib.models.checkpoints import CheckpointError, load_checkpoint_into, read_checkpoint
from calib.models.external import HeadNotFoundError

__all__ = ["SourceChangedError", "check_source", "checkpoint_model", "features_of", "file_sha256", "local_copy",
           "predictions_of", "predictions_split", "resolve_source"]

_WHAT = {"checkpoint": "checkpoint", "features": "features file", "predictions": "predictions file"}
_FLAG = {"checkpoint": "--checkpoint", "features": "--features", "predictions": "--predictions"}


class SourceChangedError(ConfigError):
    """The checkpoint or features file is not the one the study resolved (its SHA-256 differs)."""


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a local file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _sources_cache() -> Path:
    root = Path(os.environ.get("CALIB_ARTIFACT_CACHE", Path.home() / ".cache" / "calib" / "artifacts"))
    return root / "sources"


def _download(uri: str, what: str) -> Path:
    """A fresh local copy of the object ``uri`` (in the node's artifact cache)."""
    cache = _sources_cache()
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".download-{uuid.uuid4().hex}{Path(uri).suffix}"
    try:
        storage.download(uri, tmp)
    except FileNotFoundError:
        raise ConfigError(f"The {what} {uri!r} does not exist.") from None
    return tmp


def resolve_source(kind: str, path: str, head: str | None = None) -> dict[str, Any]:
    """The ``source`` section of a trial config for the ``kind`` ("checkpoint", "features" or "predictions") file
    ``path``: its absolute path or URI and its SHA-256 (for a ``.npy`` pair of predictions, ``PREDICTIONS.npy,
    LABELS.npy``, each file's). A missing or unreadable file is a ``ConfigError``."""
    if kind == "predictions":
        predictions, labels = split_pair(path)
        location, sha256 = _resolve_file(predictions, kind, path)
        source: dict[str, Any] = {"kind": kind, "path": location, "sha256": sha256}
        if labels is not None:
            source["labels_path"], source["labels_sha256"] = _resolve_file(labels, kind, path)
        return source
    location, sha256 = _resolve_file(path, kind, path)
    return {"kind": kind, "path": location, "sha256": sha256, "head": head}


def _resolve_file(path: str, kind: str, given: str) -> tuple[str, str]:
    what, flag = _WHAT[kind], _FLAG[kind]
    if storage.is_remote(path):
        local = _download(path, what)
        try:
            return path, file_sha256(local)
        finally:
            local.unlink(missing_ok=True)
    file = Path(path).expanduser().resolve()
    if not file.exists():
        raise ConfigError(f"`{flag}` file not found: {str(file)!r} (from {flag} {given}).")
    if not file.is_file():
        raise ConfigError(f"`{flag}` must name a file, but {str(file)!r} is a directory.")
    try:
        return str(file), file_sha256(file)
    except OSError as err:
        raise ConfigError(f"`{flag}` file {str(file)!r} cannot be read: {err.strerror or err}.") from None


def local_copy(cfg: TrialConfig) -> Path:
    """A local file with the content of ``cfg.source`` (its SHA-256 checked): the file itself, or a copy of
    the object in the node's artifact cache (kept, by hash, for the next trial on the node)."""
    assert cfg.source.path is not None and cfg.source.sha256 is not None
    return _local_file(cfg.source.path, cfg.source.sha256, _WHAT[cfg.source.kind])


def _local_file(path: str, sha256: str, what: str) -> Path:
    if storage.is_remote(path):
        cached = _sources_cache() / f"{sha256}{Path(path).suffix}"
        if cached.exists() and file_sha256(cached) == sha256:
            return cached
        local = _download(path, what)
        actual = file_sha256(local)
        if actual == sha256:
            os.replace(local, cached)
            return cached
        local.unlink(missing_ok=True)
    else:
        try:
            actual = file_sha256(path)
        except FileNotFoundError:
            raise ConfigError(f"The {what} {path!r} of this trial does not exist on {os.uname().nodename} "
                              f"(every node reads it there: put it on a shared path, or in the object store "
                              f"as s3://...).") from None
        if actual == sha256:
            return Path(path)
    raise SourceChangedError(
        f"The {what} {path!r} changed since the study resolved it (SHA-256 {actual[:12]}…, the study's "
        f"{sha256[:12]}…): run the study again to calibrate the new file (a new stage1_id).")


def checkpoint_model(cfg: TrialConfig, num_classes: int, input_shape: tuple[int, int, int]) -> CalibModel:
    """``cfg.arch`` with the checkpoint's weights, split into features and head (``source.head``)."""
    state = read_checkpoint(str(local_copy(cfg)))
    model = create_model(cfg.arch, num_classes=num_classes, in_channels=input_shape[0], head=cfg.source.head,
                         input_shape=input_shape)
    load_checkpoint_into(model, state)
    return model.eval()


def features_of(cfg: TrialConfig) -> FeaturesFile:
    """The splits and head of the features file of ``cfg.source``."""
    return read_features_file(local_copy(cfg))


def predictions_of(cfg: TrialConfig) -> Predictions:
    """The checked predictions and labels of the predictions file of ``cfg.source``."""
    source = cfg.source
    labels = (None if source.labels_path is None or source.labels_sha256 is None
              else _local_file(source.labels_path, source.labels_sha256, "labels .npy"))
    return read_predictions(local_copy(cfg), labels)


def predictions_split(cfg: TrialConfig) -> tuple[Predictions, np.ndarray, np.ndarray]:
    """The predictions of ``cfg.source`` and split ``cfg.seed`` of them: (predictions, calibration indices,
    test indices)."""
    predictions = predictions_of(cfg)
    assert cfg.source.calibration_fraction is not None
    calibration, test = calibration_test_split(predictions.labels, cfg.seed, cfg.source.calibration_fraction)
    return predictions, calibration, test


def check_source(cfg: TrialConfig) -> str:
    """Before any trial: the source file loads and fits the config (a checkpoint's head has the dataset's
    classes and is found in the architecture); a ``ConfigError`` names what does not. Returns a short
    description for the study's settings line."""
    try:
        if cfg.source.kind == "predictions":
            predictions, calibration, test = predictions_split(cfg)
            fraction = cfg.source.calibration_fraction
            return (f"predictions file {cfg.source.path}" + (f",{cfg.source.labels_path}" if cfg.source.labels_path
                                                              else "")
                    + f": {predictions.describe()}; stratified splits of {len(calibration)} calibration and "
                      f"{len(test)} test samples ({fraction:g}/{1 - fraction:g})")
        if cfg.source.kind == "features":
            file = features_of(cfg)
            return (f"features file {cfg.source.path} ({file.num_features} features, {file.num_classes} classes, "
                    f"{', '.join(f'{s} {len(c.labels)}' for s, c in file.splits.items())})")
        data = load_dataset(cfg.dataset, cfg.data_root, download=cfg.download,
                            cifar100_test_norm=cfg.cifar100_test_norm, options=cfg.dataset_options)
        model = checkpoint_model(cfg, data.num_classes, data.input_shape)
    except (CheckpointError, HeadNotFoundError, FeaturesFileError, PredictionsFileError) as err:
        raise ConfigError(" ".join(str(err).split())) from None  # one line, as every bad-input error
    head = getattr(model, "head_name", None)
    return (f"checkpoint {cfg.source.path} ({cfg.arch}" + (f", head {head}" if head else "")
            + f", {model.num_classes} classes)")

