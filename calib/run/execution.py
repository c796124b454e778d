"""The worker side of a Ray trial: its resources, its checkpoints, running its configs, storing each row.

Each Tune trial calls :func:`calib.trial.run_trial`, or :func:`calib.trial.run_trials` for a
population of configs, and writes each result into the store from the worker, so a finished trial
survives the driver. What it waits for on the way (another trial's Stage I) reaches the driver at once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as pads
import torch

from calib.artifacts import ArtifactWarning
from calib.config import parse_trial_config
from calib.run.events import forwarding, trials_label
from calib.store import read_trials, write_result
from calib.trial import TrialResult, run_trial, run_trials, trial_id

__all__ = ["DEFAULT_CONFIGS_PER_TRIAL", "STAGE1_CHECKPOINT", "STAGE1_EPOCHS", "ExecutionOptions", "execute",
           "execute_population", "placement", "run_configs", "stored_summaries"]


@dataclass(frozen=True)
class ExecutionOptions:
    """Where and how trials run: Ray address, per-trial resources, concurrency, Tune's storage.

    A trial that trains its Stage I requests ``cpus_per_trial`` / ``gpus_per_trial`` (whole GPUs on a
    cluster); a trial whose Stage-I artifact another trial provides (Stage II, post-hoc, evaluation on
    cached features) requests the lighter ``*_per_cached_trial`` share (fractions allowed, so several
    share one GPU); ``None`` means the same as a Stage-I trial.

    A failed trial is retried up to ``max_failures`` times; a retry of a trial that was training
    Stage I resumes from its last checkpoint, taken every ``checkpoint_every`` Stage-I epochs but no
    sooner than ``checkpoint_min_seconds`` after the previous one (or the trial's start). Each Tune
    checkpoint also makes Tune snapshot the experiment state (``CheckpointConfig(num_to_keep=1)``), so
    checkpointing every fast epoch costs more than a retry would save.

    ``configs_per_trial``: how many trials on a stored Stage-I artifact one Tune trial runs, their
    Stage II trained as one population (:func:`calib.trial.run_trials`); ``None`` means
    :data:`DEFAULT_CONFIGS_PER_TRIAL` where every config is such a trial, 1 otherwise. A config of a
    population that fails is retried in the same process up to ``max_failures`` times.
    """

    address: str | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    cpus_per_cached_trial: float | None = None
    gpus_per_cached_trial: float | None = None
    max_concurrent: int | None = None
    storage: str | None = None
    max_failures: int = 0
    checkpoint_every: int = 1
    checkpoint_min_seconds: float = 60.0
    configs_per_trial: int | None = None
    compact_every: int = 1000
    """The driver compacts the study's store (:mod:`calib.store.compaction`) in the background every
    ``compact_every`` finished trials, and once more when the run ends; 0: only at the end."""
    verbose: bool = True
    check_only: bool = False
    """``--check-only``: validate the run (configs, store, manifest) and stop before Ray starts."""
    log_to: tuple[str, ...] = ()
    keep_predictions: str = "off"
    """``--keep-predictions``: keep each trial's val and test probabilities in the store (``on``: float64; ``float32``,
    ``float16``; ``off``), :mod:`calib.store.predictions`."""
    tracking: Any = None
    """The trackers of ``--log-to``, and (set by the driver when the run starts) where their runs go:
    :class:`calib.tracking.TrackingSettings`."""

    def resources(self, role: str) -> dict[str, float]:
        """The Ray resource request of a ``"stage1"`` or a ``"cached"`` trial."""
        if role == "stage1":
            return {"CPU": self.cpus_per_trial, "GPU": self.gpus_per_trial}
        cpus = self.cpus_per_trial if self.cpus_per_cached_trial is None else self.cpus_per_cached_trial
        gpus = self.gpus_per_trial if self.gpus_per_cached_trial is None else self.gpus_per_cached_trial
        return {"CPU": cpus, "GPU": gpus}


STAGE1_CHECKPOINT = "stage1.pt"
STAGE1_EPOCHS = "stage1_epochs"
"""The result key of Stage-I epochs completed, in a trial's per-epoch reports: the schedulers' time."""
DEFAULT_CONFIGS_PER_TRIAL = 16
"""Configs per Tune trial on a stored Stage I without ``--configs-per-trial`` (benchmarks/search_throughput.py)."""


def _checkpointing(every: int, min_seconds: float, report_epochs: bool = False,
                   started: dt.datetime | None = None) -> tuple[dict[str, Any] | None, Any]:
    """The Stage-I state of this trial's last Tune checkpoint (a retry, or a trial a scheduler paused),
    and the callback that reports a new checkpoint every ``every`` epochs, at least ``min_seconds``
    after the previous one. ``report_epochs``: every epoch is also a result, with the epoch's
    validation metrics and :data:`STAGE1_EPOCHS`, for a scheduler to act on."""
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    from ray import tune

    resume = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            resume = torch.load(Path(folder) / STAGE1_CHECKPOINT, map_location="cpu", weights_only=True)
    last_report = time.monotonic()

    def on_checkpoint(state: dict[str, Any]) -> None:
        nonlocal last_report
        due = (state["epoch"] + 1) % every == 0 and time.monotonic() - last_report >= min_seconds
        if not (due or report_epochs):
            return
        metrics: dict[str, Any] = {"stage1_epoch": state["epoch"]}
        if report_epochs:  # under stage1_val_*: the final result's val_* are the method's, not Stage I's
            row = state["history"][-1]
            metrics.update({STAGE1_EPOCHS: state["epoch"] + 1,
                            "calib_started_at": (started or dt.datetime.now(dt.timezone.utc)).isoformat(),
                            **{f"stage1_{k}": v for k, v in row.items() if k.startswith("val_") and v is not None}})
        if not due:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as folder:
            torch.save(state, Path(folder) / STAGE1_CHECKPOINT)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
        last_report = time.monotonic()

    return resume, on_checkpoint


def degenerate_fit_line(result: TrialResult) -> str | None:
    """The warning a study prints for a trial whose post-hoc fit was degenerate: method, setup, reason."""
    reason = result.fit_details.get("fit_degenerate_reason")
    if not reason:
        return None
    cfg = result.config
    size = getattr(cfg.method.params, "calibration_size", None)
    subset = "" if size is None else f", calibration set of {size} (draw {cfg.method.params.calibration_draw})"
    name = f"{cfg.label} ({cfg.method.name})" if cfg.label else cfg.method.name
    return f"{name} on {cfg.dataset} · {cfg.arch} · seed {cfg.seed}{subset}: degenerate fit: {reason}"


def summary(result: TrialResult) -> dict[str, Any]:
    """What the driver learns of a stored trial: its id, status, validation metrics and, for a degenerate fit,
    its warning line (a trial's final result lists them as JSON under ``calib_results``, one per config)."""
    line = degenerate_fit_line(result)
    return {"calib_trial_id": result.trial_id, "status": result.status,
            **{k: v for k, v in result.metrics.items() if k.startswith("val_")},
            **({"degenerate_fit": line} if line else {})}


def _worker_threads() -> str | None:
    """Give torch as many threads as the CPUs Ray assigned to this trial; the Ray node id."""
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    import ray

    context = ray.get_runtime_context() if ray.is_initialized() else None
    cpus = context.get_assigned_resources().get("CPU", 1.0) if context else 1.0
    torch.set_num_threads(max(1, int(cpus)))
    return context.get_node_id() if context else None


@contextlib.contextmanager
def _artifact_notes(notes: list[str]) -> Iterator[None]:
    """Collect the ``ArtifactWarning`` messages raised inside into ``notes``: a healed artifact is news
    for the user at the driver, which workers' output does not reach. Other warnings go where they
    would have gone (the worker's log), once the recording has ended: shown while it records, a warning
    would be appended to the very list being read, without end."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ArtifactWarning)
            yield
    finally:
        for w in caught:
            if issubclass(w.category, ArtifactWarning):
                notes.append(str(w.message))
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _store(store: str, result: TrialResult, options: ExecutionOptions, node_id: str | None, **kwargs: Any) -> None:
    """Log the trial's runs to the ``--log-to`` trackers (their ids go into the row), then write its row."""
    if options.tracking is not None:
        # lazy: only a study with --log-to loads the trackers' module (and, through it, their clients)
        from calib.tracking import log_trial

        result.tracker_runs = log_trial(options.tracking, result)
    write_result(store, result, node_id=node_id, keep_predictions=options.keep_predictions, **kwargs)
    result.predictions = {}  # stored: a population's other results need not hold them in memory


def execute(config: dict[str, Any], store: str, options: ExecutionOptions,
             report_epochs: bool = False) -> dict[str, Any]:
    """Run one trial and store it; a failure is stored as a ``failed`` row and re-raised for Tune.

    Torch uses as many threads as the CPUs Ray assigned to the trial. ``report_epochs``: report every
    Stage-I epoch (for a scheduler, which may stop the trial there: the driver stores it as pruned).
    """
    node_id = _worker_threads()
    cfg = parse_trial_config(config)
    started = dt.datetime.now(dt.timezone.utc)
    notes: list[str] = []
    try:
        resume, on_checkpoint = _checkpointing(options.checkpoint_every, options.checkpoint_min_seconds,
                                               report_epochs, started)
        with _artifact_notes(notes):
            result = run_trial(cfg, on_checkpoint=on_checkpoint, resume=resume)
    except Exception as err:
        _store(store, TrialResult.failed(cfg, err, started), options, node_id)
        raise
    _store(store, result, options, node_id)
    final = {**result.metrics, "calib_trial_id": result.trial_id, "calib_notes": "\n".join(notes),
             "calib_results": json.dumps([summary(result)])}
    if report_epochs:
        final[STAGE1_EPOCHS] = cfg.stage1.epochs
    return final


def stored_summaries(store: str, study: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """:func:`summary` of the trials among ``ids`` already stored as ``ok``."""
    if not ids:
        return {}
    rows = read_trials(store, study=study, filters=pads.field("trial_id").isin(list(ids))
                       & (pads.field("status") == "ok"))
    metrics = [c for c in rows.columns if c.startswith("val_")]
    return {r["trial_id"]: {"calib_trial_id": r["trial_id"], "status": "ok",
                            **{m: float(r[m]) for m in metrics if pd.notna(r[m])}} for _, r in rows.iterrows()}


def execute_population(configs: Sequence[dict[str, Any]], store: str, options: ExecutionOptions
                        ) -> dict[str, Any]:
    """Run several trials in this process (:func:`calib.trial.run_trials`) and store each as it ends.

    Configs already stored as ``ok`` (a retry of this Tune trial, a repeated proposal) are not run
    again. A config that fails is stored as ``failed`` and retried here up to ``max_failures`` times;
    the others are unaffected. The result lists every config's summary under ``calib_results``.
    """
    node_id = _worker_threads()
    cfgs = [parse_trial_config(c) for c in configs]
    ids = [trial_id(c) for c in cfgs]
    summaries = stored_summaries(store, cfgs[0].study, ids)
    pending = [c for c, i in zip(cfgs, ids, strict=True) if i not in summaries]
    notes: list[str] = []
    for _attempt in range(options.max_failures + 1):
        if not pending:
            break
        with _artifact_notes(notes):
            results = run_trials(pending, on_result=lambda r: _store(store, r, options, node_id, known_new=True))
        summaries.update({r.trial_id: summary(r) for r in results})
        pending = [c for c, r in zip(pending, results, strict=True) if r.status != "ok"]
    ordered = [summaries[i] for i in ids]
    first = ordered[0]
    return {**{k: v for k, v in first.items() if k.startswith("val_")}, "calib_trial_id": first["calib_trial_id"],
            "calib_results": json.dumps(ordered), "calib_notes": "\n".join(dict.fromkeys(notes))}


def run_configs(configs: list[dict[str, Any]], store: str, options: ExecutionOptions,
                 report_epochs: bool = False) -> dict[str, Any]:
    """A Tune trial's configs: :func:`execute` for one, :func:`execute_population` for several; their
    Stage-I waits and takeovers go to the driver as they happen (:func:`calib.run.events.forwarding`)."""
    with forwarding(trials_label([trial_id(c) for c in configs])):
        if len(configs) == 1:
            return execute(configs[0], store, options, report_epochs)
        return execute_population(configs, store, options)


def placement(resources: dict[str, float]) -> Any:
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    from ray.tune import PlacementGroupFactory

    return PlacementGroupFactory([{k: v for k, v in resources.items() if v > 0}])
