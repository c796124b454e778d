"""Running trials through Ray Tune: grids of explicit configs, and Optuna searches over a space.

This is the only module that imports Ray (with the searcher it uses). Each Tune trial calls
:func:`calib.trial.run_trial`, or :func:`calib.trial.run_trials` for a population of configs, and
writes each result into the store from the worker, so a finished trial survives the driver. Before
anything is scheduled, trials already in the store are skipped: re-running a study resumes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as pads

from calib import storage
from calib._config import ConfigError
from calib.artifacts import ArtifactWarning, stage1_exists
from calib.config import config_hash, parse_trial_config, set_dotted, stage1_identity
from calib.metrics import higher_is_better
from calib.search.display import ProgressDisplay
from calib.search.space import SearchSpace
from calib.store import completed_trial_ids, write_result
from calib.store.manifest import check_manifest, manifest_of, record_manifest
from calib.trial import TrialResult, run_trial, trial_id

__all__ = ["SCHEDULERS", "ExecutionOptions", "SchedulerSettings", "StudyRun", "init_ray", "run_grid", "run_search"]

os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
# A failed trial is one calib line (ProgressDisplay); its traceback is in the store's `error` column.
os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
# Stage-I checkpoints are reported mid-trial without the search objective, which exists only at the end.
os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
# Each Tune checkpoint forces a snapshot of the experiment state, and Tune warns when one comes within 5 s
# of the previous snapshot, periodic ones included: a coincidence of timing, since calib spaces a
# trial's checkpoints by checkpoint_every epochs and checkpoint_min_seconds (HyperBand: every epoch).
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")

# Ray log records that calib replaces with its own lines or that are not the user's business:
# logger name -> message prefixes dropped. Everything else Ray logs still reaches the user.
RAY_NOISE: dict[str, tuple[str, ...]] = {
    # the notice that a local cluster turned on Ray's token authentication (its default)
    "ray._private.authentication.authentication_token_setup": ("Token authentication is enabled",),
    # the list of failed trials at the end of a run: calib prints one line per failed trial
    "ray.tune.tune": ("Trials did not complete",),
}


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
    verbose: bool = True

    def resources(self, role: str) -> dict[str, float]:
        """The Ray resource request of a ``"stage1"`` or a ``"cached"`` trial."""
        if role == "stage1":
            return {"CPU": self.cpus_per_trial, "GPU": self.gpus_per_trial}
        cpus = self.cpus_per_trial if self.cpus_per_cached_trial is None else self.cpus_per_cached_trial
        gpus = self.gpus_per_trial if self.gpus_per_cached_trial is None else self.gpus_per_cached_trial
        return {"CPU": cpus, "GPU": gpus}


@dataclass
class StudyRun:
    """What a call scheduled: trial ids in order, how many were skipped as already stored, failures."""

    trial_ids: list[str] = field(default_factory=list)
    skipped: int = 0
    failed: int = 0
    seconds: float = 0.0


def check_address(address: str | None) -> None:
    """Fail fast with a ``ConfigError`` on an ``--address`` that is malformed or where nothing listens
    (Ray itself would retry for minutes). ``None`` (local Ray) and ``"auto"`` pass; ``"auto"`` is
    checked when Ray connects."""
    if address is None or address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        problem = f" (the port must be 1-65535, got {port})" if sep and host and port.isdigit() else ""
        raise ConfigError(
            f"`--address` must be 'auto', HOST:PORT or ray://HOST:PORT of a running Ray cluster (the head's GCS "
            f"port, 6379 by default), got --address={address!r}{problem}. Leave it out to start Ray on this machine."
        )
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise ConfigError(
            f"Nothing answers at --address={address!r} ({err.strerror or err}): no Ray cluster listens there. "
            f"Start one (`ray start --head`, or `ray up cluster.yaml`), pass the head's address, or leave "
            f"--address out to start Ray on this machine."
        ) from None


def init_ray(address: str | None = None) -> None:
    """Start local Ray on this machine's CPUs, or join the cluster at ``address`` ("auto" or host:port).

    A cluster that cannot be reached raises ``ConfigError``.
    """
    import ray

    if ray.is_initialized():
        return
    check_address(address)
    quiet_ray_logs()
    common = {"logging_level": logging.WARNING, "log_to_driver": False, "include_dashboard": False}
    if address is None:
        ray.init(num_cpus=os.cpu_count(), **common)
        return
    try:
        ray.init(address=address, **common)
    except ConnectionError as err:
        raise ConfigError(
            f"Could not connect to a Ray cluster with --address={address!r}: {err} Start one (`ray start "
            f"--head`, or `ray up cluster.yaml`), or leave --address out to start Ray on this machine."
        ) from None


class _DropRecords(logging.Filter):
    """Drops the log records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def quiet_ray_logs() -> None:
    """Install the :data:`RAY_NOISE` filters on Ray's loggers in this process (once)."""
    for name, prefixes in RAY_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRecords) for f in logger.filters):
            logger.addFilter(_DropRecords(prefixes))


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
    import torch
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


