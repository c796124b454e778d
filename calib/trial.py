"""``run_trial(config) -> TrialResult``: one trial, from Stage I to metrics (docs/architecture.md contract 1).

A plain function of a plain config. It knows nothing of Ray: Ray Tune, a local loop and the tests
call the same function.
"""

from __future__ import annotations

import datetime as dt
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from calib import progress
from calib._versions import run_environment
from calib.artifacts import corrupted_split, get_or_train_stage1, ood_split
from calib.config import TrialConfig, config_hash, parse_trial_config, stage1_identity, trial_identity
from calib.datasets.corruptions import SEVERITIES
from calib.methods import METHODS
from calib.metrics import (
    accuracy,
    compute_all,
    expected_calibration_error,
    ood_auroc,
    ood_fpr_at_95_tpr,
    reliability_bins,
)
from calib.training import describe_device, resolve_device, seed_everything

__all__ = ["TrialResult", "run_trial", "trial_id"]


def trial_id(config: dict[str, Any] | TrialConfig) -> str:
    """The store key of a trial: the hash of its config without paths and placement."""
    return config_hash(trial_identity(parse_trial_config(config)))


@dataclass
class TrialResult:
    """What one trial produced: val_*/test_* (and ood_*) metrics as fractions, list-valued ``details``
    (test reliability bins, per-OOD-set values), per-epoch history, timings, provenance."""

    config: TrialConfig
    trial_id: str
    stage1_id: str
    status: str = "ok"
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, list] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    stage1_cache_hit: bool | None = None
    timings: dict[str, float] = field(default_factory=dict)
    started_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    finished_at: dt.datetime | None = None
    device: str | None = None
    stage1_device: str | None = None
    stage1_execution: dict[str, Any] = field(default_factory=dict)
    stage1_resumed_from_epoch: int | None = None
    failed_stage: str | None = None
    failed_epoch: int | None = None
    environment: dict[str, str | None] = field(default_factory=run_environment)

    @classmethod
    def failed(cls, config: TrialConfig, error: BaseException, started_at: dt.datetime) -> TrialResult:
        """A ``failed`` result carrying the exception, its traceback's last frames, and the (stage, epoch)
        the trial had reached (:mod:`calib.training.progress`)."""
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        frames = "".join(traceback.format_tb(error.__traceback__)[-3:])
        stage, epoch = progress.last() or (None, None)
        return cls(
            config=config, trial_id=trial_id(config), stage1_id=config_hash(stage1_identity(config)),
            status="failed", error=f"{text}\n{frames}", started_at=started_at,
            finished_at=dt.datetime.now(dt.timezone.utc), failed_stage=stage, failed_epoch=epoch,
        )


def stage1_execution(record: dict[str, Any]) -> dict[str, Any]:
    """How the artifact's Stage I ran, as store columns (None for artifacts written before it was recorded)."""
    return {"stage1_pipeline": record.get("data_pipeline"), "stage1_precision": record.get("precision"),
            "stage1_compile_mode": record.get("compile_mode"),
            "stage1_peak_memory_bytes": record.get("peak_memory_bytes")}


def _ood_metrics(
    cfg: TrialConfig, artifact: Any, outcome: Any, device: torch.device
) -> tuple[dict[str, float], dict[str, list]]:
    """MSP OOD detection (in-distribution positive) against each OOD set: the means over the sets
    (MaC-Cal Table 2) and the per-set values."""
    if not cfg.ood_datasets:
        return {}, {}
    id_scores = outcome.test_probs.max(dim=1).values.numpy()
    aurocs, fprs = [], []
    for name in cfg.ood_datasets:
        split = ood_split(artifact, cfg, name, device)
        ood_scores = outcome.predict(split.features, split.logits).max(dim=1).values.numpy()
        aurocs.append(ood_auroc(id_scores, ood_scores))
        fprs.append(ood_fpr_at_95_tpr(id_scores, ood_scores))
    means = {"ood_auroc": sum(aurocs) / len(aurocs), "ood_fpr95": sum(fprs) / len(fprs)}
    return means, {"ood_auroc_per_dataset": aurocs, "ood_fpr95_per_dataset": fprs}


