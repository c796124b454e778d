"""Optuna searches over a space through Ray Tune: samplers, early-stopping schedulers, resuming a search."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.dataset as pads

from calib import storage
from calib._config import ConfigError
from calib.artifacts import stage1_exists
from calib.config import config_hash, parse_trial_config, set_dotted, stage1_identity
from calib.metrics import METRICS, higher_is_better
from calib.run.display import ProgressDisplay
from calib.run.execution import (
    DEFAULT_CONFIGS_PER_TRIAL,
    STAGE1_EPOCHS,
    ExecutionOptions,
    placement,
    run_configs,
    stored_summaries,
)
from calib.run.progress import progress_callback
from calib.run.skeleton import TuneRun
from calib.run.tuner import CheckedOnly, StudyRun, run_config, trial_dirname
from calib.search.replicates import Replicates
from calib.search.space import SearchSpace
from calib.store import read_trials
from calib.store.manifest import manifest_of
from calib.trial import trial_id

__all__ = ["DEFAULT_TPE_WINDOW", "SAMPLERS", "SCHEDULERS", "SCHEDULER_METRICS", "SchedulerSettings", "resumed_seed",
           "run_search", "stage1_parameters", "study_history"]


def _search_config(base: dict[str, Any], sampled: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the sampled parameters set (one replicate: :meth:`Replicates.config`)."""
    return Replicates((base,)).config(sampled)


def _search_configs(replicates: Replicates, tune_config: dict[str, Any]) -> list[dict[str, Any]]:
    """The trial configs of a Tune trial's population: replicate ``replicate`` of Optuna trial ``number``."""
    return [replicates.config(m["params"], m.get("replicate", 0), m.get("number"))
            for m in tune_config["population"]]


def _search_trainable(tune_config: dict[str, Any], *, replicates: Replicates, store: str,
                      options: ExecutionOptions, report_epochs: bool) -> None:
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    from ray import tune

    tune.report(run_configs(_search_configs(replicates, tune_config), store, options, report_epochs))


DEFAULT_TPE_WINDOW = 10_000
"""Finished trials TPE conditions on by default (:mod:`calib.search.tpe`; 0: all): about 1 s per
population of 16 asks on 2 cores."""


def _sampler(name: str, space: SearchSpace, seed: int, tpe_window: int = DEFAULT_TPE_WINDOW) -> Any:
    # lazy: these import ray and optuna (seconds to import): loaded only when a study runs
    import optuna

    from calib.search.tpe import WindowedTPESampler

    if name == "tpe":  # the constant liar keeps concurrent and batched asks apart (Optuna's advice)
        return WindowedTPESampler(window=tpe_window, seed=seed, constant_liar=True)
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
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
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


def study_history(study: Any) -> list[str]:
    """The store ids (``calib_trial_id``) of the trials an Optuna study holds, in order, ``""`` for a
    trial without one: the history :func:`resumed_seed` hashes."""
    return [t.user_attrs.get("calib_trial_id", "") for t in study.get_trials(deepcopy=False)]


def _open_study(store: str, study: str, objectives: Sequence[str], modes: Sequence[str], sampler: Any,
                journal: Any = None, replicates: Replicates | None = None) -> Any:
    """The search's Optuna study in the store's journal (:mod:`calib.search.journal`; ``journal``: its
    storage, already opened), created or loaded; a ``ConfigError`` when its objectives, or the replicates and
    aggregate of a replicated search, are not those it was searched with."""
    # lazy: these import ray and optuna (seconds to import): loaded only when a study runs
    import optuna

    from calib.search.journal import journal_location, optuna_storage

    directions = ["maximize" if m == "max" else "minimize" for m in modes]
    journal = optuna_storage(store, study) if journal is None else journal
    opened = optuna.create_study(study_name=study, storage=journal, sampler=sampler, directions=directions,
                                 load_if_exists=True)
    stored = opened.user_attrs.get("objectives")
    if stored is not None and list(stored) != list(objectives):
        raise ConfigError(
            f"Study {study!r} was searched for {stored} (its Optuna journal {journal_location(store, study)}); "
            f"got --objective {list(objectives)}. Use the same objectives, or another --study.")
    if stored is None:
        opened.set_user_attr("objectives", list(objectives))
    if replicates is not None:
        _check_replicates(opened, replicates, journal_location(store, study))
    return opened