def _summary(result: TrialResult) -> dict[str, Any]:
    """What the driver learns of a stored trial: its id, status and validation metrics (a trial's final
    result lists them as JSON under ``calib_results``, one per config)."""
    return {"calib_trial_id": result.trial_id, "status": result.status,
            **{k: v for k, v in result.metrics.items() if k.startswith("val_")}}


def _worker_threads() -> str | None:
    """Give torch as many threads as the CPUs Ray assigned to this trial; the Ray node id."""
    import ray
    import torch

    context = ray.get_runtime_context() if ray.is_initialized() else None
    cpus = context.get_assigned_resources().get("CPU", 1.0) if context else 1.0
    torch.set_num_threads(max(1, int(cpus)))
    return context.get_node_id() if context else None


@contextlib.contextmanager
def _artifact_notes(notes: list[str]) -> Iterator[None]:
    """Collect the ``ArtifactWarning`` messages raised inside into ``notes``: a healed artifact is news
    for the user at the driver, which workers' output does not reach. Other warnings go where they
    would have gone (the worker's log)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ArtifactWarning)
        try:
            yield
        finally:
            for w in caught:
                if issubclass(w.category, ArtifactWarning):
                    notes.append(str(w.message))
                else:
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _execute(config: dict[str, Any], store: str, options: ExecutionOptions,
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
        write_result(store, TrialResult.failed(cfg, err, started), node_id=node_id)
        raise
    write_result(store, result, node_id=node_id)
    final = {**result.metrics, "calib_trial_id": result.trial_id, "calib_notes": "\n".join(notes),
             "calib_results": json.dumps([_summary(result)])}
    if report_epochs:
        final[STAGE1_EPOCHS] = cfg.stage1.epochs
    return final


def _stored_summaries(store: str, study: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """:func:`_summary` of the trials among ``ids`` already stored as ``ok``."""
    from calib.store import read_trials

    if not ids:
        return {}
    rows = read_trials(store, study=study, filters=pads.field("trial_id").isin(list(ids))
                       & (pads.field("status") == "ok"))
    metrics = [c for c in rows.columns if c.startswith("val_")]
    return {r["trial_id"]: {"calib_trial_id": r["trial_id"], "status": "ok",
                            **{m: float(r[m]) for m in metrics if pd.notna(r[m])}} for _, r in rows.iterrows()}


def _execute_population(configs: Sequence[dict[str, Any]], store: str, options: ExecutionOptions
                        ) -> dict[str, Any]:
    """Run several trials in this process (:func:`calib.trial.run_trials`) and store each as it ends.

    Configs already stored as ``ok`` (a retry of this Tune trial, a repeated proposal) are not run
    again. A config that fails is stored as ``failed`` and retried here up to ``max_failures`` times;
    the others are unaffected. The result lists every config's summary under ``calib_results``.
    """
    from calib.trial import run_trials

    node_id = _worker_threads()
    cfgs = [parse_trial_config(c) for c in configs]
    ids = [trial_id(c) for c in cfgs]
    summaries = _stored_summaries(store, cfgs[0].study, ids)
    pending = [c for c, i in zip(cfgs, ids, strict=True) if i not in summaries]
    notes: list[str] = []
    for _attempt in range(options.max_failures + 1):
        if not pending:
            break
        with _artifact_notes(notes):
            results = run_trials(pending, on_result=lambda r: write_result(store, r, node_id=node_id, known_new=True))
        summaries.update({r.trial_id: _summary(r) for r in results})
        pending = [c for c, r in zip(pending, results, strict=True) if r.status != "ok"]
    ordered = [summaries[i] for i in ids]
    first = ordered[0]
    return {**{k: v for k, v in first.items() if k.startswith("val_")}, "calib_trial_id": first["calib_trial_id"],
            "calib_results": json.dumps(ordered), "calib_notes": "\n".join(dict.fromkeys(notes))}


def _grid_configs(tune_config: dict[str, Any]) -> list[dict[str, Any]]:
    return tune_config["trial"]["configs"]


def _run_configs(configs: list[dict[str, Any]], store: str, options: ExecutionOptions,
                 report_epochs: bool = False) -> dict[str, Any]:
    if len(configs) == 1:
        return _execute(configs[0], store, options, report_epochs)
    return _execute_population(configs, store, options)


def _grid_trainable(tune_config: dict[str, Any], *, store: str, options: ExecutionOptions) -> None:
    from ray import tune

    tune.report(_run_configs(_grid_configs(tune_config), store, options))


def _search_config(base: dict[str, Any], sampled: dict[str, Any]) -> dict[str, Any]:
    config = base
    for key, value in sampled.items():
        config = set_dotted(config, key, value)
    return config


def _search_configs(base: dict[str, Any], tune_config: dict[str, Any]) -> list[dict[str, Any]]:
    return [_search_config(base, member["params"]) for member in tune_config["population"]]


def _search_trainable(tune_config: dict[str, Any], *, base: dict[str, Any], store: str,
                      options: ExecutionOptions, report_epochs: bool) -> None:
    from ray import tune

    tune.report(_run_configs(_search_configs(base, tune_config), store, options, report_epochs))


def _placement(resources: dict[str, float]) -> Any:
    from ray.tune import PlacementGroupFactory

    return PlacementGroupFactory([{k: v for k, v in resources.items() if v > 0}])


def assign_roles(configs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``{"config", "role"}`` per config, Stage-I trainers first: the first trial of every Stage-I
    config whose artifact is not stored yet is a ``"stage1"`` trial, every other one ``"cached"``.

    Trainers go first (round-robin over Stage-I configs, as :func:`_interleave_stage1`) so the light
    trials mostly start once their artifact exists instead of waiting on its lock.
    """
    trainers, cached = [], []
    seen: set[str] = set()
    for config in _interleave_stage1(configs):
        cfg = parse_trial_config(config)
        key = config_hash(stage1_identity(cfg))
        if key in seen or stage1_exists(cfg):
            cached.append({"config": config, "role": "cached"})
        else:
            seen.add(key)
            trainers.append({"config": config, "role": "stage1"})
    return trainers + cached


