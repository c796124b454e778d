"""Stage-I artifacts: weights, cached features/logits and the record, keyed by the Stage-I config hash.

Layout (docs/architecture.md contract 3)::

    <artifact_root>/stage1/<stage1_id>/model.pt     state dict of the trained model
                                      /cache.pt     {split}_features / {split}_logits / {split}_labels
                                      /record.json  Stage-I identity, history, metrics, timings, and the
                                                    checksums "files": {"model.pt": {"bytes", "sha256"}, ...}
                                      /ood-<name>.pt, /corruption-<name>.pt
                                                    Stage-I outputs on an OOD / corrupted set, made on first use
                                      /train_heldout.pt, /train_augmented.pt
                                                    the same for a method split (METHOD_SPLITS), on first use
                                      /ood-<name>.pt.json, ...   its sidecar {"bytes", "sha256"}, written after it
    <artifact_root>/quarantine/<stage1_id>-<UTC time>/           what failed its check, moved aside

An artifact directory is written under a temporary name and renamed into place, so a reader sees a
complete artifact or none. A file lock per ``stage1_id`` makes concurrent trials with the same
Stage-I config wait for the first one instead of training again.

Checksums and quarantine: every file is checked before it is used, its size and then its SHA-256
(one chunked pass, about 1 s per GB) against the record or its sidecar; a file written before
checksums existed (no "files" in its record, no sidecar) is checked by loading it. A file that is
missing, truncated, altered or does not load, or a ``record.json`` that is not a JSON object, makes
the artifact (or that one cached split) count as missing: under its lock it is checked again, moved
to ``quarantine/`` (never deleted), an :class:`ArtifactWarning` and the same line on stderr say what
was wrong and where it went, and it is trained (computed) again.

With an object-store ``artifact_root`` (``s3://bucket/prefix``, for clusters), each node keeps a
local copy under ``$CALIB_ARTIFACT_CACHE`` (default ``~/.cache/calib/artifacts``; its quarantine is
``<cache>/<hash of the root>/quarantine/``) and the bucket holds::

    <artifact_root>/stage1/<stage1_id>/record.json          written last: the artifact exists once it does
                                      /<writer>/model.pt    the files of the node that trained it
                                      /<writer>/cache.pt    (and its cached OOD / corrupted splits,
                                      /<writer>/ood-*.pt     each uploaded before its sidecar)
    <artifact_root>/quarantine/<stage1_id>-<UTC time>/...   published files that failed their check

Nodes that find ``record.json`` download the files of the writer it names, so a reader never mixes
the weights of one training with the features of another, even if two nodes raced to train. A
download that fails its check is discarded and downloaded once more; if that copy fails too, the
published files are bad: they are moved to the bucket's ``quarantine/`` and the artifact (or split)
is trained (computed) and published again.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from torch.utils.data import ConcatDataset, Dataset

from calib import storage
from calib._config import ConfigError
from calib.config import TrialConfig, config_hash, stage1_identity
from calib.datasets import load_dataset, load_ood
from calib.datasets.corruptions import SEVERITIES, load_corrupted
from calib.datasets.subsets import TrainingSubset, restrict_training
from calib.metrics import compute_all, softmax64
from calib.models import CalibModel, create_model
from calib.training import describe_device, predict, prepare_model, train_stage1

__all__ = [
    "METHOD_SPLITS",
    "SPLITS",
    "ArtifactWarning",
    "CorruptArtifactError",
    "SplitCache",
    "Stage1Artifact",
    "corrupted_split",
    "get_or_train_stage1",
    "method_split",
    "ood_split",
    "stage1_data",
    "stage1_dir",
    "stage1_exists",
]

SPLITS = ("train", "val", "test")
ARTIFACT_FILES = ("model.pt", "cache.pt")  # checksummed in record.json; record.json itself must parse


class ArtifactWarning(UserWarning):
    """An artifact file failed its check and was moved aside (or a bad download discarded) to be rebuilt."""


class CorruptArtifactError(RuntimeError):
    """An artifact file is missing, has the wrong size or SHA-256, or does not load."""


@dataclass
class SplitCache:
    """Cached Stage-I outputs of one split: features h (N, d), logits z (N, C), labels y (N,)."""

    features: torch.Tensor
    logits: torch.Tensor
    labels: torch.Tensor


@dataclass
class Stage1Artifact:
    """A finished Stage I as later stages see it: cached splits, the record, and the model on demand.

    ``path`` is the local directory; ``remote`` the object-store directory of the writer's files, or
    ``None`` for a local artifact root.
    """

    stage1_id: str
    path: Path
    splits: dict[str, SplitCache]
    record: dict[str, Any]
    remote: str | None = None

    @property
    def num_classes(self) -> int:
        return int(self.record["num_classes"])

    @property
    def num_features(self) -> int:
        return int(self.splits["train"].features.shape[1])

    def load_model(self, device: torch.device | str = "cpu") -> CalibModel:
        """The trained Stage-I model (backbone and linear head), in eval mode."""
        model = create_model(self.record["arch"], num_classes=self.num_classes,
                             in_channels=int(self.record["input_shape"][0]))
        model.load_state_dict(self._model_state())
        return model.to(device).eval()

    def head_state(self) -> dict[str, torch.Tensor]:
        """The Stage-I linear head's weight and bias."""
        return {k.removeprefix("head."): v for k, v in self._model_state().items() if k.startswith("head.")}

    def _model_state(self) -> dict[str, torch.Tensor]:
        """model.pt, checked against the record; ``CorruptArtifactError`` if it changed since it was loaded
        (the next :func:`get_or_train_stage1` then moves the artifact aside and trains it again)."""
        try:
            return _load_checked(self.path / "model.pt", _recorded_checksum(self.record, "model.pt"))
        except CorruptArtifactError as err:
            raise CorruptArtifactError(f"Stage-I artifact {self.path}: {err}") from err


