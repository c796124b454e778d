"""Grids of explicit configs through Ray Tune: Stage-I trainers first, each dependent once its Stage I exists.

Before anything is scheduled, trials already in the store are skipped: re-running a study resumes it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from calib.artifacts import stage1_exists
from calib.config import TrialConfig, config_hash, parse_trial_config, stage1_identity
from calib.run.display import ProgressDisplay
from calib.run.execution import DEFAULT_CONFIGS_PER_TRIAL, ExecutionOptions, placement, run_configs
from calib.run.progress import progress_callback
from calib.run.skeleton import TuneRun
from calib.run.tuner import CheckedOnly, StudyRun, run_config, trial_dirname
from calib.store import completed_trial_ids
from calib.store.manifest import manifest_of
from calib.trial import population_groups, trial_id

__all__ = ["assign_roles", "batch_roles", "run_grid"]


def _grid_configs(tune_config: dict[str, Any]) -> list[dict[str, Any]]:
    return tune_config["trial"]["configs"]


def _grid_trainable(tune_config: dict[str, Any], *, store: str, options: ExecutionOptions) -> None:
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    from ray import tune

    tune.report(run_configs(_grid_configs(tune_config), store, options))


def assign_roles(configs: Sequence[dict[str, Any]], parsed: Sequence[TrialConfig] | None = None
                 ) -> list[dict[str, Any]]:
    """``{"config", "role", "cfg", "stage1_id"}`` per config, Stage-I trainers first: the first trial of every
    Stage-I config whose artifact is not stored yet is a ``"stage1"`` trial, every other one ``"cached"``; ``cfg``
    is the config parsed (``parsed``, the configs as the caller parsed them, or parsed here), ``stage1_id`` the
    hash of its Stage I.

    Trainers go first (round-robin over Stage-I configs, as :func:`_interleave_stage1`), and
    :class:`calib.run.stage1_first.Stage1FirstSearcher` starts the others once their artifact exists.
    """
    parsed = [parse_trial_config(c) for c in configs] if parsed is None else parsed
    trainers, cached = [], []
    seen: set[str] = set()
    for config, cfg, key in _interleave_stage1(configs, parsed):
        entry = {"config": config, "cfg": cfg, "stage1_id": key}
        if key in seen or stage1_exists(cfg):
            cached.append({**entry, "role": "cached"})
        else:
            seen.add(key)
            trainers.append({**entry, "role": "stage1"})
    return trainers + cached


def batch_roles(roles: Sequence[dict[str, Any]], configs_per_trial: int) -> list[dict[str, Any]]:
    """Tune trials of :func:`assign_roles`'s entries: each ``"stage1"`` trial alone, the ``"cached"``
    ones of one Stage I together in trials of up to ``configs_per_trial``, as ``{"configs": [...], "role": ...,
    "stage1_id": ...}``.

    A Stage I's configs go population group by population group (first appearance), a group whole where it fits
    in the trial being filled (a larger one in chunks of ``configs_per_trial``), so that
    :func:`calib.trial.run_trials` trains a population together; the configs of methods without populations
    (post-hoc maps, Stage I's own evaluation) share a Tune trial and its loaded artifact rather than each paying
    Ray's per-trial start and report.
    """
    trials = [{"configs": [r["config"]], "role": "stage1", "stage1_id": r["stage1_id"]}
              for r in roles if r["role"] == "stage1"]
    cached = [r for r in roles if r["role"] == "cached"]
    chunks: dict[str, list[list[dict[str, Any]]]] = {}
    for group in population_groups([r["cfg"] for r in cached]):
        stage1_chunks = chunks.setdefault(cached[group[0]]["stage1_id"], [[]])
        if len(stage1_chunks[-1]) + len(group) > configs_per_trial and stage1_chunks[-1]:
            stage1_chunks.append([])
        for i in group:
            if len(stage1_chunks[-1]) == configs_per_trial:
                stage1_chunks.append([])
            stage1_chunks[-1].append(cached[i]["config"])
    return trials + [{"configs": configs, "role": "cached", "stage1_id": stage1_id}
                     for stage1_id, stage1_chunks in chunks.items() for configs in stage1_chunks]


def _interleave_stage1(configs: Sequence[dict[str, Any]], parsed: Sequence[TrialConfig]
                       ) -> list[tuple[dict[str, Any], TrialConfig, str]]:
    """(config, its parsed form, its Stage I's hash) of each config, round-robin over Stage-I groups, so
    concurrent trials train different Stage Is instead of queueing on one artifact's lock."""
    groups: dict[str, list[tuple[dict[str, Any], TrialConfig, str]]] = {}
    for config, cfg in zip(configs, parsed, strict=True):
        key = config_hash(stage1_identity(cfg))
        groups.setdefault(key, []).append((config, cfg, key))
    queues = list(groups.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def _grid_tuner(trials: list[dict[str, Any]], store: str, study: str, options: ExecutionOptions,
                display: ProgressDisplay | None) -> Any:
    """The Ray Tune run of a grid's Tune trials (:func:`batch_roles`), each with the resources of its role."""
    # lazy: these import ray (seconds to import): loaded only when a study runs
    from ray import tune

    from calib.run.stage1_first import Stage1FirstSearcher

    trainable = tune.with_resources(
        tune.with_parameters(_grid_trainable, store=store, options=options),
        lambda spec: placement(options.resources(spec["trial"]["role"])),
    )
    callbacks = [progress_callback(display, _grid_configs, store, study, options.max_failures)]
    return tune.Tuner(
        trainable,
        # A cap on concurrent trials is also Tune's cap on pending ones with a searcher (1 without it): as
        # many pending as trials lets Ray, and an autoscaler, see the whole demand at once.
        tune_config=tune.TuneConfig(search_alg=Stage1FirstSearcher(trials), num_samples=len(trials),
                                    max_concurrent_trials=options.max_concurrent or len(trials), reuse_actors=True,
                                    trial_dirname_creator=trial_dirname),
        run_config=run_config(store, study, options, callbacks),
    )


def run_grid(
    configs: Sequence[dict[str, Any]],
    *,
    store: str | os.PathLike,
    study: str,
    options: ExecutionOptions | None = None,
    objective: str = "val_ece",
    table: Sequence[dict[str, Any]] | None = None,
) -> StudyRun | CheckedOnly:
    """Run every config (validated first) through Ray Tune, skipping those already stored as ok.

    Every Stage I is trained by one trial: its dependents are created once that trial has ended
    (:class:`calib.run.stage1_first.Stage1FirstSearcher`). ``table``: when ``configs`` are a selection
    of a study's fixed rows, configs of every row; the study's manifest (:mod:`calib.store.manifest`)
    is computed from them instead of ``configs``. With ``options.check_only``: the :class:`CheckedOnly`
    that says how many would run, nothing started.
    """
    tune_run = TuneRun(store, study, options)
    store = tune_run.store
    parsed = [parse_trial_config(config) for config in configs]
    options = tune_run.check(manifest_of([parse_trial_config(config) for config in table] if table else parsed))
    ids = [trial_id(c) for c in parsed]
    done = completed_trial_ids(store, study, trial_ids=ids)
    todo = [n for n, i in enumerate(ids) if i not in done]  # each config parsed once, above: its index says which
    pending = [configs[n] for n in todo]
    run = StudyRun(trial_ids=ids, skipped=len(configs) - len(pending))
    if options.verbose:
        print(f"[{study}] {len(configs)} trials: {run.skipped} already in the store, {len(pending)} to run", flush=True)
    if options.check_only:
        return CheckedOnly(study, len(pending))
    if not pending:
        tune_run.compact()
        return run

    def make_tuner() -> tuple[Any, ProgressDisplay | None]:
        display = ProgressDisplay(study, len(pending), objective) if options.verbose else None
        trials = batch_roles(assign_roles(pending, [parsed[n] for n in todo]),
                             options.configs_per_trial or DEFAULT_CONFIGS_PER_TRIAL)
        return _grid_tuner(trials, store, study, options, display), display

    signal = tune_run.fit(make_tuner, len(pending))
    stored = completed_trial_ids(store, study, trial_ids=[ids[n] for n in todo])
    tune_run.stop_if_interrupted(signal, len(stored), len(pending))
    run.failed = len(pending) - len(stored)
    run.seconds = tune_run.seconds
    return run