def batch_roles(roles: Sequence[dict[str, Any]], configs_per_trial: int) -> list[dict[str, Any]]:
    """Tune trials of :func:`assign_roles`'s entries: each ``"stage1"`` trial alone, the ``"cached"``
    ones in chunks of up to ``configs_per_trial`` of one population group (configs of methods without
    populations alone), as ``{"configs": [...], "role": ...}``."""
    from calib.trial import population_groups

    trials = [{"configs": [r["config"]], "role": "stage1"} for r in roles if r["role"] == "stage1"]
    cached = [r["config"] for r in roles if r["role"] == "cached"]
    for group in population_groups([parse_trial_config(c) for c in cached]):
        configs = [cached[i] for i in group]
        trials += [{"configs": configs[i:i + configs_per_trial], "role": "cached"}
                   for i in range(0, len(configs), configs_per_trial)]
    return trials


def _failure_line(store: str, study: str, calib_id: str, trial: Any) -> str:
    """What a failed trial died of, in one line: its stored row's stage, epoch and first error line,
    or, when the trial could not store a row (its worker was killed), the first line of Ray's error."""
    from calib.store import read_trials

    rows = read_trials(store, study=study, columns=["error", "failed_stage", "failed_epoch"],
                       filters=(pads.field("trial_id") == calib_id) & (pads.field("status") == "failed"))
    if not rows.empty:
        row = rows.iloc[0]
        where = "" if pd.isna(row["failed_stage"]) else f"in {row['failed_stage']}"
        where += "" if pd.isna(row["failed_epoch"]) else f" at epoch {int(row['failed_epoch'])}"
        return (f"{where.strip()}: " if where else "") + str(row["error"]).strip().splitlines()[0]
    error = None
    path = getattr(trial, "pickled_error_file", None)  # Tune writes it locally before calling back
    if path and os.path.exists(path):
        import cloudpickle

        with open(path, "rb") as f:
            error = cloudpickle.load(f)
    cause = getattr(error, "cause", None) or error
    if cause is None:
        return "no error recorded"
    return f"{type(cause).__name__}: {cause}".strip().splitlines()[0]


