"""A stored Stage I as later stages see it, where it lives, and how it is loaded after its checks.

Layout (docs/architecture.md contract 3), under a local ``artifact_root``::

    <artifact_root>/stage1/<stage1_id>/model.pt     state dict of the trained model
                                      /cache.pt     {split}_features / {split}_logits / {split}_labels
                                      /record.json  Stage-I identity, history, metrics, timings, the
                                                    writer id, and the checksums
                                                    "files": {"model.pt": {"bytes", "sha256"}, ...}
                                      /ood-<name>.pt, /corruption-<name>.pt, /train_heldout.pt, ...
                                                    cached splits (calib.artifacts.splits), each with
                                                    its sidecar <name>.pt.json {"bytes", "sha256"}
    <artifact_root>/stage1/<stage1_id>.claim        who trains it now (calib.artifacts.claim)
    <artifact_root>/quarantine/<stage1_id>-<UTC time>/   what failed its check, moved aside

With an object-store root (``s3://bucket/prefix``) each node keeps a local copy under
``$CALIB_ARTIFACT_CACHE`` (default ``~/.cache/calib/artifacts``) and the bucket holds::

    <artifact_root>/stage1/<stage1_id>/record.json   created once (first writer wins): the artifact exists once it does
                                      /claim.json    who trains it now
                                      /<writer>/model.pt, /<writer>/cache.pt, /<writer>/ood-*.pt ...
                                                     the files of the writer the record names
    <artifact_root>/quarantine/<stage1_id>-<UTC time>/...
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from calib import storage
from calib._config import ConfigError
from calib.artifacts.checks import (
    CorruptArtifactError,
    load_checked,
    quarantine_local,
    read_record,
    record_writer,
    recorded_checksum,
    torch_load,
    verify_file,
)
from calib.config import TrialConfig, config_hash, stage1_identity
from calib.models import CalibModel, create_model
from calib.training.balcal import BalCALModel

__all__ = ["ARTIFACT_FILES", "SPLITS", "SplitCache", "Stage1Artifact", "load_artifact", "load_local", "local_root",
           "remote_dir", "stage1_dir", "stage1_exists"]

SPLITS = ("train", "val", "test")
ARTIFACT_FILES = ("model.pt", "cache.pt")  # checksummed in record.json; record.json itself must parse


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
        """The Stage-I model (backbone and linear head), in eval mode. A features or predictions Stage I has none."""
        source = self.record.get("source", {})  # TrialConfig.source; absent for a trained Stage I
        if source.get("kind") in ("features", "predictions"):
            raise ConfigError(f"Stage I {self.stage1_id} is a {source['kind']} file: it has no model to compute the "
                              f"features of other images (OOD sets, corrupted test sets, other splits).")
        model = create_model(self.record["arch"], num_classes=self.num_classes,
                             in_channels=int(self.record["input_shape"][0]), head=source.get("head"))
        if (self.record.get("stage1") or {}).get("balcal_delta") is not None:  # trained with BalCAL's ETF head
            model = BalCALModel(model)
        model.load_state_dict(self._model_state())
        return model.to(device).eval()

    def head_state(self) -> dict[str, torch.Tensor]:
        """The Stage-I linear head's weight and bias."""
        head = {k.removeprefix("head."): v for k, v in self._model_state().items() if k.startswith("head.")}
        if not head:
            raise ConfigError(f"Stage I {self.stage1_id} has no linear head: its features file holds logits but no "
                              f"head_weight, so a method that starts from the Stage-I head (MaC-Cal's "
                              f"head_init='stage1') cannot run on it.")
        return head

    def _model_state(self) -> dict[str, torch.Tensor]:
        """model.pt, checked against the record; ``CorruptArtifactError`` if it changed since it was loaded
        (the next :func:`get_or_train_stage1` then moves the artifact aside and trains it again)."""
        try:
            return load_checked(self.path / "model.pt", recorded_checksum(self.record, "model.pt"))
        except CorruptArtifactError as err:
            raise CorruptArtifactError(f"Stage-I artifact {self.path}: {err}") from err


def local_root(artifact_root: str) -> Path:
    if not storage.is_remote(artifact_root):
        return Path(artifact_root)
    cache = Path(os.environ.get("CALIB_ARTIFACT_CACHE", Path.home() / ".cache" / "calib" / "artifacts"))
    return cache / hashlib.sha256(artifact_root.encode()).hexdigest()[:16]


def stage1_dir(artifact_root: str | os.PathLike, stage1_id: str) -> Path:
    """The local directory of an artifact (a node-local copy when the root is an object store)."""
    return local_root(str(artifact_root)) / "stage1" / stage1_id


def remote_dir(artifact_root: str, stage1_id: str) -> str | None:
    return storage.join(artifact_root, "stage1", stage1_id) if storage.is_remote(artifact_root) else None


def stage1_exists(cfg: TrialConfig) -> bool:
    """Whether the Stage-I artifact of ``cfg`` is stored (complete) already, here or in the object store."""
    stage1_id = config_hash(stage1_identity(cfg))
    if (stage1_dir(cfg.artifact_root, stage1_id) / "record.json").exists():
        return True
    remote = remote_dir(cfg.artifact_root, stage1_id)
    return remote is not None and storage.exists(storage.join(remote, "record.json"))


def load_artifact(path: Path, stage1_id: str, remote: str | None) -> Stage1Artifact:
    """The artifact in ``path`` after every file passed its check (``CorruptArtifactError`` otherwise).

    model.pt is hashed against the record (or, for a record without checksums, loaded) but kept on disk.
    """
    record = read_record(path)
    model_checksum = recorded_checksum(record, "model.pt")
    if model_checksum is None:
        torch_load(path / "model.pt")
    else:
        verify_file(path / "model.pt", model_checksum)
    cache = load_checked(path / "cache.pt", recorded_checksum(record, "cache.pt"))
    try:
        splits = {s: SplitCache(cache[f"{s}_features"], cache[f"{s}_logits"], cache[f"{s}_labels"]) for s in SPLITS}
    except (KeyError, TypeError) as err:
        raise CorruptArtifactError(f"cache.pt lacks the cached splits ({err!r})") from None
    return Stage1Artifact(stage1_id, path, splits, record,
                          remote=storage.join(remote, record_writer(record)) if remote else None)


def load_local(final: Path, stage1_id: str, remote: str | None) -> Stage1Artifact | None:
    """The local artifact if it passes its checks; None if there is none or it failed (and was quarantined)."""
    if not final.exists():
        return None
    try:
        return load_artifact(final, stage1_id, remote)
    except CorruptArtifactError as err:
        quarantine_local(final, str(err))
        return None