# ---------------------------------------------------------------------------------------------------
# Checksums and checks


def _file_checksum(path: Path) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex digest}`` of a file, hashed in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return {"bytes": size, "sha256": digest.hexdigest()}


def _verify_file(path: Path, expected: dict[str, Any] | None) -> None:
    """Raise ``CorruptArtifactError`` unless ``path`` exists and, when ``expected`` is given, has its size
    (checked first, cheaply) and SHA-256."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorruptArtifactError(f"{path.name} is missing") from None
    if expected is None:
        return
    if size != expected["bytes"]:
        raise CorruptArtifactError(f"{path.name} has {size} bytes, its checksum says {expected['bytes']}")
    if _file_checksum(path)["sha256"] != expected["sha256"]:
        raise CorruptArtifactError(f"{path.name} does not match its SHA-256 ({size} bytes as recorded)")


def _torch_load(path: Path) -> Any:
    """``torch.load`` onto the CPU; a file that does not load raises ``CorruptArtifactError``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        detail = (str(err).strip().splitlines() or [""])[0]
        raise CorruptArtifactError(f"{path.name} does not load ({type(err).__name__}: {detail})") from err


def _load_checked(path: Path, expected: dict[str, Any] | None) -> Any:
    """The contents of ``path`` after its check: size and SHA-256 when ``expected`` is given, loading always."""
    _verify_file(path, expected)
    return _torch_load(path)


def _parse_record(text: str | bytes) -> dict[str, Any]:
    """A ``record.json``'s contents; ``CorruptArtifactError`` unless it is a JSON object."""
    try:
        record = json.loads(text)
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise CorruptArtifactError(f"record.json is not valid JSON ({err})") from None
    if not isinstance(record, dict):
        raise CorruptArtifactError("record.json is not a JSON object")
    return record


