"""Running trials through Ray Tune: grids of explicit configs, and Optuna searches over a space.

This is the only module that imports Ray. Each Tune trial calls :func:`calib.trial.run_trial` and
writes its result into the store from the worker, so a finished trial survives the driver. Before
anything is scheduled, trials already in the store are skipped: re-running a study resumes it.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
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

__all__ = ["ExecutionOptions", "StudyRun", "init_ray", "run_grid", "run_search"]

os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
# A failed trial is one calib line (ProgressDisplay); its traceback is in the store's `error` column.
os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
# Stage-I checkpoints are reported mid-trial without the search objective, which exists only at the end.
os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")

# Ray log records that calib replaces with its own lines or that are not the user's business:
# logger name -> message prefixes dropped. Everything else Ray logs still reaches the user.
RAY_NOISE: dict[str, tuple[str, ...]] = {
    # the notice that a local cluster turned on Ray's token authentication (its default)
    "ray._private.authentication.authentication_token_setup": ("Token authentication is enabled",),
    # the list of failed trials at the end of a run: calib prints one line per failed trial
    "ray.tune.tune": ("Trials did not complete",),
    # Optuna's GridSampler stops its study once every grid point is told, which in Tune's ask-and-tell
    # loop (outside study.optimize) only logs this; the search is complete either way
    "ray.tune.search.optuna.optuna_search": ("`Study.stop` is supposed to be invoked inside",),
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


def _checkpointing(every: int, min_seconds: float) -> tuple[dict[str, Any] | None, Any]:
    """The Stage-I state of this trial's last Tune checkpoint (a retry), and the callback that reports
    a new checkpoint every ``every`` epochs, at least ``min_seconds`` after the previous one."""
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
        if (state["epoch"] + 1) % every == 0 and time.monotonic() - last_report >= min_seconds:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(state, Path(folder) / STAGE1_CHECKPOINT)
                tune.report({"stage1_epoch": state["epoch"]}, checkpoint=tune.Checkpoint.from_directory(folder))
            last_report = time.monotonic()

    return resume, on_checkpoint


def _execute(config: dict[str, Any], store: str, options: ExecutionOptions) -> dict[str, float]:
    """Run one trial and store it; a failure is stored as a ``failed`` row and re-raised for Tune.

    Torch uses as many threads as the CPUs Ray assigned to the trial.
    """
    import ray
    import torch

    context = ray.get_runtime_context() if ray.is_initialized() else None
    cpus = context.get_assigned_resources().get("CPU", 1.0) if context else 1.0
    torch.set_num_threads(max(1, int(cpus)))
    node_id = context.get_node_id() if context else None
    cfg = parse_trial_config(config)
    started = dt.datetime.now(dt.timezone.utc)
    try:
        resume, on_checkpoint = _checkpointing(options.checkpoint_every, options.checkpoint_min_seconds)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ArtifactWarning)
            result = run_trial(cfg, on_checkpoint=on_checkpoint, resume=resume)
    except Exception as err:
        write_result(store, TrialResult.failed(cfg, err, started), node_id=node_id)
        raise
    write_result(store, result, node_id=node_id)
    notes = [str(w.message) for w in caught if issubclass(w.category, ArtifactWarning)]
    for w in caught:  # the others go where they would have gone: the worker's log
        if not issubclass(w.category, ArtifactWarning):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    # A healed artifact is news for the user at the driver (workers' output does not reach it).
    return {**result.metrics, "calib_trial_id": result.trial_id, "calib_notes": "\n".join(notes)}


def _grid_config(tune_config: dict[str, Any]) -> dict[str, Any]:
    return tune_config["trial"]["config"]


def _grid_trainable(tune_config: dict[str, Any], *, store: str, options: ExecutionOptions) -> None:
    from ray import tune

    tune.report(_execute(_grid_config(tune_config), store, options))


def _search_config(base: dict[str, Any], sampled: dict[str, Any]) -> dict[str, Any]:
    config = base
    for key, value in sampled.items():
        config = set_dotted(config, key, value)
    return config


def _search_trainable(tune_config: dict[str, Any], *, base: dict[str, Any], store: str,
                      options: ExecutionOptions) -> None:
    from ray import tune

    tune.report(_execute(_search_config(base, tune_config), store, options))


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


def _progress_callback(display: ProgressDisplay, calib_id_of: Callable[[dict[str, Any]], str],
                       store: str, max_failures: int) -> Any:
    """A Tune callback that feeds Tune's trial events to ``display``; ``calib_id_of(trial.config)`` is
    the trial's store id, whose failed row in ``store`` says what a failed trial died of."""
    from ray import tune

    objective = display.objective

    class ProgressCallback(tune.Callback):
        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            display.trial_started(trial.trial_id)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            result = trial.last_result or {}
            if "calib_trial_id" not in result:  # stopped before its final report: a scheduler pruned it
                display.trial_pruned(trial.trial_id)
                return
            for note in filter(None, str(result.get("calib_notes", "")).splitlines()):
                display.note(note)
            display.trial_finished(trial.trial_id, result["calib_trial_id"], result.get(objective))

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            calib_id = calib_id_of(trial.config)
            display.trial_failed(trial.trial_id, calib_id, _failure_line(store, display.study, calib_id, trial))

        def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            calib_id = calib_id_of(trial.config)
            display.trial_retrying(trial.trial_id, calib_id, trial.run_metadata.num_failures, max_failures,
                                   _failure_line(store, display.study, calib_id, trial))

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            display.tick()

        def on_experiment_end(self, trials: list, **info: Any) -> None:
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
    callbacks = []
    if options.verbose:
        display = ProgressDisplay(study, len(pending), objective)
        callbacks.append(_progress_callback(display, lambda c: trial_id(_grid_config(c)), store,
                                            options.max_failures))
    tuner = tune.Tuner(
        trainable,
        param_space={"trial": tune.grid_search(assign_roles(pending))},
        tune_config=tune.TuneConfig(max_concurrent_trials=options.max_concurrent, reuse_actors=True,
                                    trial_dirname_creator=_trial_dirname),
        run_config=_run_config(store, study, options, callbacks),
    )
    results = tuner.fit()
    run.failed = sum(1 for r in results if r.error is not None)
    run.seconds = time.perf_counter() - start
    return run