def _check_replicates(opened: Any, replicates: Replicates, location: str) -> None:
    """Record the replicates ([dataset, arch, seed] each) and aggregate of a study, or refuse other ones: Optuna's
    values would mix aggregates over different replicates."""
    described = {"replicates": replicates.described(), "aggregate": replicates.how if len(replicates) > 1 else None}
    stored = {key: opened.user_attrs.get(key) for key in described}
    if "replicates" not in opened.user_attrs:
        for key, value in described.items():
            opened.set_user_attr(key, value)
    elif stored != json.loads(json.dumps(described)):
        raise ConfigError(
            f"Study {opened.study_name!r} was searched on the replicates (dataset, arch, seed) {stored['replicates']}"
            f" with --aggregate {stored['aggregate'] or 'none'} (its Optuna journal {location}); this run has "
            f"{described['replicates']} with {described['aggregate'] or 'none'}. Use the same --replicates, "
            f"--seeds, --datasets, --archs and --aggregate, or another --study.")


def _check_objectives(objectives: Sequence[str], tpe_window: int) -> list[str]:
    """The optimisation direction ("max" or "min") of each objective; a ``ConfigError`` for an objective
    that is not a validation metric or a negative ``tpe_window``."""
    if tpe_window < 0:
        raise ConfigError(f"`tpe_window` must be >= 0 (finished trials TPE conditions on; 0: all), got {tpe_window}.")
    for name in objectives:
        if not name.startswith("val_"):
            raise ConfigError(f"Search objectives must be validation metrics (val_*), got {name!r}.")
        metric = name.removeprefix("val_")
        higher_is_better(metric)
        if METRICS[metric].zero_is_best:
            raise ConfigError(f"Search objective {name!r} is a calibration-error estimate that is best at 0 and "
                              "can be negative, so neither min nor max optimises it; search on val_nll, val_brier "
                              "or val_ece instead.")
    return ["max" if higher_is_better(o.removeprefix("val_")) else "min" for o in objectives]


