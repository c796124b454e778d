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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calib import storage
from calib._config import ConfigError
from calib.artifacts import stage1_exists
from calib.config import config_hash, parse_trial_config, set_dotted, stage1_identity
from calib.metrics import higher_is_better
from calib.search.space import SearchSpace
from calib.store import completed_trial_ids, write_result
from calib.store.manifest import check_manifest, manifest_of, record_manifest
from calib.trial import TrialResult, run_trial, trial_id

__all__ = ["ExecutionOptions", "StudyRun", "init_ray", "run_grid", "run_search"]

os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "60")
# Stage-I checkpoints are reported mid-trial without the search objective, which exists only at the end.
os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")


@dataclass(frozen=True)
class ExecutionOptions:
    """Where and how trials run: Ray address, per-trial resources, concurrency, Tune's storage.

    A trial that trains its Stage I requests ``cpus_per_trial`` / ``gpus_per_trial`` (whole GPUs on a
    cluster); a trial whose Stage-I artifact another trial provides (Stage II, post-hoc, evaluation on
    cached features) requests the lighter ``*_per_cached_trial`` share (fractions allowed, so several
    share one GPU); ``None`` means the same as a Stage-I trial.

    A failed trial is retried up to ``max_failures`` times; a retry of a trial that was training
    Stage I resumes from its last checkpoint, taken every ``checkpoint_every`` Stage-I epochs.
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


STAGE1_CHECKPOINT = "stage1.pt"


def _checkpointing(every: int) -> tuple[dict[str, Any] | None, Any]:
    """The Stage-I state of this trial's last Tune checkpoint (a retry), and the callback that reports
    a new checkpoint every ``every`` epochs."""
    import torch
    from ray import tune

    resume = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            resume = torch.load(Path(folder) / STAGE1_CHECKPOINT, map_location="cpu", weights_only=True)

    def on_checkpoint(state: dict[str, Any]) -> None:
        if (state["epoch"] + 1) % every == 0:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(state, Path(folder) / STAGE1_CHECKPOINT)
                tune.report({"stage1_epoch": state["epoch"]}, checkpoint=tune.Checkpoint.from_directory(folder))

    return resume, on_checkpoint


def _execute(config: dict[str, Any], store: str, checkpoint_every: int) -> dict[str, float]:
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
        resume, on_checkpoint = _checkpointing(checkpoint_every)
        result = run_trial(cfg, on_checkpoint=on_checkpoint, resume=resume)
    except Exception as err:
        write_result(store, TrialResult.failed(cfg, err, started), node_id=node_id)
        raise
    write_result(store, result, node_id=node_id)
    return {**result.metrics, "calib_trial_id": result.trial_id}


def _grid_trainable(tune_config: dict[str, Any], *, store: str, checkpoint_every: int) -> None:
    from ray import tune

    tune.report(_execute(tune_config["trial"]["config"], store, checkpoint_every))


def _search_config(base: dict[str, Any], sampled: dict[str, Any]) -> dict[str, Any]:
    config = base
    for key, value in sampled.items():
        config = set_dotted(config, key, value)
    return config


def _search_trainable(tune_config: dict[str, Any], *, base: dict[str, Any], store: str,
                      checkpoint_every: int) -> None:
    from ray import tune

    tune.report(_execute(_search_config(base, tune_config), store, checkpoint_every))


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


def _progress_callback(study: str, total: int, objective: str) -> Any:
    from ray import tune

    sign = 1.0 if higher_is_better(objective.split("_", 1)[1]) else -1.0

    class ProgressLine(tune.Callback):
        """One line per event: trials done / running / failed of the total, and the best objective so far."""

        def __init__(self) -> None:
            self.done = self.failed = 0
            self.running: set[str] = set()
            self.best: tuple[float, str] | None = None

        def _print(self) -> None:
            best = "" if self.best is None else f" · best {objective} {sign * self.best[0]:.2%} ({self.best[1]})"
            print(f"[{study}] {self.done}/{total} done · {len(self.running)} running · {self.failed} failed{best}",
                  flush=True)

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.running.add(trial.trial_id)
            self._print()

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            if objective in result and (self.best is None or sign * result[objective] > self.best[0]):
                self.best = (sign * result[objective], str(result.get("calib_trial_id", trial.trial_id)))

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.running.discard(trial.trial_id)
            self.done += 1
            self._print()

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.running.discard(trial.trial_id)
            self.failed += 1
            self._print()

    return ProgressLine()


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
        tune.with_parameters(_grid_trainable, store=store, checkpoint_every=options.checkpoint_every),
        lambda spec: _placement(options.resources(spec["trial"]["role"])),
    )
    callbacks = [_progress_callback(study, len(pending), objective)] if options.verbose else []
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
        tune.with_parameters(_search_trainable, base=base, store=store,
                              checkpoint_every=options.checkpoint_every), resources)
    init_ray(options.address)
    record_manifest(store, study, manifest)
    callbacks = [_progress_callback(study, num_trials, objectives[0])] if options.verbose else []
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