def _sampler(name: str, space: SearchSpace, seed: int, multi_objective: bool) -> Any:
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        grid = {k: d.spec.get("values", d.spec.get("choices")) for k, d in space.parameters.items()}
        if not space.is_finite():
            raise ConfigError("--sampler grid needs a space whose parameters are all grid or categorical.")
        return optuna.samplers.GridSampler(grid, seed=seed)
    raise ConfigError(f"`sampler` must be one of 'tpe', 'random', 'grid', got sampler={name!r}.")


SAMPLERS = ("tpe", "random", "grid")


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
) -> StudyRun:
    """Sample ``num_trials`` configs from ``space`` with Optuna (through Ray Tune's OptunaSearch).

    Objectives are validation metrics (``val_*``): the test split never drives the search.
    """
    import optuna
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

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
    multi = len(objectives) > 1
    class FinalResultOptunaSearch(OptunaSearch):
        """OptunaSearch that skips a trial's Stage-I checkpoint reports: the objective exists only at the end."""

        def on_trial_result(self, trial_id: str, result: dict) -> None:
            if all(name in result for name in objectives):
                super().on_trial_result(trial_id, result)

    searcher = FinalResultOptunaSearch(
        space=space.optuna_space(),
        metric=list(objectives) if multi else objectives[0],
        mode=modes if multi else modes[0],
        sampler=_sampler(sampler, space, seed, multi),
    )
    max_concurrent = options.max_concurrent or max(1, int((os.cpu_count() or 1) // max(options.cpus_per_trial, 1)))
    def resources(sampled: dict[str, Any]) -> Any:
        cfg = parse_trial_config(_search_config(base, sampled))
        return _placement(options.resources("cached" if stage1_exists(cfg) else "stage1"))

    trainable = tune.with_resources(
        tune.with_parameters(_search_trainable, base=base, store=store, options=options), resources)
    init_ray(options.address)
    record_manifest(store, study, manifest)
    callbacks = []
    if options.verbose:
        display = ProgressDisplay(study, num_trials, objectives[0])
        callbacks.append(_progress_callback(display, lambda c: trial_id(_search_config(base, c)), store,
                                            options.max_failures))
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=max_concurrent),
            num_samples=num_trials, reuse_actors=True, trial_dirname_creator=_trial_dirname,
        ),
        run_config=_run_config(store, study, options, callbacks),
    )
    results = tuner.fit()
    ids = [r.metrics["calib_trial_id"] for r in results if r.metrics and "calib_trial_id" in r.metrics]
    return StudyRun(trial_ids=ids, failed=sum(1 for r in results if r.error is not None),
                    seconds=time.perf_counter() - start)



