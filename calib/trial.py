"""``run_trial(config) -> TrialResult``: one trial, from Stage I to metrics (docs/architecture.md contract 1).

A plain function of a plain config. It knows nothing of Ray: Ray Tune, a local loop and the tests
call the same function.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from calib import progress
from calib.artifacts import corrupted_split, get_or_train_stage1, method_split, ood_split
from calib.config import TrialConfig, config_hash, parse_trial_config, stage1_identity, trial_id, trial_identity
from calib.datasets.corruptions import SEVERITIES
from calib.metrics import (
    accuracy,
    clopper_pearson,
    compute_all,
    expected_calibration_error,
    ood_auroc,
    ood_fpr_at_95_tpr,
    reliability_bins,
)
from calib.registries import METHODS
from calib.training import describe_device, resolve_device, seed_everything
from calib.trial_result import TrialResult

__all__ = ["TrialResult", "population_groups", "run_trial", "run_trials", "trial_id"]


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


def prediction_change(probs: np.ndarray, uncalibrated_logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """``test_argmax_changed``, the fraction of samples whose predicted class (argmax, ties to the lowest index)
    under ``probs`` differs from the uncalibrated model's, and ``test_accuracy_change``, the accuracy of ``probs``
    minus the uncalibrated model's.

    >>> prediction_change(np.array([[0.6, 0.4], [0.7, 0.3]]), np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([0, 1]))
    {'test_argmax_changed': 0.5, 'test_accuracy_change': -0.5}
    """
    predicted, uncalibrated = probs.argmax(axis=1), uncalibrated_logits.argmax(axis=1)
    return {"test_argmax_changed": float(np.mean(predicted != uncalibrated)),
            "test_accuracy_change": float(np.mean(predicted == labels) - np.mean(uncalibrated == labels))}


def _evaluate(cfg: TrialConfig, artifact: Any, outcome: Any, device: torch.device
              ) -> tuple[dict[str, float], dict[str, list], dict[str, dict[str, Any]]]:
    """Metrics of ``outcome`` on val and test, its prediction change from the Stage-I model's test logits, the test
    reliability bins, OOD and corruption values; and the val and test probabilities the metrics were computed from."""
    metrics: dict[str, float] = {}
    predictions: dict[str, dict[str, Any]] = {}
    for split, probs in (("val", outcome.val_probs), ("test", outcome.test_probs)):
        labels = artifact.splits[split].labels
        indices = outcome.val_indices if split == "val" else None
        if indices is not None:
            labels = labels[indices]
        labels = labels.numpy()
        values = probs.detach().cpu().double().numpy()
        scores = compute_all(values, labels, num_bins=cfg.num_bins)
        metrics.update({f"{split}_{k}": v for k, v in scores.items()})
        predictions[split] = {"probs": values, "labels": labels,
                              "indices": None if indices is None else torch.as_tensor(indices).cpu().numpy()}
    test = artifact.splits["test"]
    metrics.update(prediction_change(outcome.test_probs.detach().cpu().double().numpy(),
                                     test.logits.detach().cpu().double().numpy(), test.labels.numpy()))
    counts, confidence, accuracy = reliability_bins(
        outcome.test_probs.detach().cpu().double().numpy(), artifact.splits["test"].labels.numpy(),
        num_bins=cfg.num_bins,
    )
    lower, upper = clopper_pearson(np.rint(counts * accuracy).astype(np.int64), counts)
    details = {"test_bin_count": counts.tolist(), "test_bin_confidence": confidence.tolist(),
               "test_bin_accuracy": accuracy.tolist(), "test_bin_accuracy_lower": lower.tolist(),
               "test_bin_accuracy_upper": upper.tolist()}
    ood_means, ood_per_set = _ood_metrics(cfg, artifact, outcome, device)
    metrics.update(ood_means)
    details.update(ood_per_set)
    corrupted_means, corrupted_lists = _corruption_metrics(cfg, artifact, outcome, device)
    metrics.update(corrupted_means)
    details.update(corrupted_lists)
    return metrics, details, predictions


def _result(cfg: TrialConfig, artifact: Any, cache_hit: bool, outcome: Any, device: torch.device, *,
            started_at: dt.datetime, load_seconds: float, method_seconds: float, population_size: int = 1
            ) -> TrialResult:
    evaluating = time.perf_counter()
    metrics, details, predictions = _evaluate(cfg, artifact, outcome, device)
    eval_seconds = time.perf_counter() - evaluating
    return TrialResult(
        config=cfg,
        trial_id=config_hash(trial_identity(cfg)),
        stage1_id=artifact.stage1_id,
        metrics=metrics,
        details=details,
        history=[dict(row) for row in artifact.record["history"]] + outcome.history,
        stage1_cache_hit=cache_hit,
        timings={
            "stage1_train_seconds": float(artifact.record["train_seconds"]),
            "stage1_load_seconds": load_seconds,
            "method_seconds": method_seconds,
            "eval_seconds": eval_seconds,
            "total_seconds": load_seconds + method_seconds + eval_seconds,
            "stage1_images_per_second": float(artifact.record.get("images_per_second", 0.0)),
            "stage1_compile_seconds": float(artifact.record.get("compile_seconds", 0.0)),
        },
        stage1_device=str(artifact.record.get("device")),
        stage1_writer=artifact.record.get("writer"),
        stage1_execution=stage1_execution(artifact.record),
        stage1_resumed_from_epoch=None if cache_hit else artifact.record.get("resumed_from_epoch"),
        started_at=started_at,
        finished_at=dt.datetime.now(dt.timezone.utc),
        device=describe_device(device),
        population_size=population_size,
        fit_details=dict(outcome.fit_details),
        predictions=predictions,
    )


def _with_method_splits(artifact: Any, cfg: TrialConfig, params: Sequence[Any], device: torch.device) -> Any:
    """``artifact`` with the extra splits its method's configs read (``MethodSpec.splits``) in ``splits``."""
    spec = METHODS.get(cfg.method.name)
    for name in dict.fromkeys(name for p in params for name in spec.splits(p)):
        if name not in artifact.splits:
            artifact.splits[name] = method_split(artifact, cfg, name, device)
    return artifact


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
    _with_method_splits(artifact, cfg, [cfg.method.params], device)
    loaded = time.perf_counter()

    seed_everything(cfg.stage2_seed)
    progress.record("stage2", 0)  # the method's own loop refines the epoch
    outcome = METHODS.get(cfg.method.name)(cfg.method.params, artifact, seed=cfg.stage2_seed, device=device)
    return _result(cfg, artifact, cache_hit, outcome, device, started_at=started_at, load_seconds=loaded - start,
                   method_seconds=time.perf_counter() - loaded)


