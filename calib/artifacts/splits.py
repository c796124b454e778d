"""Stage-I outputs computed after Stage I, on first use: OOD sets, corrupted test sets, method splits.

Each is predicted once by the Stage-I model and cached in the artifact as ``<name>.pt`` with its
checksum sidecar ``<name>.pt.json`` (written after it); with an object-store root both are uploaded
beside the writer's files, so every node reuses the same copy.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock
from torch.utils.data import ConcatDataset, Dataset

from calib import storage
from calib._config import ConfigError
from calib.artifacts.artifact import SplitCache, Stage1Artifact
from calib.artifacts.checks import (
    CorruptArtifactError,
    load_checked,
    quarantine_local,
    quarantine_remote,
    read_sidecar,
    say,
    sidecar,
    write_sidecar,
)
from calib.artifacts.stage1 import stage1_data
from calib.config import TrialConfig
from calib.datasets import load_ood
from calib.datasets.corruptions import SEVERITIES, load_corrupted
from calib.training import predict, prepare_model

__all__ = ["METHOD_SPLITS", "corrupted_split", "method_split", "ood_split"]


def _load_split(path: Path) -> SplitCache:
    """A cached split after its check against its sidecar (by loading it where there is none)."""
    cache = load_checked(path, read_sidecar(path))
    try:
        return SplitCache(cache["features"], cache["logits"], cache["labels"])
    except (KeyError, TypeError) as err:
        raise CorruptArtifactError(f"{path.name} holds no features, logits and labels ({err!r})") from None


def _local_split(artifact: Stage1Artifact, name: str) -> SplitCache | None:
    """The split cached locally if it passes its check; None if there is none or it failed (and was quarantined)."""
    path = artifact.path / name
    if not (path.exists() or sidecar(path).exists()):
        return None
    try:
        return _load_split(path)
    except CorruptArtifactError as err:
        quarantine_local(artifact.path, str(err), names=(name, sidecar(path).name))
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
            storage.download(storage.join(artifact.remote, sidecar(path).name), sidecar(path))
        except FileNotFoundError:
            sidecar(path).unlink(missing_ok=True)  # published before checksums, or the sidecar is on its way
        try:
            return _load_split(path)
        except CorruptArtifactError as err:
            problem = str(err)
            path.unlink(missing_ok=True)
            sidecar(path).unlink(missing_ok=True)
            if attempt == 1:
                say(f"downloaded {remote_file} failed its check ({problem}); discarded the copy, downloading again")
    stage1_remote, writer = artifact.remote.rsplit("/", 1)
    quarantine_remote(stage1_remote, [f"{writer}/{name}", f"{writer}/{sidecar(path).name}"],
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
    write_sidecar(path)
    if artifact.remote:
        storage.upload(path, storage.join(artifact.remote, name))
        storage.upload(sidecar(path), storage.join(artifact.remote, sidecar(path).name))
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