def _store_pruned(store: str, config: dict[str, Any], result: dict[str, Any]) -> str:
    """Store a trial that a scheduler stopped during Stage I as a ``pruned`` row; returns its id."""
    cfg = parse_trial_config(config)
    started = result.get("calib_started_at")
    epoch = result.get("stage1_epoch")
    pruned = TrialResult.pruned(
        cfg, epoch=None if epoch is None else int(epoch),
        metrics={k.removeprefix("stage1_"): float(v) for k, v in result.items()
                 if k.startswith("stage1_val_") and isinstance(v, (int, float))},
        started_at=dt.datetime.fromisoformat(started) if started else dt.datetime.now(dt.timezone.utc),
    )
    write_result(store, pruned)
    return pruned.trial_id


def _progress_callback(display: ProgressDisplay | None, configs_of: Callable[[dict[str, Any]], list[dict[str, Any]]],
                       store: str, study: str, max_failures: int) -> Any:
    """A Tune callback that stores the trials a scheduler pruned and feeds Tune's trial events to
    ``display`` (None: store only); ``configs_of(trial.config)`` are the trial configs a Tune trial
    runs, whose rows in ``store`` say what a failed one died of."""
    from ray import tune

    def failed(trial: Any, config: dict[str, Any]) -> tuple[str, str]:
        calib_id = trial_id(config)
        return calib_id, _failure_line(store, study, calib_id, trial)

    class ProgressCallback(tune.Callback):
        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            if display:
                display.trial_started(trial.trial_id, len(configs_of(trial.config)))

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            result = trial.last_result or {}
            if "calib_results" not in result:  # stopped before its final report: a scheduler pruned it
                for config in configs_of(trial.config):
                    _store_pruned(store, config, result)
                if display:
                    display.trial_pruned(trial.trial_id)
                return
            if not display:
                return
            for note in filter(None, str(result.get("calib_notes", "")).splitlines()):
                display.note(note)
            for config, summary in zip(configs_of(trial.config), json.loads(result["calib_results"]), strict=True):
                if summary["status"] == "ok":
                    display.trial_finished(trial.trial_id, summary["calib_trial_id"], summary.get(display.objective))
                else:
                    display.trial_failed(trial.trial_id, *failed(trial, config))

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            if not display:
                return
            configs = configs_of(trial.config)
            done = completed_trial_ids(store, study, trial_ids=[trial_id(c) for c in configs])
            for config in configs:
                if trial_id(config) not in done:
                    display.trial_failed(trial.trial_id, *failed(trial, config))
                else:
                    display.trial_finished(trial.trial_id, trial_id(config), None)

        def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            if display:
                calib_id, line = failed(trial, configs_of(trial.config)[0])
                display.trial_retrying(trial.trial_id, calib_id, trial.run_metadata.num_failures, max_failures, line)

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            if display:
                display.tick()

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            if display:
                display.close()

    return ProgressCallback()