def _read_record(path: Path) -> dict[str, Any]:
    """The record of the artifact directory ``path`` (``CorruptArtifactError`` if missing or unreadable)."""
    try:
        return _parse_record((path / "record.json").read_bytes())
    except FileNotFoundError:
        raise CorruptArtifactError("record.json is missing") from None


def _recorded_checksum(record: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The checksum the record holds for ``name``; None for records written before checksums."""
    return record.get("files", {}).get(name)


def _writer(record: dict[str, Any]) -> str:
    """The writer a published record names (``CorruptArtifactError`` if it names none)."""
    if not isinstance(record.get("writer"), str):
        raise CorruptArtifactError("record.json names no writer")
    return record["writer"]


def _sidecar(path: Path) -> Path:
    """The checksum sidecar of a cached split: ``ood-svhn.pt`` → ``ood-svhn.pt.json``."""
    return path.with_name(path.name + ".json")


def _write_sidecar(path: Path) -> None:
    """Write the sidecar of ``path`` (already in place) through a temporary name and a rename."""
    sidecar = _sidecar(path)
    tmp = sidecar.with_name(f".{sidecar.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(_file_checksum(path)))
    os.replace(tmp, sidecar)


def _read_sidecar(path: Path) -> dict[str, Any] | None:
    """The checksum in the sidecar of ``path``; None where there is none (a split cached before checksums)."""
    try:
        checksum = json.loads(_sidecar(path).read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as err:
        raise CorruptArtifactError(f"{_sidecar(path).name} is not valid JSON ({err})") from None
    if not (isinstance(checksum, dict) and {"bytes", "sha256"} <= checksum.keys()):
        raise CorruptArtifactError(f"{_sidecar(path).name} holds no checksum")
    return checksum


# ---------------------------------------------------------------------------------------------------
# Quarantine


def _say(message: str) -> None:
    """Tell the user, with or without a result store: an ``ArtifactWarning`` and the same line on stderr."""
    warnings.warn(message, ArtifactWarning, stacklevel=3)
    print(f"calib: {message}", file=sys.stderr, flush=True)


def _quarantine_name(stage1_id: str) -> str:
    """``<stage1_id>-<UTC time to the microsecond>``: one quarantine directory per incident."""
    return f"{stage1_id}-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%S.%fZ')}"


def _quarantine_local(artifact_dir: Path, problem: str, names: tuple[str, ...] | None = None) -> Path:
    """Move the artifact directory, or only its files ``names``, to ``<local root>/quarantine/<id>-<time>/``."""
    target = artifact_dir.parents[1] / "quarantine" / _quarantine_name(artifact_dir.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    if names is None:
        os.rename(artifact_dir, target)
        what = f"Stage-I artifact {artifact_dir}"
    else:
        target.mkdir()
        for name in names:
            if (artifact_dir / name).exists():
                os.rename(artifact_dir / name, target / name)
        what = f"cached split {artifact_dir / names[0]}"
    _say(f"{what} failed its check ({problem}); moved it to {target} and rebuilding it")
    return target


def _quarantine_remote(stage1_remote: str, names: list[str], what: str, problem: str) -> None:
    """Move the published files ``names`` (relative to ``<root>/stage1/<id>``) to ``<root>/quarantine/<id>-<time>/``.

    ``what`` names them in the message; a file that another node moved meanwhile is skipped.
    """
    root, _, stage1_id = stage1_remote.rsplit("/", 2)
    target = storage.join(root, "quarantine", _quarantine_name(stage1_id))
    for name in names:
        source = storage.join(stage1_remote, name)
        try:
            storage.move(source, storage.join(target, name))
        except OSError:
            if storage.exists(source):
                raise
    _say(f"published {what} failed its check twice ({problem}); moved it to {target} and rebuilding it")


# ---------------------------------------------------------------------------------------------------
# Cached OOD / corrupted splits


def _load_split(path: Path) -> SplitCache:
    """A cached split after its check against its sidecar (by loading it where there is none)."""
    cache = _load_checked(path, _read_sidecar(path))
    try:
        return SplitCache(cache["features"], cache["logits"], cache["labels"])
    except (KeyError, TypeError) as err:
        raise CorruptArtifactError(f"{path.name} holds no features, logits and labels ({err!r})") from None


def _local_split(artifact: Stage1Artifact, name: str) -> SplitCache | None:
    """The split cached locally if it passes its check; None if there is none or it failed (and was quarantined)."""
    path = artifact.path / name
    if not (path.exists() or _sidecar(path).exists()):
        return None
    try:
        return _load_split(path)
    except CorruptArtifactError as err:
        _quarantine_local(artifact.path, str(err), names=(name, _sidecar(path).name))
        return None


def _fetch_split(artifact: Stage1Artifact, name: str) -> SplitCache | None:
    """The split the writer published, downloaded and checked; None if there is none.

    A bad download is discarded and downloaded once more; if it fails again, the published files are
    quarantined and None is returned.
    """
    assert artifact.remote is not None
    path, remote_file = artifact.path / name, storage.join(artifact.remote, name)
    problem = ""
    for attempt in (1, 2):
        try:
            storage.download(remote_file, path)
        except FileNotFoundError:
            return None
        try:
            storage.download(storage.join(artifact.remote, _sidecar(path).name), _sidecar(path))
        except FileNotFoundError:
            _sidecar(path).unlink(missing_ok=True)  # published before checksums, or the sidecar is on its way
        try:
            return _load_split(path)
        except CorruptArtifactError as err:
            problem = str(err)
            path.unlink(missing_ok=True)
            _sidecar(path).unlink(missing_ok=True)
            if attempt == 1:
                _say(f"downloaded {remote_file} failed its check ({problem}); discarded the copy, downloading again")
    stage1_remote, writer = artifact.remote.rsplit("/", 1)
    _quarantine_remote(stage1_remote, [f"{writer}/{name}", f"{writer}/{_sidecar(path).name}"],
                       f"cached split {remote_file}", problem)
    return None


def _compute_split(artifact: Stage1Artifact, name: str, make: Callable[[], Dataset], cfg: TrialConfig,
                   device: torch.device, seed: int | None = None) -> SplitCache:
    """Predict the split with the Stage-I model, store it with its sidecar, and publish both (data first).

    ``seed`` seeds torch's generator first: the random draws of an augmenting transform."""
    path = artifact.path / name
    model = prepare_model(artifact.load_model(device), device, cfg.stage1.channels_last)
    if seed is not None:
        torch.manual_seed(seed)
    # Random draws made in this process only: DataLoader workers would reseed per worker and their count varies.
    features, logits, labels = predict(model, make(), device, num_workers=0 if seed is not None else cfg.num_workers,
                                       amp=cfg.stage1.amp, channels_last=cfg.stage1.channels_last)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    torch.save({"features": features, "logits": logits, "labels": labels}, tmp)
    os.replace(tmp, path)
    _write_sidecar(path)
    if artifact.remote:
        storage.upload(path, storage.join(artifact.remote, name))
        storage.upload(_sidecar(path), storage.join(artifact.remote, _sidecar(path).name))
    return SplitCache(features, logits, labels)


def _cached_split(artifact: Stage1Artifact, name: str, make: Callable[[], Dataset], cfg: TrialConfig,
                  device: torch.device, seed: int | None = None) -> SplitCache:
    """The split ``name`` of the artifact: cached here, else the writer's published copy, else computed now."""
    path = artifact.path / name
    with contextlib.suppress(CorruptArtifactError):
        return _load_split(path)
    with FileLock(str(path) + ".lock"):  # absent or bad: look again under the lock before acting
        split = _local_split(artifact, name)
        if split is None and artifact.remote:
            split = _fetch_split(artifact, name)
        if split is None:
            split = _compute_split(artifact, name, make, cfg, device, seed)
    return split


def ood_split(artifact: Stage1Artifact, cfg: TrialConfig, name: str, device: torch.device) -> SplitCache:
    """Stage-I features and logits of the OOD set ``name``, computed once and cached in the artifact."""
    return _cached_split(artifact, f"ood-{name}.pt",
                         lambda: load_ood(name, cfg.data_root, cfg.download, cfg.dataset), cfg, device)


def corrupted_split(artifact: Stage1Artifact, cfg: TrialConfig, corruption: str, device: torch.device) -> SplitCache:
    """Stage-I features and logits of the test set under ``corruption``, severities 1..5 stacked in order
    (rows [(s−1)·N, s·N) are severity s), computed once and cached in the artifact."""
    return _cached_split(
        artifact, f"corruption-{corruption}.pt",
        lambda: ConcatDataset([load_corrupted(cfg.data_root, cfg.dataset, corruption, s) for s in SEVERITIES]),
        cfg, device)


def stage1_data(cfg: TrialConfig) -> TrainingSubset:
    """The dataset as Stage I trains on it (``stage1.train_size`` applied) and the held-out training images."""
    data = load_dataset(cfg.dataset, cfg.data_root, download=cfg.download, cifar100_test_norm=cfg.cifar100_test_norm)
    return restrict_training(data, cfg.stage1.train_size, cfg.dataset)


def _heldout_images(cfg: TrialConfig) -> Dataset:
    heldout = stage1_data(cfg).heldout
    if heldout is None:
        raise ConfigError(f"The split 'train_heldout' is the training images Stage I did not train on: set "
                          f"`stage1.train_size` below the size of {cfg.dataset}'s training split "
                          f"(got stage1.train_size={cfg.stage1.train_size}).")
    return heldout


METHOD_SPLITS: dict[str, tuple[Callable[[TrialConfig], Dataset], bool]] = {
    "train_heldout": (_heldout_images, False),
    "train_augmented": (lambda cfg: stage1_data(cfg).data.train, True),
}
"""Splits a method may read beyond train/val/test (``MethodSpec.splits``): the dataset, and whether its
transform draws at random. "train_heldout": the training images Stage I did not train on
(``stage1.train_size``), evaluation transform. "train_augmented": one view of each image Stage I trained
on under the training augmentation, drawn with the trial's seed."""


def method_split(artifact: Stage1Artifact, cfg: TrialConfig, name: str, device: torch.device) -> SplitCache:
    """Stage-I features and logits of the method split ``name`` (:data:`METHOD_SPLITS`), computed once and
    cached in the artifact as ``<name>.pt``."""
    make, random = METHOD_SPLITS[name]
    return _cached_split(artifact, f"{name}.pt", lambda: make(cfg), cfg, device, seed=cfg.seed if random else None)


# ---------------------------------------------------------------------------------------------------
# Stage-I artifacts


def _local_root(artifact_root: str) -> Path:
    if not storage.is_remote(artifact_root):
        return Path(artifact_root)
    cache = Path(os.environ.get("CALIB_ARTIFACT_CACHE", Path.home() / ".cache" / "calib" / "artifacts"))
    return cache / hashlib.sha256(artifact_root.encode()).hexdigest()[:16]


def stage1_dir(artifact_root: str | os.PathLike, stage1_id: str) -> Path:
    """The local directory of an artifact (a node-local copy when the root is an object store)."""
    return _local_root(str(artifact_root)) / "stage1" / stage1_id


def _remote_dir(artifact_root: str, stage1_id: str) -> str | None:
    return storage.join(artifact_root, "stage1", stage1_id) if storage.is_remote(artifact_root) else None


def stage1_exists(cfg: TrialConfig) -> bool:
    """Whether the Stage-I artifact of ``cfg`` is stored (complete) already, here or in the object store."""
    stage1_id = config_hash(stage1_identity(cfg))
    if (stage1_dir(cfg.artifact_root, stage1_id) / "record.json").exists():
        return True
    remote = _remote_dir(cfg.artifact_root, stage1_id)
    return remote is not None and storage.exists(storage.join(remote, "record.json"))


def _load(path: Path, stage1_id: str, remote: str | None) -> Stage1Artifact:
    """The artifact in ``path`` after every file passed its check (``CorruptArtifactError`` otherwise).

    model.pt is hashed against the record (or, for a record without checksums, loaded) but kept on disk.
    """
    record = _read_record(path)
    model_checksum = _recorded_checksum(record, "model.pt")
    if model_checksum is None:
        _torch_load(path / "model.pt")
    else:
        _verify_file(path / "model.pt", model_checksum)
    cache = _load_checked(path / "cache.pt", _recorded_checksum(record, "cache.pt"))
    try:
        splits = {s: SplitCache(cache[f"{s}_features"], cache[f"{s}_logits"], cache[f"{s}_labels"]) for s in SPLITS}
    except (KeyError, TypeError) as err:
        raise CorruptArtifactError(f"cache.pt lacks the cached splits ({err!r})") from None
    return Stage1Artifact(stage1_id, path, splits, record,
                          remote=storage.join(remote, _writer(record)) if remote else None)


def _load_local(final: Path, stage1_id: str, remote: str | None) -> Stage1Artifact | None:
    """The local artifact if it passes its checks; None if there is none or it failed (and was quarantined)."""
    if not final.exists():
        return None
    try:
        return _load(final, stage1_id, remote)
    except CorruptArtifactError as err:
        _quarantine_local(final, str(err))
        return None


def _fetch(remote: str, final: Path, record_text: bytes) -> None:
    """Download the published artifact whose ``record.json`` reads ``record_text`` (as read already) and the
    files of the writer it names into ``final``, via a temporary directory and a rename."""
    writer = _writer(_parse_record(record_text))
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex}"
    try:
        tmp.mkdir()
        (tmp / "record.json").write_bytes(record_text)
        for name in ARTIFACT_FILES:
            try:
                storage.download(storage.join(remote, writer, name), tmp / name)
            except FileNotFoundError:
                raise CorruptArtifactError(f"the writer's {name} is missing") from None
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fetch_checked(remote: str, final: Path, stage1_id: str) -> Stage1Artifact | None:
    """The published artifact, downloaded into ``final`` and checked; None if none is published.

    A bad download is discarded and downloaded once more; if it fails again, the published record and
    writer's files are quarantined (unless another node replaced the record meanwhile) and None returned.
    """
    record_location = storage.join(remote, "record.json")
    problem, seen = "", b""
    for attempt in (1, 2):
        try:
            seen = storage.read_bytes(record_location)
        except FileNotFoundError:
            return None
        try:
            _fetch(remote, final, seen)
            return _load(final, stage1_id, remote)
        except CorruptArtifactError as err:
            problem = str(err)
            shutil.rmtree(final, ignore_errors=True)
            if attempt == 1:
                _say(f"downloaded copy of {remote} failed its check ({problem}); discarded it, downloading again")
    with contextlib.suppress(FileNotFoundError):
        if storage.read_bytes(record_location) == seen:
            _quarantine_remote(remote, _published_files(remote, seen), f"Stage-I artifact {remote}", problem)
    return None