def _probe_and_manifest(bases: Sequence[dict[str, Any]], space: SearchSpace
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first base config with every parameter at its first value (each replicate's validated here, before
    Ray starts), and the search's manifest: the space, and the keys the space does not set."""
    probes = []
    for base in bases:
        probe = dict(base)
        for key, dist in space.parameters.items():
            first = dist.spec.get("low", (dist.spec.get("values") or dist.spec.get("choices") or [None])[0])
            probe = set_dotted(probe, key, first)
        probes.append(probe)
    probe = probes[0]
    manifest = manifest_of([parse_trial_config(p) for p in probes],
                           space={"parameters": {k: d.spec for k, d in space.parameters.items()},
                                  "base": space.base})
    manifest["constant"] = {k: v for k, v in manifest["constant"].items() if k not in space.parameters}
    return probe, manifest


def _scheduling(scheduler: SchedulerSettings, stage1_keys: Sequence[str], objectives: Sequence[str],
                options: ExecutionOptions, notes: list[str]) -> tuple[SchedulerSettings, ExecutionOptions]:
    """The scheduler the search runs with (none for a space that leaves Stage I alone: a note says so) and
    the options it needs (HyperBand checkpoints every epoch); a ``ConfigError`` for what it cannot act on."""
    if scheduler.name != "none" and not stage1_keys:
        notes.append(f"no scheduler: every trial of this space runs on a stored Stage I (--scheduler "
                     f"{scheduler.name} stops trials during Stage I)")
        return SchedulerSettings(), options
    if scheduler.name != "none":
        if len(objectives) > 1 or objectives[0] not in SCHEDULER_METRICS:
            raise ConfigError(f"--scheduler {scheduler.name} needs one objective among the Stage-I per-epoch "
                              f"metrics {', '.join(SCHEDULER_METRICS)}; got --objective {' '.join(objectives)}.")
        if (options.configs_per_trial or 1) > 1:
            raise ConfigError(f"--scheduler {scheduler.name} stops single trials: it needs --configs-per-trial 1, "
                              f"got {options.configs_per_trial}.")
        if scheduler.name == "hyperband":  # paused trials resume from their last epoch
            options = dataclasses.replace(options, checkpoint_every=1, checkpoint_min_seconds=0.0)
    return scheduler, options


@dataclass
class _Synced:
    """A search's journal and Optuna study synced with the store (:func:`_resumed_study`)."""

    journal: Any
    study: Any
    distributions: dict[str, Any]
    told: int
    finished: int
    """Optuna trials the study holds as run: finished rows, or (replicated) complete groups of replicates."""
    known: set[str]
    """Their store ids (a replicated search's: each trial's first replicate's)."""
    stored_values: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    resumed: list[tuple[int, dict[str, Any]]] = dataclasses.field(default_factory=list)


def _checked_copy(store: str, study: str) -> Any:
    """An in-memory copy of the search's Optuna study (empty when the store has no journal of it): what
    ``--check-only`` syncs with the store and counts, so that it writes nothing (no journal, no folder)."""
    # lazy: these import optuna (seconds to import): loaded only when a study runs
    import optuna

    from calib.search.journal import journal_location, optuna_storage

    memory = optuna.storages.InMemoryStorage()
    if storage.exists(journal_location(store, study)):
        try:  # reading the journal writes nothing to it
            optuna.copy_study(from_study_name=study, from_storage=optuna_storage(store, study), to_storage=memory)
        except KeyError:  # a journal without this study (an empty file): as if there were none
            pass
    return memory


def _resumed_study(store: str, study: str, space: SearchSpace, objectives: Sequence[str], modes: Sequence[str],
                   sampler: str, seed: int, tpe_window: int, replicates: Replicates, check_only: bool = False
                   ) -> _Synced:
    """The search's journal and Optuna study, synced with the store: the stored finished trials (``ok`` and
    ``pruned``) are told to the sampler; a replicated search also resumes the trials a killed run left
    running (:func:`calib.search.searcher.sync_replicated_with_store`). ``check_only``: the same on an in-memory
    copy of the journal (:func:`_checked_copy`), nothing written."""
    # lazy: these import ray and optuna (seconds to import): loaded only when a study runs
    from calib.search.journal import optuna_storage
    from calib.search.searcher import _stored_values, sync_replicated_with_store, sync_with_store

    journal = _checked_copy(store, study) if check_only else optuna_storage(store, study)
    optuna_study = _open_study(store, study, objectives, modes, None, journal, replicates)
    # A resumed search must not replay the first run's random draws: its sampler seed also depends on
    # the trials the study already holds (deterministic for a given history).
    optuna_study.sampler = _sampler(sampler, space, resumed_seed(seed, study_history(optuna_study)), tpe_window)
    finished = read_trials(store, study=study, filters=pads.field("status").isin(["ok", "pruned"]),
                           columns=["trial_id", "status", "config_json", "pruned_epoch", *objectives])
    distributions = space.optuna_space()
    with contextlib.nullcontext() if check_only else journal.batched():  # one journal append for all trials told
        if len(replicates) == 1:
            told = sync_with_store(optuna_study, finished, distributions, objectives)
            synced = _Synced(journal, optuna_study, distributions, told, len(finished), set(finished["trial_id"]))
        else:
            told, resumed, known = sync_replicated_with_store(optuna_study, finished, distributions, objectives,
                                                              modes, replicates)
            synced = _Synced(journal, optuna_study, distributions, told, len(known), known,
                             _stored_values(finished, objectives), resumed)
    if not check_only:
        journal.snapshot_if_due()  # the next run replays only what this one adds
    return synced


def _replicate_runs(remaining: int, synced: _Synced, replicates: Replicates) -> int:
    """The store rows a search run runs: each resumed Optuna trial's replicates not stored yet (they run first),
    then every replicate of each new one."""
    resumed = synced.resumed[:remaining]
    missing = sum(sum(i not in synced.stored_values for i in replicates.ids(params)) for _, params in resumed)
    return missing + (remaining - len(resumed)) * len(replicates)


def _remaining(num_trials: int, stored: int, space: SearchSpace, notes: list[str]) -> int:
    """How many trials this run asks for: those ``num_trials`` lacks, at most the configs of a finite space
    not yet stored (a note says so)."""
    remaining = max(0, num_trials - stored)
    if space.is_finite() and remaining > len(space.grid()) - stored:
        notes.append(f"the space has {len(space.grid())} configs and {stored} are stored: "
                     f"{max(0, len(space.grid()) - stored)} can run, not {remaining}")
        remaining = max(0, len(space.grid()) - stored)
    return remaining


def _ok_trial_ids(store: str, study: str) -> list[str]:
    """The ids of the study's ``ok`` trials in the order they finished."""
    rows = read_trials(store, study=study, columns=["trial_id", "finished_at"], filters=pads.field("status") == "ok")
    return rows.sort_values("finished_at")["trial_id"].tolist()


def _search_tuner(replicates: Replicates, store: str, study: str, options: ExecutionOptions, searcher: Any,
                  scheduler: Any, num_samples: int, display: ProgressDisplay | None, report_epochs: bool) -> Any:
    """The Ray Tune run of the search: each Tune trial runs its population of configs with the resources of a
    Stage-I trainer, or of a cached trial when every config's Stage I is stored."""
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    max_concurrent = options.max_concurrent or max(1, int((os.cpu_count() or 1) // max(options.cpus_per_trial, 1)))

    def resources(tune_config: dict[str, Any]) -> Any:
        configs = [parse_trial_config(c) for c in _search_configs(replicates, tune_config)]
        return placement(options.resources("cached" if all(stage1_exists(c) for c in configs) else "stage1"))

    trainable = tune.with_resources(
        tune.with_parameters(_search_trainable, replicates=replicates, store=store, options=options,
                             report_epochs=report_epochs), resources)
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=max_concurrent), scheduler=scheduler,
            num_samples=num_samples, reuse_actors=True, trial_dirname_creator=trial_dirname,
        ),
        run_config=run_config(store, study, options, [progress_callback(
            display, lambda c: _search_configs(replicates, c), store, study, options.max_failures)]),
    )


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
    options: ExecutionOptions | None = None,
    scheduler: SchedulerSettings | None = None,
    tpe_window: int = DEFAULT_TPE_WINDOW,
    replicates: Replicates | None = None,
) -> StudyRun | CheckedOnly:
    """Search ``space`` with Optuna: run the trials the study lacks to hold ``num_trials`` finished ones
    (a trial that fails leaves the study short; a re-run tries again).

    Finished trials (``ok`` or ``pruned``) of ``study`` already in the store count toward
    ``num_trials`` and are told to the sampler first (:func:`calib.search.searcher.sync_with_store`):
    a re-run resumes a killed search, and a larger ``num_trials`` extends it. The Optuna study is
    persisted in the store (:mod:`calib.search.journal`). Objectives are validation metrics (``val_*``):
    the test split never drives the search. TPE conditions on at most ``tpe_window`` finished trials
    (:mod:`calib.search.tpe`; 0: all). ``scheduler`` stops unpromising trials during Stage I
    (stored as ``pruned``); a space that leaves Stage I alone gets none and runs its configs
    ``options.configs_per_trial`` per Tune trial (populations). With ``options.check_only``: the
    :class:`CheckedOnly` that says how many would run, nothing started.

    ``replicates``: each Optuna trial runs its config on every replicate base config (seeds × setups, the
    first being ``base``), each a row of the store with the trial's number (``search_trial``), and Optuna sees
    their aggregate (:mod:`calib.search.replicates`); populations mix the replicates of several trials.
    """
    # lazy: these import ray and optuna (seconds to import): loaded only when a study runs
    import optuna

    from calib.search.searcher import PopulationSearcher

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    modes = _check_objectives(objectives, tpe_window)
    tune_run = TuneRun(store, study, options)
    store = tune_run.store
    replicates = replicates or Replicates((base,))
    replicates.check_space(list(space.parameters))
    probe, manifest = _probe_and_manifest(replicates.bases, space)
    options = tune_run.check(manifest)
    stage1_keys = stage1_parameters(base, space)
    notes: list[str] = []
    scheduler, options = _scheduling(scheduler or SchedulerSettings(), stage1_keys, objectives, options, notes)
    if scheduler.name != "none" and len(replicates) > 1:
        raise ConfigError(f"--scheduler {scheduler.name} stops single trials: it needs --replicates 1 and one setup, "
                          f"got {len(replicates)} replicates.")
    configs_per_trial = options.configs_per_trial or (1 if stage1_keys else DEFAULT_CONFIGS_PER_TRIAL)
    synced = _resumed_study(store, study, space, objectives, modes, sampler, seed, tpe_window, replicates,
                            check_only=options.check_only)
    remaining = _remaining(num_trials, synced.finished, space, notes)
    runs = _replicate_runs(remaining, synced, replicates)
    replicated = len(replicates) > 1
    if options.verbose:
        print(f"[{study}] {num_trials} trials"
              + (f" × {len(replicates)} replicates" if replicated else "")
              + f": {synced.finished} already in the store"
              + (f" ({synced.told} told to the sampler now)" if synced.told else "")
              + (f" ({len(synced.resumed)} of them resumed)" if synced.resumed else "")
              + f", {remaining} to run" + (f" ({runs} replicate trials)" if replicated else "")
              + (f", {configs_per_trial} per Ray trial" if configs_per_trial > 1 else "")
              + (f" · scheduler {scheduler.name}" if scheduler.name != "none" else ""), flush=True)
        for note in notes:
            print(f"[{study}] {note}", flush=True)
    if options.check_only:
        return CheckedOnly(study, runs, f" ({remaining} Optuna trials × {len(replicates)} replicates)"
                           if replicated else "")
    if remaining == 0:
        tune_run.compact()
        return StudyRun(trial_ids=_ok_trial_ids(store, study), skipped=synced.finished, seconds=tune_run.seconds)
    display = ProgressDisplay(study, runs, objectives[0],
                              replicates=len(replicates)) if options.verbose else None
    searcher = PopulationSearcher(
        synced.study, synced.distributions, objectives=objectives, modes=modes, budget=remaining,
        configs_per_trial=configs_per_trial, calib_id_of=lambda params: trial_id(replicates.config(params)),
        stored=synced.known,
        stored_results=lambda ids: stored_summaries(store, study, ids),
        replicate_ids=replicates.ids, aggregate=replicates.how, stored_values=synced.stored_values,
        resumed=synced.resumed,
        on_told=(lambda number, values: display.trial_told(number, values[0])) if display else None)

    def make_tuner() -> tuple[Any, ProgressDisplay | None]:
        stopper = scheduler.make(objectives[0], modes[0], parse_trial_config(probe).stage1.epochs)
        return _search_tuner(replicates, store, study, options, searcher, stopper,
                             -(-remaining * len(replicates) // configs_per_trial), display,
                             report_epochs=scheduler.name != "none"), display

    signal = tune_run.fit(make_tuner, remaining, after_fit=synced.journal.snapshot_if_due)
    done = set(read_trials(store, study=study, columns=["trial_id"],
                           filters=pads.field("status").isin(["ok", "pruned"]))["trial_id"])
    tune_run.stop_if_interrupted(signal, sum(1 for i in searcher.asked_ids if i in done), remaining)
    failed = sum(1 for i in searcher.asked_ids if i not in done)
    return StudyRun(trial_ids=_ok_trial_ids(store, study), skipped=synced.finished, failed=failed,
                    seconds=tune_run.seconds)
