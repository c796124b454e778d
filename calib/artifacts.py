"""Stage-I artifacts: weights, cached features/logits and the record, keyed by the Stage-I config hash.

Layout (DESIGN.md contract 3)::

    <artifact_root>/stage1/<stage1_id>/model.pt     state dict of the trained model
                                      /cache.pt     {split}_features / {split}_logits / {split}_labels
                                      /record.json  Stage-I identity, history, metrics, timings

An artifact directory is written under a temporary name and renamed into place, so a reader sees a
complete artifact or none. A file lock per ``stage1_id`` makes concurrent trials with the same
Stage-I config wait for the first one instead of training again.

With an object-store ``artifact_root`` (``s3://bucket/prefix``, for clusters), each node keeps a
local copy under ``$CALIB_ARTIFACT_CACHE`` (default ``~/.cache/calib/artifacts``) and the bucket
holds::

    <artifact_root>/stage1/<stage1_id>/record.json          written last: the artifact exists once it does
                                      /<writer>/model.pt    the files of the node that trained it
                                      /<writer>/cache.pt    (and its cached OOD / corrupted splits)

Nodes that find ``record.json`` download the files of the writer it names, so a reader never mixes
the weights of one training with the features of another, even if two nodes raced to train.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from torch.utils.data import ConcatDataset, Dataset

from calib import storage
from calib.config import TrialConfig, config_hash, stage1_identity
from calib.datasets import load_dataset, load_ood
from calib.datasets.corruptions import SEVERITIES, load_corrupted
from calib.metrics import compute_all, softmax64
from calib.models import CalibModel, create_model
from calib.training import describe_device, predict, train_stage1

__all__ = [
    "SPLITS",
    "SplitCache",
    "Stage1Artifact",
    "corrupted_split",
    "get_or_train_stage1",
    "ood_split",
    "stage1_dir",
    "stage1_exists",
]

SPLITS = ("train", "val", "test")


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
        model.load_state_dict(torch.load(self.path / "model.pt", map_location="cpu", weights_only=True))
        return model.to(device).eval()

    def head_state(self) -> dict[str, torch.Tensor]:
        """The Stage-I linear head's weight and bias."""
        state = torch.load(self.path / "model.pt", map_location="cpu", weights_only=True)
        return {k.removeprefix("head."): v for k, v in state.items() if k.startswith("head.")}


def _cached_split(artifact: Stage1Artifact, name: str, make: Callable[[], Dataset], cfg: TrialConfig,
                  device: torch.device) -> SplitCache:
    path = artifact.path / name
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            if artifact.remote and storage.exists(storage.join(artifact.remote, name)):
                storage.download(storage.join(artifact.remote, name), path)
            else:
                features, logits, labels = predict(artifact.load_model(device), make(), device,
                                                   num_workers=cfg.num_workers)
                tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
                torch.save({"features": features, "logits": logits, "labels": labels}, tmp)
                os.replace(tmp, path)
                if artifact.remote:
                    storage.upload(path, storage.join(artifact.remote, name))
    cache = torch.load(path, map_location="cpu", weights_only=True)
    return SplitCache(cache["features"], cache["logits"], cache["labels"])


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
    record = json.loads((path / "record.json").read_text())
    cache = torch.load(path / "cache.pt", map_location="cpu", weights_only=True)
    splits = {s: SplitCache(cache[f"{s}_features"], cache[f"{s}_logits"], cache[f"{s}_labels"]) for s in SPLITS}
    return Stage1Artifact(stage1_id, path, splits, record,
                          remote=storage.join(remote, record["writer"]) if remote else None)


def _fetch(remote: str, final: Path) -> None:
    """Download a published artifact into ``final`` (through a temporary directory and a rename)."""
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex}"
    try:
        storage.download(storage.join(remote, "record.json"), tmp / "record.json")
        writer = json.loads((tmp / "record.json").read_text())["writer"]
        for name in ("model.pt", "cache.pt"):
            storage.download(storage.join(remote, writer, name), tmp / name)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(final: Path, remote: str) -> None:
    """Upload a local artifact: the writer's files first, ``record.json`` last."""
    writer = json.loads((final / "record.json").read_text())["writer"]
    for name in ("model.pt", "cache.pt"):
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
    """The Stage-I artifact of ``cfg``, trained now only if no trial has stored it yet.

    Returns ``(artifact, cache_hit)``; ``cache_hit`` is False exactly when this call trained Stage I.
    ``on_checkpoint`` / ``resume`` are passed to :func:`calib.training.train_stage1` when it trains.
    """
    identity = stage1_identity(cfg)
    stage1_id = config_hash(identity)
    final = stage1_dir(cfg.artifact_root, stage1_id)
    remote = _remote_dir(cfg.artifact_root, stage1_id)
    final.parent.mkdir(parents=True, exist_ok=True)
    if (final / "record.json").exists():
        return _load(final, stage1_id, remote), True
    with FileLock(str(final) + ".lock"):
        if (final / "record.json").exists():
            return _load(final, stage1_id, remote), True
        if remote is not None and storage.exists(storage.join(remote, "record.json")):
            _fetch(remote, final)
            return _load(final, stage1_id, remote), True
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
    data = load_dataset(cfg.dataset, cfg.data_root, download=cfg.download, cifar100_test_norm=cfg.cifar100_test_norm)
    trained = train_stage1(cfg, data, device, on_epoch=on_epoch, on_checkpoint=on_checkpoint, resume=resume)
    cache: dict[str, torch.Tensor] = {}
    metrics: dict[str, float] = {}
    for split, dataset in (("train", data.train_eval), ("val", data.val), ("test", data.test)):
        features, logits, labels = predict(trained.model, dataset, device, num_workers=cfg.num_workers)
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
        (tmp / "record.json").write_text(json.dumps(record, indent=1))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