def _published_files(remote: str, record_text: bytes) -> list[str]:
    """``record.json`` and the files of the writer it names, relative to ``remote``."""
    try:
        writer = _writer(_parse_record(record_text))
    except CorruptArtifactError:
        return ["record.json"]
    return ["record.json", *(f"{writer}/{name}" for name in storage.list_files(storage.join(remote, writer)))]


def _publish(final: Path, remote: str) -> None:
    """Upload a local artifact: the writer's files first, ``record.json`` last."""
    writer = json.loads((final / "record.json").read_text())["writer"]
    for name in ARTIFACT_FILES:
        storage.upload(final / name, storage.join(remote, writer, name))
    storage.upload(final / "record.json", storage.join(remote, "record.json"))


def get_or_train_stage1(
    cfg: TrialConfig,
    device: torch.device,
    *,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
    resume: dict[str, Any] | None = None,
) -> tuple[Stage1Artifact, bool]:
    """The Stage-I artifact of ``cfg``, trained now only if no trial has stored a sound one yet.

    Returns ``(artifact, cache_hit)``; ``cache_hit`` is False exactly when this call trained Stage I
    (also when it replaced an artifact that failed its check, see the module docstring).
    ``on_checkpoint`` / ``resume`` are passed to :func:`calib.training.train_stage1` when it trains.
    """
    identity = stage1_identity(cfg)
    stage1_id = config_hash(identity)
    final = stage1_dir(cfg.artifact_root, stage1_id)
    remote = _remote_dir(cfg.artifact_root, stage1_id)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        with contextlib.suppress(CorruptArtifactError):
            return _load(final, stage1_id, remote), True
    with FileLock(str(final) + ".lock"):  # absent or bad: look again under the lock before acting
        artifact = _load_local(final, stage1_id, remote)
        if artifact is None and remote is not None:
            artifact = _fetch_checked(remote, final, stage1_id)
        if artifact is not None:
            return artifact, True
        _train_and_write(cfg, identity, final, device, on_epoch, on_checkpoint, resume)
        if remote is not None:
            _publish(final, remote)
    return _load(final, stage1_id, remote), False


