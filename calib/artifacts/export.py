"""Stored Stage Is written out as features files (:mod:`calib.artifacts.features_file`'s format).

A features file holds what the two-stage and post-hoc methods need from a Stage I (the features and logits of the
train, val and test splits, the labels, the linear head), so a reader re-runs every such table from it in minutes
with ``--features FILE`` instead of training the Stage I again. ``python studies/report.py --export-features DIR``
writes one per Stage I of a row of the store, and ``DIR/SHA256SUMS`` (``sha256sum -c`` reads it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from calib._config import ConfigError
from calib.artifacts.artifact import SPLITS, Stage1Artifact
from calib.artifacts.sources import file_sha256
from calib.artifacts.stage1 import stored_stage1

__all__ = ["ExportedFeatures", "export_features", "features_dict", "write_features_file"]


@dataclass(frozen=True)
class ExportedFeatures:
    """One written features file: its path, size in bytes, SHA-256, and the Stage I it came from."""

    path: Path
    size: int
    sha256: str
    stage1_id: str


def features_dict(artifact: Stage1Artifact) -> dict[str, torch.Tensor]:
    """The features file's keys for ``artifact``: every split's features, logits and labels as cached, and the
    linear head when the Stage I has one (a features file of logits alone has none)."""
    out: dict[str, torch.Tensor] = {}
    for split in SPLITS:
        cache = artifact.splits[split]
        out[f"{split}_features"] = cache.features.float().contiguous()
        out[f"{split}_logits"] = cache.logits.float().contiguous()
        out[f"{split}_labels"] = cache.labels.long().contiguous()
    try:
        head = artifact.head_state()
    except ConfigError:
        return out
    out["head_weight"] = head["weight"].float().contiguous()
    if "bias" in head:
        out["head_bias"] = head["bias"].float().contiguous()
    return out


def write_features_file(artifact: Stage1Artifact, path: str | os.PathLike) -> ExportedFeatures:
    """Write ``artifact`` as a ``.pt`` features file at ``path`` (atomically: a reader never sees half a file)."""
    path = Path(path)
    if path.suffix not in (".pt", ".pth"):
        raise ConfigError(f"a features file written by calib is a .pt file, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    torch.save(features_dict(artifact), partial)
    os.replace(partial, path)
    return ExportedFeatures(path, path.stat().st_size, file_sha256(path), artifact.stage1_id)


def open_artifact(artifact_root: str, stage1_id: str) -> Stage1Artifact:
    """The stored Stage I ``stage1_id`` under ``artifact_root``, checked as a trial finds it
    (:func:`~calib.artifacts.stage1.stored_stage1`); ConfigError if there is none."""
    artifact = stored_stage1(artifact_root, stage1_id)
    if artifact is None:
        raise ConfigError(f"Stage I {stage1_id} is not in {artifact_root} (or failed its checks); --artifacts names "
                          f"the Stage-I artifact directory the store's trials used")
    return artifact


def _file_name(row: pd.Series) -> str:
    slug = re.sub(r"[^A-Za-z0-9.-]+", "-", str(row["label"])).strip("-") or "stage1"
    return f"{row['dataset']}_{row['arch']}_{slug}_seed{int(row['seed'])}.pt"


def export_features(trials: pd.DataFrame, artifact_root: str, out_dir: str | os.PathLike) -> list[ExportedFeatures]:
    """One features file per Stage I of ``trials`` (rows of the store: ``stage1_id``, ``dataset``, ``arch``,
    ``label``, ``seed``), named ``<dataset>_<arch>_<label>_seed<seed>.pt`` in ``out_dir``, and ``SHA256SUMS``
    there listing every file of the directory's export."""
    if trials.empty:
        raise ConfigError("no trial to export: the store holds no ok trial of the asked label and study")
    out_dir = Path(out_dir)
    firsts = trials.sort_values(["dataset", "arch", "seed", "label"]).drop_duplicates("stage1_id")
    written = [write_features_file(open_artifact(artifact_root, str(row["stage1_id"])), out_dir / _file_name(row))
               for _, row in firsts.iterrows()]
    sums = out_dir / "SHA256SUMS"
    listed = {}
    if sums.exists():  # an earlier export into the same folder keeps its lines
        for line in sums.read_text().splitlines():
            digest, _, name = line.partition("  ")
            listed[name] = digest
    listed.update({item.path.name: item.sha256 for item in written})
    sums.write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(listed.items())))
    return written