def _interleave_stage1(configs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Round-robin over Stage-I groups, so concurrent trials train different Stage Is instead of
    queueing on one artifact's lock."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for config in configs:
        groups.setdefault(config_hash(stage1_identity(parse_trial_config(config))), []).append(config)
    queues = list(groups.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id


def _run_config(store: str, study: str, options: ExecutionOptions, callbacks: list) -> Any:
    from ray import tune

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return tune.RunConfig(
        name=f"{study}-{stamp}",
        storage_path=options.storage or storage.join(store, "_ray"),
        verbose=0,
        callbacks=callbacks,
        failure_config=tune.FailureConfig(max_failures=options.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
    )


def run_grid(
    configs: Sequence[dict[str, Any]],
    *,
    store: str | os.PathLike,
    study: str,
    options: ExecutionOptions = ExecutionOptions(),
    objective: str = "val_ece",
    table: Sequence[dict[str, Any]] | None = None,
) -> StudyRun:
    """Run every config (validated first) through Ray Tune, skipping those already stored as ok.

    ``table``: when ``configs`` are a selection of a study's fixed rows, configs of every row; the
    study's manifest (:mod:`calib.store.manifest`) is computed from them instead of ``configs``.
    """
    from ray import tune

    store = storage.normalize(store)
    start = time.perf_counter()
    parsed = [parse_trial_config(config) for config in configs]
    manifest = manifest_of([parse_trial_config(config) for config in table] if table else parsed)
    check_address(options.address)
    storage.check_writable(store)
    check_manifest(store, study, manifest)
    ids = [trial_id(c) for c in parsed]
    done = completed_trial_ids(store, study, trial_ids=ids)
    pending = [c for c, i in zip(configs, ids, strict=True) if i not in done]
    run = StudyRun(trial_ids=ids, skipped=len(configs) - len(pending))
    if options.verbose:
        print(f"[{study}] {len(configs)} trials: {run.skipped} already in the store, {len(pending)} to run", flush=True)
    if not pending:
        return run
    init_ray(options.address)
    record_manifest(store, study, manifest)
    trainable = tune.with_resources(
        tune.with_parameters(_grid_trainable, store=store, options=options),
        lambda spec: _placement(options.resources(spec["trial"]["role"])),
    )
    display = ProgressDisplay(study, len(pending), objective) if options.verbose else None
    callbacks = [_progress_callback(display, _grid_configs, store, study, options.max_failures)]
    tuner = tune.Tuner(
        trainable,
        param_space={"trial": tune.grid_search(batch_roles(assign_roles(pending), options.configs_per_trial
                                                           or DEFAULT_CONFIGS_PER_TRIAL))},
        tune_config=tune.TuneConfig(max_concurrent_trials=options.max_concurrent, reuse_actors=True,
                                    trial_dirname_creator=_trial_dirname),
        run_config=_run_config(store, study, options, callbacks),
    )
    tuner.fit()
    stored = completed_trial_ids(store, study, trial_ids=[trial_id(c) for c in pending])
    run.failed = len(pending) - len(stored)
    run.seconds = time.perf_counter() - start
    return run


def _sampler(name: str, space: SearchSpace, seed: int) -> Any:
    import optuna

    if name == "tpe":  # the constant liar keeps concurrent and batched asks apart (Optuna's advice)
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        grid = {k: d.spec.get("values", d.spec.get("choices")) for k, d in space.parameters.items()}
        if not space.is_finite():
            raise ConfigError("--sampler grid needs a space whose parameters are all grid or categorical.")
        return optuna.samplers.GridSampler(grid, seed=seed)
    raise ConfigError(f"`sampler` must be one of 'tpe', 'random', 'grid', got sampler={name!r}.")


SAMPLERS = ("tpe", "random", "grid")
SCHEDULERS = ("none", "asha", "hyperband")
SCHEDULER_METRICS = ("val_ece", "val_accuracy")
"""The validation metrics Stage I reports after every epoch: the objectives a scheduler can act on."""


@dataclass(frozen=True)
class SchedulerSettings:
    """An early-stopping scheduler for searches over Stage-I settings (Ray Tune's ASHA or HyperBand).

    Time is Stage-I epochs. ``grace_period``: epochs every trial runs before ASHA may stop it (None:
    a quarter of the Stage-I epochs, at least 1: on the quick preset the validation ECE of epochs 5
    and 10 ranks the trials of a Mixup α search against their final ECE, Spearman −0.16 to −0.64, and
    from epoch 15 with it, +0.32 to +0.89; benchmarks/search_scheduler.py); ``reduction_factor``: η,
    the fraction 1/η of trials promoted at each rung. HyperBand pauses and resumes trials, so under it
    every Stage-I epoch is checkpointed.
    """

    name: str = "none"
    grace_period: int | None = None
    reduction_factor: float = 3.0

    def __post_init__(self) -> None:
        if self.name not in SCHEDULERS:
            raise ConfigError(f"`--scheduler` must be one of {', '.join(SCHEDULERS)}, got {self.name!r}.")
        if self.grace_period is not None and self.grace_period < 1:
            raise ConfigError(f"`--grace-period` must be >= 1 (Stage-I epochs), got {self.grace_period}.")
        if not self.reduction_factor > 1:
            raise ConfigError(f"`--reduction-factor` must be > 1, got {self.reduction_factor}.")

    def make(self, objective: str, mode: str, epochs: int) -> Any:
        """The Ray Tune scheduler for a search whose trials train ``epochs`` Stage-I epochs, or None.

        It reads ``stage1_<objective>``, which only the per-epoch Stage-I reports carry."""
        from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler

        if self.name == "asha":
            grace = self.grace_period or max(1, epochs // 4)
            return ASHAScheduler(time_attr=STAGE1_EPOCHS, metric=f"stage1_{objective}", mode=mode, max_t=epochs,
                                 grace_period=min(grace, epochs), reduction_factor=self.reduction_factor,
                                 stop_last_trials=False)
        if self.name == "hyperband":
            return HyperBandScheduler(time_attr=STAGE1_EPOCHS, metric=f"stage1_{objective}", mode=mode, max_t=epochs,
                                      reduction_factor=self.reduction_factor, stop_last_trials=False)
        return None


def stage1_parameters(base: dict[str, Any], space: SearchSpace) -> list[str]:
    """The parameters of ``space`` whose values change the Stage-I artifact (each probed at its edges)."""
    def stage1_hash(config: dict[str, Any]) -> str:
        return config_hash(stage1_identity(parse_trial_config(config)))

    probe = base
    for key, dist in space.parameters.items():
        probe = set_dotted(probe, key, dist.probe_values()[0][1])
    reference = stage1_hash(probe)
    return [key for key, dist in space.parameters.items()
            if any(stage1_hash(set_dotted(probe, key, value)) != reference for _, value in dist.probe_values()[1:])]


def resumed_seed(seed: int, history: Sequence[str]) -> int:
    """The sampler seed of a search run whose Optuna study already holds trials of these store ids
    (in order): ``seed`` for a new study, else a hash of both."""
    if not history:
        return seed
    return int(config_hash({"seed": seed, "history": list(history)}), 16) % 2**32


def _open_study(store: str, study: str, objectives: Sequence[str], modes: Sequence[str], sampler: Any) -> Any:
    """The search's Optuna study in the store's journal (:mod:`calib.search.journal`), created or loaded."""
    import optuna

    from calib.search.journal import journal_location, optuna_storage

    directions = ["maximize" if m == "max" else "minimize" for m in modes]
    opened = optuna.create_study(study_name=study, storage=optuna_storage(store, study), sampler=sampler,
                                 directions=directions, load_if_exists=True)
    stored = opened.user_attrs.get("objectives")
    if stored is not None and list(stored) != list(objectives):
        raise ConfigError(
            f"Study {study!r} was searched for {stored} (its Optuna journal {journal_location(store, study)}); "
            f"got --objective {list(objectives)}. Use the same objectives, or another --study.")
    if stored is None:
        opened.set_user_attr("objectives", list(objectives))
    return opened


def run_search(
    base: dict[str, Any],
    space: SearchSpace,
    *,
    store: str | os.PathLike,
    study: str,
    num_trials: int,
    objectives: Sequence[str] = ("val_ece",),
    sampler: str = "tpe",
    seed: int = 0,
    options: ExecutionOptions = ExecutionOptions(),
    scheduler: SchedulerSettings = SchedulerSettings(),
) -> StudyRun:
    """Search ``space`` with Optuna: run the trials the study lacks to hold ``num_trials`` finished ones
    (a trial that fails leaves the study short; a re-run tries again).

    Finished trials (``ok`` or ``pruned``) of ``study`` already in the store count toward
    ``num_trials`` and are told to the sampler first (:func:`calib.search.searcher.sync_with_store`):
    a re-run resumes a killed search, and a larger ``num_trials`` extends it. The Optuna study is
    persisted in the store (:mod:`calib.search.journal`). Objectives are validation metrics (``val_*``):
    the test split never drives the search. ``scheduler`` stops unpromising trials during Stage I
    (stored as ``pruned``); a space that leaves Stage I alone gets none and runs its configs
    ``options.configs_per_trial`` per Tune trial (populations).
    """
    import optuna
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    from calib.search.searcher import PopulationSearcher, sync_with_store
    from calib.store import read_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    for name in objectives:
        if not name.startswith("val_"):
            raise ConfigError(f"Search objectives must be validation metrics (val_*), got {name!r}.")
        higher_is_better(name.removeprefix("val_"))
    store = storage.normalize(store)
    start = time.perf_counter()
    # Validate the base config with every parameter at its first value, before Ray starts.
    probe = dict(base)
    for key, dist in space.parameters.items():
        first = dist.spec.get("low", (dist.spec.get("values") or dist.spec.get("choices") or [None])[0])
        probe = set_dotted(probe, key, first)
    manifest = manifest_of([parse_trial_config(probe)],
                           space={"parameters": {k: d.spec for k, d in space.parameters.items()},
                                  "base": space.base})
    manifest["constant"] = {k: v for k, v in manifest["constant"].items() if k not in space.parameters}
    check_address(options.address)
    storage.check_writable(store)
    check_manifest(store, study, manifest)
    modes = ["max" if higher_is_better(o.removeprefix("val_")) else "min" for o in objectives]
    stage1_keys = stage1_parameters(base, space)
    notes = []
    if scheduler.name != "none" and not stage1_keys:
        notes.append(f"no scheduler: every trial of this space runs on a stored Stage I (--scheduler "
                     f"{scheduler.name} stops trials during Stage I)")
        scheduler = SchedulerSettings()
    if scheduler.name != "none":
        if len(objectives) > 1 or objectives[0] not in SCHEDULER_METRICS:
            raise ConfigError(f"--scheduler {scheduler.name} needs one objective among the Stage-I per-epoch "
                              f"metrics {', '.join(SCHEDULER_METRICS)}; got --objective {' '.join(objectives)}.")
        if (options.configs_per_trial or 1) > 1:
            raise ConfigError(f"--scheduler {scheduler.name} stops single trials: it needs --configs-per-trial 1, "
                              f"got {options.configs_per_trial}.")
        if scheduler.name == "hyperband":  # paused trials resume from their last epoch
            options = dataclasses.replace(options, checkpoint_every=1, checkpoint_min_seconds=0.0)
    configs_per_trial = options.configs_per_trial or (1 if stage1_keys else DEFAULT_CONFIGS_PER_TRIAL)

    optuna_study = _open_study(store, study, objectives, modes, None)
    # A resumed search must not replay the first run's random draws: its sampler seed also depends on
    # the trials the study already holds (deterministic for a given history).
    history = [t.user_attrs.get("calib_trial_id", "") for t in optuna_study.trials]
    optuna_study.sampler = _sampler(sampler, space, resumed_seed(seed, history))
    finished = read_trials(store, study=study, filters=pads.field("status").isin(["ok", "pruned"]))
    distributions = space.optuna_space()
    told = sync_with_store(optuna_study, finished, distributions, objectives)
    remaining = max(0, num_trials - len(finished))
    if space.is_finite() and remaining > len(space.grid()) - len(finished):
        notes.append(f"the space has {len(space.grid())} configs and {len(finished)} are stored: "
                     f"{max(0, len(space.grid()) - len(finished))} can run, not {remaining}")
        remaining = max(0, len(space.grid()) - len(finished))
    if options.verbose:
        print(f"[{study}] {num_trials} trials: {len(finished)} already in the store"
              + (f" ({told} told to the sampler now)" if told else "")
              + f", {remaining} to run" + (f", {configs_per_trial} per Ray trial" if configs_per_trial > 1 else "")
              + (f" · scheduler {scheduler.name}" if scheduler.name != "none" else ""), flush=True)
        for note in notes:
            print(f"[{study}] {note}", flush=True)

    def all_ok() -> list[str]:
        rows = read_trials(store, study=study, columns=["trial_id", "finished_at"],
                           filters=pads.field("status") == "ok")
        return rows.sort_values("finished_at")["trial_id"].tolist()

    if remaining == 0:
        return StudyRun(trial_ids=all_ok(), skipped=len(finished), seconds=time.perf_counter() - start)
    searcher = PopulationSearcher(
        optuna_study, distributions, objectives=objectives, modes=modes, budget=remaining,
        configs_per_trial=configs_per_trial, calib_id_of=lambda params: trial_id(_search_config(base, params)),
        stored=set(finished["trial_id"]), stored_results=lambda ids: _stored_summaries(store, study, ids))
    max_concurrent = options.max_concurrent or max(1, int((os.cpu_count() or 1) // max(options.cpus_per_trial, 1)))

    def resources(tune_config: dict[str, Any]) -> Any:
        configs = [parse_trial_config(c) for c in _search_configs(base, tune_config)]
        return _placement(options.resources("cached" if all(stage1_exists(c) for c in configs) else "stage1"))

    trainable = tune.with_resources(
        tune.with_parameters(_search_trainable, base=base, store=store, options=options,
                             report_epochs=scheduler.name != "none"), resources)
    init_ray(options.address)
    record_manifest(store, study, manifest)
    display = ProgressDisplay(study, remaining, objectives[0]) if options.verbose else None
    epochs = parse_trial_config(probe).stage1.epochs
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=max_concurrent),
            scheduler=scheduler.make(objectives[0], modes[0], epochs),
            num_samples=-(-remaining // configs_per_trial), reuse_actors=True, trial_dirname_creator=_trial_dirname,
        ),
        run_config=_run_config(store, study, options, [_progress_callback(
            display, lambda c: _search_configs(base, c), store, study, options.max_failures)]),
    )
    tuner.fit()
    done = set(read_trials(store, study=study, columns=["trial_id"],
                           filters=pads.field("status").isin(["ok", "pruned"]))["trial_id"])
    failed = sum(1 for i in searcher.asked_ids if i not in done)
    return StudyRun(trial_ids=all_ok(), skipped=len(finished), failed=failed, seconds=time.perf_counter() - start)
