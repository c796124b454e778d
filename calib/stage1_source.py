"""Where a trial's Stage I comes from when calib does not train it (a checkpoint, a features or a predictions file),
and what a trial config on such a Stage I may hold (docs/architecture.md §4.1)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from calib import storage
from calib._config import ConfigError, check
from calib.registries import DEFAULT_LOSS, LOSSES, METHODS

if TYPE_CHECKING:
    from calib.config import TrialConfig

__all__ = ["FILE_KINDS", "Stage1Source", "check_config_fits_given_stage1"]

FILE_KINDS = ("features", "predictions")
"""The Stage-I sources that are files of model outputs: no model, no dataset, no other images."""


@dataclass(frozen=True, kw_only=True)
class Stage1Source:
    """Where a trial's Stage I comes from (docs/architecture.md §4.1). The default trains it.

    Attributes:
        kind: "train" (calib trains the backbone: the default); "checkpoint" (a trained model's weights,
            for ``arch`` on ``dataset``: the splits' features and logits are computed with it, nothing is
            trained); "features" (a file of precomputed features, labels and the final linear layer or
            the logits, :mod:`calib.artifacts.features_file`: no model, no dataset); "predictions" (one file of
            a model's held-out predictions and labels, :mod:`calib.artifacts.predictions_file`: the trial's seed
            is the index of its stratified calibration/test split; only post-hoc methods run on it).
        path: the checkpoint, features or predictions file: an absolute path or an ``s3://`` URI.
        sha256: the file's SHA-256 (64 hex digits), part of the Stage-I identity, so a changed file is a
            new ``stage1_id``; the study computes it when it builds the configs and the trial checks it.
        head: dotted path of the final ``nn.Linear`` of a checkpoint's architecture ("fc",
            "classifier.3"), where finding it automatically fails; None: found automatically.
        labels_path, labels_sha256: the labels ``.npy`` of a ``.npy`` pair of predictions, and its SHA-256.
        calibration_fraction: the share of a predictions file's samples in the calibration part of each split,
            in (0, 1) (the benchmarks' 50/50: 0.5); null for the other kinds.
    """

    kind: Literal["train", "checkpoint", "features", "predictions"] = "train"
    path: str | None = None
    sha256: str | None = None
    head: str | None = None
    labels_path: str | None = None
    labels_sha256: str | None = None
    calibration_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.kind == "train":
            check(self.path is None and self.sha256 is None and self.head is None, "source", self,
                  "give no path, sha256 or head when kind is 'train' (Stage I is trained)")
        else:
            _check_file(self.path, self.sha256, "source.path", "source.sha256", f"the {self.kind} file")
        check(self.head is None or self.kind == "checkpoint", "source.head", self.head,
              "be null unless kind is 'checkpoint'")
        if self.kind != "predictions":
            for key in ("labels_path", "labels_sha256", "calibration_fraction"):
                check(getattr(self, key) is None, f"source.{key}", getattr(self, key),
                      "be null unless kind is 'predictions'")
            return
        check(isinstance(self.calibration_fraction, float) and 0 < self.calibration_fraction < 1,
              "source.calibration_fraction", self.calibration_fraction,
              "be a number in (0, 1): the share of the predictions in each split's calibration part")
        check((self.labels_path is None) == (self.labels_sha256 is None), "source.labels_path", self.labels_path,
              "come with source.labels_sha256 (a .npy pair), or both be null")
        if self.labels_path is not None:
            _check_file(self.labels_path, self.labels_sha256, "source.labels_path", "source.labels_sha256",
                        "the labels .npy")


def _check_file(path: Any, sha256: Any, path_key: str, sha_key: str, what: str) -> None:
    check(isinstance(path, str) and (os.path.isabs(path) or storage.is_remote(path)), path_key, path,
          f"be the absolute path or s3:// URI of {what}")
    check(isinstance(sha256, str) and re.fullmatch(r"[0-9a-f]{64}", sha256) is not None, sha_key, sha256,
          "be the file's SHA-256, 64 lowercase hex digits",
          "The studies compute it (calib.artifacts.sources.resolve_source).")


def check_config_fits_given_stage1(cfg: TrialConfig) -> None:
    """A Stage I that calib does not train (a checkpoint, a features file) takes no training recipe, and a
    features one no dataset: the rows of loss-based methods, Mixup and MIT, OOD sets and method splits."""
    kind = cfg.source.kind
    given = f"this trial's Stage I comes from a {kind} file (source.kind={kind!r}), which calib does not train"
    runs_on_it = f"The methods that run on a given Stage I: {', '.join(METHODS.names())}."
    if cfg.loss.name != DEFAULT_LOSS or cfg.loss.params != LOSSES.get(DEFAULT_LOSS).config():
        raise ConfigError(f"`loss`={cfg.loss.name!r} is a way to train Stage I, but {given}: loss-based methods do "
                          f"not apply to it (they are Stage-I trainings). {runs_on_it}")
    for name, spec in cfg.stage1.on():  # the training procedures (Mixup, MIT, PLP, BalCAL, a plugin's)
        value = getattr(cfg.stage1, spec.switch)
        check(False, f"stage1.{spec.switch}", value, f"be null: {spec.label or name} trains Stage I, but {given}",
              runs_on_it)
    if kind not in FILE_KINDS:
        return
    check(cfg.stage1.train_size is None, "stage1.train_size", cfg.stage1.train_size,
          f"be null for a {kind} Stage I: its splits are the file's")
    for key in ("ood_datasets", "corruptions"):
        check(not getattr(cfg, key), key, getattr(cfg, key),
              f"be empty for a {kind} Stage I: without a model, calib cannot compute features of other images")
    spec = METHODS.get(cfg.method.name)
    if kind == "predictions":
        logits_only = [name for name in METHODS.names() if METHODS.get(name).logits_only]
        check(spec.logits_only, "method", cfg.method.name,
              f"be a method that reads only logits: a predictions file holds no features and no training split, "
              f"so only the uncalibrated model and the post-hoc methods run on it ({', '.join(logits_only)})")
    splits = spec.splits(cfg.method.params)
    check(not splits, "method", cfg.method.to_dict(),
          f"read only the train/val/test splits of a {kind} Stage I, but this config reads {', '.join(splits)}, "
          f"which the file does not hold (use method.stats_source 'train')")