def _train_and_write(
    cfg: TrialConfig,
    identity: dict[str, Any],
    final: Path,
    device: torch.device,
    on_epoch: Callable[[dict[str, Any]], None] | None,
    on_checkpoint: Callable[[dict[str, Any]], None] | None,
    resume: dict[str, Any] | None,
) -> None:
    data = stage1_data(cfg).data
    trained = train_stage1(cfg, data, device, on_epoch=on_epoch, on_checkpoint=on_checkpoint, resume=resume)
    cache: dict[str, torch.Tensor] = {}
    metrics: dict[str, float] = {}
    sources = ((("train", data.tensors.train), ("val", data.tensors.val), ("test", data.tensors.test))
               if trained.pipeline == "device" and data.tensors is not None
               else (("train", data.train_eval), ("val", data.val), ("test", data.test)))
    for split, source in sources:
        features, logits, labels = predict(trained.model, source, device, num_workers=cfg.num_workers,
                                           amp=cfg.stage1.amp, channels_last=cfg.stage1.channels_last)
        cache.update({f"{split}_features": features, f"{split}_logits": logits, f"{split}_labels": labels})
        if split != "train":
            scores = compute_all(softmax64(logits), labels.numpy(), num_bins=cfg.num_bins)
            metrics.update({f"{split}_{k}": v for k, v in scores.items()})
    record = {
        **identity,
        "num_classes": data.num_classes,
        "input_shape": list(data.input_shape),
        "num_features": trained.model.num_features,
        "history": trained.history,
        "metrics": metrics,
        "train_seconds": trained.train_seconds,
        "images_per_second": trained.images_per_second,
        "data_pipeline": trained.pipeline,
        "precision": trained.precision,
        "compile_mode": trained.compile_mode,
        "compile_seconds": trained.compile_seconds,
        "peak_memory_bytes": trained.peak_memory_bytes,
        "checkpoint_epoch": trained.best_epoch,
        "resumed_from_epoch": None if resume is None else int(resume["epoch"]),
        "device": describe_device(device),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "writer": f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
    }
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        torch.save(trained.model.state_dict(), tmp / "model.pt")
        torch.save(cache, tmp / "cache.pt")
        record["files"] = {name: _file_checksum(tmp / name) for name in ARTIFACT_FILES}
        (tmp / "record.json").write_text(json.dumps(record, indent=1))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