def _corruption_metrics(
    cfg: TrialConfig, artifact: Any, outcome: Any, device: torch.device
) -> tuple[dict[str, float], dict[str, list]]:
    """ECE and accuracy per (corruption, severity) (docs/methods.md §6.8), their means per severity over the
    corruptions (MaC-Cal Fig. 5), and the overall means."""
    if not cfg.corruptions:
        return {}, {}
    ece, acc = [], []
    for name in cfg.corruptions:
        split = corrupted_split(artifact, cfg, name, device)
        probs = outcome.predict(split.features, split.logits).numpy()
        labels = split.labels.numpy()
        n = len(labels) // len(SEVERITIES)
        for s in range(len(SEVERITIES)):
            rows = slice(s * n, (s + 1) * n)
            ece.append(expected_calibration_error(probs[rows], labels[rows], num_bins=cfg.num_bins))
            acc.append(accuracy(probs[rows], labels[rows]))
    def by_severity(values: list[float]) -> list[float]:
        return np.asarray(values).reshape(-1, len(SEVERITIES)).mean(axis=0).tolist()

    return ({"corrupted_ece": sum(ece) / len(ece), "corrupted_accuracy": sum(acc) / len(acc)},
            {"corrupted_ece_by_severity": by_severity(ece), "corrupted_accuracy_by_severity": by_severity(acc),
             "corrupted_ece_all": ece, "corrupted_accuracy_all": acc})


def run_trial(
    config: dict[str, Any] | TrialConfig,
    *,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
    resume: dict[str, Any] | None = None,
) -> TrialResult:
    """Validate ``config``, get (or train) its Stage-I artifact, run its method, evaluate val and test.

    ``on_epoch`` receives every Stage-I history row while Stage I trains (progress reporting);
    ``on_checkpoint`` the Stage-I training state after every epoch, which ``resume`` continues from
    (see :func:`calib.training.train_stage1`). Both apply only when this trial trains Stage I.
    """
    progress.reset()
    cfg = parse_trial_config(config)
    started_at = dt.datetime.now(dt.timezone.utc)
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    artifact, cache_hit = get_or_train_stage1(cfg, device, on_epoch=on_epoch, on_checkpoint=on_checkpoint,
                                              resume=resume)
    loaded = time.perf_counter()

    seed_everything(cfg.seed)
    progress.record("stage2", 0)  # the method's own loop refines the epoch
    outcome = METHODS.get(cfg.method.name)(cfg.method.params, artifact, seed=cfg.seed, device=device)
    method_done = time.perf_counter()

    metrics: dict[str, float] = {}
    for split, probs in (("val", outcome.val_probs), ("test", outcome.test_probs)):
        labels = artifact.splits[split].labels.numpy()
        scores = compute_all(probs.detach().cpu().double().numpy(), labels, num_bins=cfg.num_bins)
        metrics.update({f"{split}_{k}": v for k, v in scores.items()})
    counts, confidence, accuracy = reliability_bins(
        outcome.test_probs.detach().cpu().double().numpy(), artifact.splits["test"].labels.numpy(),
        num_bins=cfg.num_bins,
    )
    details = {"test_bin_count": counts.tolist(), "test_bin_confidence": confidence.tolist(),
               "test_bin_accuracy": accuracy.tolist()}
    ood_means, ood_per_set = _ood_metrics(cfg, artifact, outcome, device)
    metrics.update(ood_means)
    details.update(ood_per_set)
    corrupted_means, corrupted_lists = _corruption_metrics(cfg, artifact, outcome, device)
    metrics.update(corrupted_means)
    details.update(corrupted_lists)
    evaluated = time.perf_counter()

    history = [dict(row) for row in artifact.record["history"]] + outcome.history
    return TrialResult(
        config=cfg,
        trial_id=config_hash(trial_identity(cfg)),
        stage1_id=artifact.stage1_id,
        metrics=metrics,
        details=details,
        history=history,
        stage1_cache_hit=cache_hit,
        timings={
            "stage1_train_seconds": float(artifact.record["train_seconds"]),
            "stage1_load_seconds": loaded - start,
            "method_seconds": method_done - loaded,
            "eval_seconds": evaluated - method_done,
            "total_seconds": evaluated - start,
            "stage1_images_per_second": float(artifact.record.get("images_per_second", 0.0)),
            "stage1_compile_seconds": float(artifact.record.get("compile_seconds", 0.0)),
        },
        stage1_device=str(artifact.record.get("device")),
        stage1_execution=stage1_execution(artifact.record),
        stage1_resumed_from_epoch=None if cache_hit else artifact.record.get("resumed_from_epoch"),
        started_at=started_at,
        finished_at=dt.datetime.now(dt.timezone.utc),
        device=describe_device(device),
    )
