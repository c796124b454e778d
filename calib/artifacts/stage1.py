"""Stage I: the artifact of a config, found (here, or published by another node) or trained once.

A file lock per ``stage1_id`` makes the trials of one node wait for each other; a claim
(:mod:`calib.artifacts.claim`) does the same across nodes and concurrent studies: the first trial
anywhere trains, the others wait for its artifact, and one that takes over a dead holder's claim
continues from the state it left (:mod:`calib.artifacts.handover`). An artifact that fails its checks is quarantined
and trained again (:mod:`calib.artifacts.checks`). With an object-store root the trained artifact is
published first-writer-wins (:mod:`calib.artifacts.publish`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

from calib import storage
from calib.artifacts.artifact import (
    ARTIFACT_FILES,
    Stage1Artifact,
    load_artifact,
    load_local,
    remote_dir,
    stage1_dir,
)
from calib.artifacts.checks import CorruptArtifactError, file_checksum, parse_record, record_writer
from calib.artifacts.claim import ClaimSettings, acquire, new_writer_id
from calib.artifacts.handover import Handover
from calib.artifacts.publish import fetch_checked, publish
from calib.artifacts.sources import checkpoint_model, features_of, predictions_split
from calib.artifacts.waits import NOTE, WAITED, WAITING, Stage1Event, tell
from calib.config import TrialConfig, config_hash, stage1_identity
from calib.datasets import load_dataset
from calib.datasets.subsets import TrainingSubset, restrict_training
from calib.metrics import compute_all, softmax64
from calib.training import describe_device, predict, prepare_model, train_stage1

__all__ = ["get_or_train_stage1", "stage1_data"]


def stage1_data(cfg: TrialConfig) -> TrainingSubset:
    """The dataset as Stage I trains on it (``stage1.train_size`` applied) and the held-out training images."""
    data = load_dataset(cfg.dataset, cfg.data_root, download=cfg.download, cifar100_test_norm=cfg.cifar100_test_norm,
                        options=cfg.dataset_options)
    return restrict_training(data, cfg.stage1.train_size, cfg.dataset)


def _published_writer(remote: str) -> str | None:
    """The writer the published ``record.json`` names; None if none is published (or it names none)."""
    try:
        return record_writer(parse_record(storage.read_bytes(storage.join(remote, "record.json"))))
    except (FileNotFoundError, CorruptArtifactError):
        return None


def _find(final: Path, stage1_id: str, remote: str | None) -> Stage1Artifact | None:
    """The artifact after its checks: the local one, or with an object-store root the published one (the
    local copy only if it is of the writer the record names; another is dropped for the published
    one). None if there is none, or it failed its checks and was moved aside."""
    if remote is None:
        return load_local(final, stage1_id, remote)
    writer = _published_writer(remote)
    if writer is None:
        return None
    local = load_local(final, stage1_id, remote)
    if local is not None and local.record.get("writer") == writer:
        return local
    shutil.rmtree(final, ignore_errors=True)  # a copy of another training, or none
    return fetch_checked(remote, final, stage1_id)


def stored_stage1(artifact_root: str, stage1_id: str) -> Stage1Artifact | None:
    """The stored Stage I ``stage1_id`` under ``artifact_root`` after its checks, as a trial would find it (with an
    object-store root: the published writer's, fetched when the local copy is not it); None if there is none."""
    return _find(stage1_dir(artifact_root, stage1_id), stage1_id, remote_dir(artifact_root, stage1_id))


def _published(final: Path, remote: str | None) -> bool:
    if remote is None:
        return (final / "record.json").exists()
    return storage.exists(storage.join(remote, "record.json"))


def get_or_train_stage1(
    cfg: TrialConfig,
    device: torch.device,
    *,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
    resume: dict[str, Any] | None = None,
    claims: ClaimSettings | None = None,
) -> tuple[Stage1Artifact, bool]:
    """The Stage-I artifact of ``cfg``, trained now only if no trial anywhere has stored a sound one
    or is training it (then this call waits for it, see :mod:`calib.artifacts.claim`).

    Returns ``(artifact, cache_hit)``; ``cache_hit`` is False exactly when the artifact returned is this
    call's own training (also when it replaced an artifact that failed its check, or published a local
    copy whose trial died before publishing it). A training that lost the race to publish is discarded
    and the published artifact returned, with ``cache_hit`` True. ``on_checkpoint`` / ``resume`` are
    passed to :func:`calib.training.train_stage1` when it trains; without ``resume`` it continues the
    state a dead holder left (:mod:`calib.artifacts.handover`). ``claims`` default to
    :meth:`ClaimSettings.from_env`.
    """
    identity = stage1_identity(cfg)
    stage1_id = config_hash(identity)
    final = stage1_dir(cfg.artifact_root, stage1_id)
    remote = remote_dir(cfg.artifact_root, stage1_id)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        # FileNotFoundError: a trial under the lock quarantined the folder while this one read it
        with contextlib.suppress(CorruptArtifactError, FileNotFoundError):
            artifact = load_artifact(final, stage1_id, remote)
            if remote is None or artifact.record.get("writer") == _published_writer(remote):
                return artifact, True
    writer = new_writer_id()
    with _node_lock(final, stage1_id):  # absent, bad or not the published one: look again under the lock
        while True:
            artifact = _find(final, stage1_id, remote)
            if artifact is not None:
                return artifact, True
            claim = acquire(cfg.artifact_root, stage1_id, lambda: _published(final, remote), writer,
                            claims or ClaimSettings.from_env(), tell)
            if claim is not None:
                break  # else it was published meanwhile: load it (or, if it fails its checks, claim it)
        with claim:
            artifact = _find(final, stage1_id, remote)  # published just before this claim was created
            if artifact is not None:
                return artifact, True
            handover = Handover(cfg.artifact_root, stage1_id, final.parent)
            orphan = load_local(final, stage1_id, remote) if remote is not None else None
            if orphan is not None:  # trained here by a trial that died before publishing it
                tell(Stage1Event(NOTE, stage1_id, f"Stage I {stage1_id}: publishing the copy "
                                                  f"{orphan.record.get('writer')} trained on this node before its "
                                                  f"trial ended"))
                first = True
            else:
                if resume is None and (resume := handover.latest()) is not None:
                    tell(Stage1Event(NOTE, stage1_id, f"Stage I {stage1_id}: continuing the training "
                                                      f"{claim.took_over or 'a previous holder'} left at epoch "
                                                      f"{int(resume['epoch']) + 1}"))
                first = _train_and_write(cfg, identity, final, device, on_epoch, handover.keeping(on_checkpoint, claim),
                                         resume, writer)
            other = None if first else "another node"
            if first and remote is not None:
                other = publish(final, remote)
                if other is not None:
                    shutil.rmtree(final)
            handover.discard()
            if other is not None:
                tell(Stage1Event(NOTE, stage1_id, f"Stage I {stage1_id} was published by {other} while this trial "
                                                  f"({writer}) trained it too; discarded this copy and adopted the "
                                                  f"published one"))
                artifact = _find(final, stage1_id, remote)
                if artifact is None:
                    raise CorruptArtifactError(f"Stage I {stage1_id}: the artifact published by {other} "
                                               f"failed its checks")
                return artifact, True
    return load_artifact(final, stage1_id, remote), False


NODE_LOCK_QUIET_SECONDS = 2.0
"""How long a trial waits for the node's lock on a Stage I before it says so: under the lock other trials of
the node only look at the artifact, unless one of them trains it."""


@contextlib.contextmanager
def _node_lock(final: Path, stage1_id: str) -> Iterator[None]:
    """The lock the trials of this node take on ``stage1_id``; a wait for it longer than
    :data:`NODE_LOCK_QUIET_SECONDS` (another trial of the node trains it) is told as a wait."""
    lock = FileLock(str(final) + ".lock")
    start = time.monotonic()
    try:
        lock.acquire(timeout=NODE_LOCK_QUIET_SECONDS)
    except Timeout:
        tell(Stage1Event(WAITING, stage1_id, f"Stage I {stage1_id} is being trained by another trial on this "
                                             f"node; waiting for it"))
        lock.acquire()
        waited = time.monotonic() - start
        tell(Stage1Event(WAITED, stage1_id, f"Stage I {stage1_id}: the other trial on this node let it go after "
                                            f"this trial waited {waited:.0f} s", waited))
    try:
        yield
    finally:
        lock.release()


def _cache_splits(model: Any, sources: Any, cfg: TrialConfig, device: torch.device
                  ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Features, logits and labels of each split under ``model``, and the val/test metrics of its logits."""
    cache: dict[str, torch.Tensor] = {}
    for split, source in sources:
        features, logits, labels = predict(model, source, device, num_workers=cfg.num_workers,
                                           amp=cfg.stage1.amp, channels_last=cfg.stage1.channels_last)
        cache.update({f"{split}_features": features, f"{split}_logits": logits, f"{split}_labels": labels})
    return cache, _split_metrics(cache, cfg)


def _split_metrics(cache: dict[str, torch.Tensor], cfg: TrialConfig) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for split in ("val", "test"):
        scores = compute_all(softmax64(cache[f"{split}_logits"]), cache[f"{split}_labels"].numpy(),
                             num_bins=cfg.num_bins)
        metrics.update({f"{split}_{k}": v for k, v in scores.items()})
    return metrics


def _trained(cfg: TrialConfig, device: torch.device, on_epoch: Callable[[dict[str, Any]], None] | None,
             on_checkpoint: Callable[[dict[str, Any]], None] | None, resume: dict[str, Any] | None
             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """Stage I trained here: the model's state, the cached splits, the record's fields."""
    data = stage1_data(cfg).data
    trained = train_stage1(cfg, data, device, on_epoch=on_epoch, on_checkpoint=on_checkpoint, resume=resume)
    sources = ((("train", data.tensors.train), ("val", data.tensors.val), ("test", data.tensors.test))
               if trained.pipeline == "device" and data.tensors is not None
               else (("train", data.train_eval), ("val", data.val), ("test", data.test)))
    cache, metrics = _cache_splits(trained.model, sources, cfg, device)
    return trained.model.state_dict(), cache, {
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
    }


def _from_checkpoint(cfg: TrialConfig, device: torch.device
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """Stage I from a checkpoint: its model's features and logits of the dataset's splits; nothing trained."""
    start = time.perf_counter()
    data = stage1_data(cfg).data
    model = prepare_model(checkpoint_model(cfg, data.num_classes, data.input_shape), device,
                          cfg.stage1.channels_last)
    cache, metrics = _cache_splits(model, (("train", data.train_eval), ("val", data.val), ("test", data.test)),
                                   cfg, device)
    return model.state_dict(), cache, {
        "num_classes": data.num_classes, "input_shape": list(data.input_shape), "num_features": model.num_features,
        "head_name": getattr(model, "head_name", None), "history": [], "metrics": metrics,
        "train_seconds": 0.0, "extract_seconds": time.perf_counter() - start, "data_pipeline": "loader",
        "precision": "fp32" if cfg.stage1.amp == "off" or device.type != "cuda" else cfg.stage1.amp,
    }


def _from_features(cfg: TrialConfig) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """Stage I from a features file: its splits as they are, its head (if any) as the model's state."""
    file = features_of(cfg)
    cache = {f"{split}_{part}": getattr(c, part) for split, c in file.splits.items()
             for part in ("features", "logits", "labels")}
    head = {f"head.{k}": v for k, v in (file.head_state or {}).items()}
    return head, cache, {
        "num_classes": file.num_classes, "input_shape": None, "num_features": file.num_features,
        "class_names": file.class_names, "history": [], "metrics": _split_metrics(cache, cfg),
        "train_seconds": 0.0,
    }


def _from_predictions(cfg: TrialConfig) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """Stage I from a predictions file: split ``cfg.seed`` of it, the calibration part as the validation split and
    the rest as the test split (float64 scores as logits, also as features); the training split is empty."""
    predictions, calibration, test = predictions_split(cfg)
    scores, labels = torch.from_numpy(predictions.scores), torch.from_numpy(predictions.labels)
    parts = {"train": torch.zeros(0, dtype=torch.int64), "val": torch.from_numpy(calibration),
             "test": torch.from_numpy(test)}
    cache = {f"{split}_{part}": value for split, rows in parts.items()
             for part, value in (("features", scores[rows]), ("logits", scores[rows]), ("labels", labels[rows]))}
    return {}, cache, {
        "num_classes": predictions.num_classes, "input_shape": None, "num_features": predictions.num_classes,
        "predictions_kind": predictions.kind, "history": [], "metrics": _split_metrics(cache, cfg),
        "train_seconds": 0.0,
    }


def _train_and_write(
    cfg: TrialConfig,
    identity: dict[str, Any],
    final: Path,
    device: torch.device,
    on_epoch: Callable[[dict[str, Any]], None] | None,
    on_checkpoint: Callable[[dict[str, Any]], None] | None,
    resume: dict[str, Any] | None,
    writer: str,
) -> bool:
    """Train Stage I (or compute it from ``cfg.source``), cache its splits and write the artifact into
    ``final`` through a temporary directory and a rename; False (and nothing written) if another writer's
    artifact took ``final`` first."""
    if cfg.source.kind == "checkpoint":
        model_state, cache, fields = _from_checkpoint(cfg, device)
    elif cfg.source.kind == "features":
        model_state, cache, fields = _from_features(cfg)
    elif cfg.source.kind == "predictions":
        model_state, cache, fields = _from_predictions(cfg)
    else:
        model_state, cache, fields = _trained(cfg, device, on_epoch, on_checkpoint, resume)
    record = {
        **identity,
        **fields,
        **({"source_path": cfg.source.path} if cfg.source.kind != "train" else {}),
        "device": describe_device(device),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "writer": writer,
    }
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        torch.save(model_state, tmp / "model.pt")
        torch.save(cache, tmp / "cache.pt")
        record["files"] = {name: file_checksum(tmp / name) for name in ARTIFACT_FILES}
        (tmp / "record.json").write_text(json.dumps(record, indent=1))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        try:
            os.rename(tmp, final)
        except OSError:  # a shared directory where another node's artifact landed first
            if not (final / "record.json").exists():
                raise
            return False
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