def population_groups(configs: Sequence[TrialConfig]) -> list[list[int]]:
    """Indices of ``configs`` that train together: same Stage I, same method, equal population key.

    Configs whose method has no population form groups of one. Order: first appearance.
    """
    groups: dict[Any, list[int]] = {}
    for i, cfg in enumerate(configs):
        spec = METHODS.get(cfg.method.name)
        key: Any = ("alone", i)
        if spec.population_key is not None:
            key = (config_hash(stage1_identity(cfg)), cfg.method.name, cfg.device,
                   spec.population_key(cfg.method.params))
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def run_trials(
    configs: Sequence[dict[str, Any] | TrialConfig],
    *,
    on_result: Callable[[TrialResult], None] | None = None,
) -> list[TrialResult]:
    """Several trials in one process: the configs of one :func:`population_groups` group load their
    Stage-I artifact once and train their Stage II as one population (docs/architecture.md §6).

    Each config gets its own result, equal to its :func:`run_trial` up to floating-point reassociation;
    a config that fails gets a ``failed`` result and the others go on. ``on_result`` receives each
    result as soon as it exists (to store it); if it raises for one, the others are still passed to
    it and the first such error is raised at the end. ``method_seconds`` of a population member is the
    population's time divided by its size; a Stage I trained here counts as the first config's
    (``stage1_cache_hit`` false for it alone).
    """
    cfgs = [parse_trial_config(c) for c in configs]
    results: list[TrialResult | None] = [None] * len(cfgs)
    unstored: list[BaseException] = []

    def done(i: int, result: TrialResult) -> None:
        results[i] = result
        if on_result is not None:
            try:
                on_result(result)
            except Exception as err:  # the other configs are still stored; this error is raised at the end
                unstored.append(err)

    for group in population_groups(cfgs):
        members = [cfgs[i] for i in group]
        first = members[0]
        started_at = dt.datetime.now(dt.timezone.utc)
        start = time.perf_counter()
        progress.reset()
        device = resolve_device(first.device)
        try:
            artifact, cache_hit = get_or_train_stage1(first, device)
            _with_method_splits(artifact, first, [c.method.params for c in members], device)
            loaded = time.perf_counter()
            spec = METHODS.get(first.method.name)
            seed_everything(first.stage2_seed)
            progress.record("stage2", 0)
            if spec.run_population is not None:
                outcomes = spec.run_population([c.method.params for c in members], artifact,
                                               seeds=[c.stage2_seed for c in members], device=device)
            else:
                outcomes = [spec(first.method.params, artifact, seed=first.stage2_seed, device=device)]
        except Exception as err:
            for i, cfg in zip(group, members, strict=True):
                done(i, TrialResult.failed(cfg, err, started_at))
            continue
        method_seconds = (time.perf_counter() - loaded) / len(members)
        for k, (i, cfg, outcome) in enumerate(zip(group, members, outcomes, strict=True)):
            if isinstance(outcome, BaseException):
                done(i, TrialResult.failed(cfg, outcome, started_at, where=("stage2", getattr(outcome, "epoch", None))))
                continue
            try:  # a Stage I trained here is the first config's: the others found it trained
                result = _result(cfg, artifact, cache_hit or k > 0, outcome, device, started_at=started_at,
                                 load_seconds=loaded - start, method_seconds=method_seconds,
                                 population_size=len(members))
            except Exception as err:
                result = TrialResult.failed(cfg, err, started_at, where=("stage2", None))
            done(i, result)
    if unstored:
        raise unstored[0]
    return [r for r in results if r is not None]
