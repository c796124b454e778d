"""The Optuna search's Ray Tune searcher: Optuna's ask-and-tell, populations and replicates.

Ray's own ``OptunaSearch`` asks one config per Tune trial. :class:`PopulationSearcher` asks
``configs_per_trial`` configs per Tune trial (a population that trains its Stage II in one process,
docs/architecture.md §6) and tells each its own result. :func:`sync_with_store` tells the Optuna
study every finished trial of the search that the store holds and it does not (a search killed
before it could tell them, or run before the study was persisted), so that a re-run samples
conditioned on everything already run. Imports Optuna and Ray: load it where a search runs. A grid's
searcher, which runs each Stage I before its dependents, is the engine's
(:class:`calib.run.stage1_first.Stage1FirstSearcher`).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
import pandas as pd
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState
from ray.tune.search import Searcher

from calib.config import get_dotted
from calib.run.execution import STAGE1_EPOCHS
from calib.search.replicates import Replicates, aggregate_values

__all__ = ["MAX_REPEATS", "PopulationSearcher", "sync_replicated_with_store", "sync_with_store"]


MAX_REPEATS = 1000
"""Proposals of already-run configs a search tolerates before it calls the space exhausted."""


def _values(result: dict[str, Any], objectives: Sequence[str]) -> list[float] | None:
    values = [result.get(name) for name in objectives]
    if any(v is None or not math.isfinite(float(v)) for v in values):
        return None
    return [float(v) for v in values]


def _tell(study: optuna.Study, trial: optuna.Trial | int, values: Any = None, state: TrialState | None = None
          ) -> None:
    """``study.tell``; Optuna's GridSampler calls ``study.stop()`` once the grid is done, which raises
    outside ``study.optimize`` after the trial is stored: the search is complete either way."""
    try:
        study.tell(trial, values, state=state)
    except RuntimeError as err:
        if "Study.stop" not in str(err):
            raise


@dataclass
class _Unit:
    """One replicate of an Optuna trial, to run in a Tune trial's population."""

    number: int
    params: dict[str, Any]
    replicate: int
    calib_id: str


@dataclass
class _Asked:
    """An Optuna trial being run: its ``Trial`` (None for one a killed search asked, resumed by number), and the
    objective values of its replicates (None: not yet in, or failed)."""

    trial: optuna.Trial | None
    values: list[list[float] | None]
    pending: int
    failed: bool = False


class PopulationSearcher(Searcher):
    """Asks ``budget`` configs of ``space`` from ``study``, ``configs_per_trial`` replicates per Tune trial.

    A Tune trial's config is ``{"population": [{"number": n, "params": {...}, "replicate": r}, ...]}``: replicate
    ``r`` of Optuna trial ``n`` (``replicate_ids(params)``: the store ids of an Optuna trial's replicates, by
    default the one id ``calib_id_of(params)``). Its final result carries ``calib_results``: a JSON list with one
    entry per config with ``calib_trial_id``, ``status`` and the objective values. Once every replicate of an
    Optuna trial is in, it is told COMPLETE with the ``aggregate`` of their values
    (:func:`calib.search.replicates.aggregate`; the value itself for one replicate), or FAIL if one failed; a
    Tune trial of one config that ended without its final result and without an error was stopped by the
    scheduler: its config is told PRUNED (its per-epoch values were reported as intermediate values).

    ``calib_id_of(params)`` (the first replicate's id) is kept as the Optuna trial's ``calib_trial_id`` user
    attribute, the replicates' ids as ``calib_replicate_ids``. A proposal whose id is among ``stored`` (or asked
    before) is told FAIL with the user attribute ``repeats_stored_trial`` and another is asked instead, so a
    search never runs a config twice; after :data:`MAX_REPEATS` of them the search asks no more. A replicate
    whose id is in ``stored_values`` (its objective values in the store) is not run again. ``resumed``: the
    (number, params) of Optuna trials a killed search left running, run again first (their missing replicates
    only) and told by number. ``stored_results(ids)``: the summaries of those ids stored ``ok``, read when a
    Tune trial errors (its configs that were stored before the error count). ``on_told(number, values)``: called
    with each Optuna trial told COMPLETE and its values (the progress line's best, :mod:`calib.run.display`).
    """

    def __init__(self, study: optuna.Study, space: dict[str, BaseDistribution], *, objectives: Sequence[str],
                 modes: Sequence[str], budget: int, configs_per_trial: int,
                 calib_id_of: Callable[[dict[str, Any]], str], stored: Collection[str] = (),
                 stored_results: Callable[[list[str]], dict[str, dict[str, Any]]] | None = None,
                 replicate_ids: Callable[[dict[str, Any]], list[str]] | None = None, aggregate: str = "mean",
                 stored_values: Mapping[str, list[float]] | None = None,
                 resumed: Sequence[tuple[int, dict[str, Any]]] = (),
                 on_told: Callable[[int, list[float]], None] | None = None) -> None:
        single = len(objectives) == 1
        super().__init__(metric=objectives[0] if single else list(objectives), mode=modes[0] if single else list(modes))
        self.study, self.space = study, space
        self.objectives, self.modes = list(objectives), list(modes)
        self.budget, self.configs_per_trial = budget, configs_per_trial
        self.calib_id_of = calib_id_of
        self.replicate_ids = replicate_ids or (lambda params: [calib_id_of(params)])
        self.aggregate = aggregate
        self.stored_values = dict(stored_values or {})
        self.asked = 0
        self.asked_ids: list[str] = []
        self.known = set(stored)
        self.stored_results = stored_results
        self.repeats = 0
        self._resumed = list(resumed)
        self.on_told = on_told
        self._queue: list[_Unit] = []
        self._asked: dict[int, _Asked] = {}
        self._live: dict[str, list[_Unit]] = {}
        self._reported: dict[int, set[int]] = {}  # Optuna trial number -> steps reported

    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: the Optuna journal in the store is the searcher's state."""

    def restore(self, checkpoint_path: str) -> None:
        """Nothing to restore: a re-run reads the journal and the store (:func:`sync_with_store`)."""

    def _next_trial(self) -> tuple[int, dict[str, Any], optuna.Trial | None] | None:
        """The next Optuna trial to run: a resumed one, or a new proposal not run before (None: no more)."""
        if self._resumed:
            number, params = self._resumed.pop(0)
            return number, params, None
        while True:
            trial = self.study.ask(fixed_distributions=self.space)
            calib_id = self.calib_id_of(trial.params)
            trial.set_user_attr("calib_trial_id", calib_id)
            if calib_id not in self.known:
                self.known.add(calib_id)
                return trial.number, trial.params, trial
            trial.set_user_attr("repeats_stored_trial", True)  # a config the study has already run: not run twice
            _tell(self.study, trial.number, state=TrialState.FAIL)
            self.repeats += 1
            if self.repeats > MAX_REPEATS:  # the space looks exhausted: ask no more
                self.budget = self.asked
                return None

    def _start(self, number: int, params: dict[str, Any], trial: optuna.Trial | None) -> None:
        """Queue the replicates of an Optuna trial that the store does not hold yet."""
        ids = self.replicate_ids(params)
        if trial is not None and len(ids) > 1:
            trial.set_user_attr("calib_replicate_ids", ids)
        values = [self.stored_values.get(i) for i in ids]
        self._asked[number] = _Asked(trial, values, sum(v is None for v in values))
        for replicate, (calib_id, value) in enumerate(zip(ids, values, strict=True)):
            if value is None:
                self._queue.append(_Unit(number, params, replicate, calib_id))
                self.asked_ids.append(calib_id)
        if self._asked[number].pending == 0:
            self._finish(number)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        population: list[_Unit] = []
        while len(population) < self.configs_per_trial:
            if self._queue:
                population.append(self._queue.pop(0))
                continue
            if self.asked >= self.budget or (nxt := self._next_trial()) is None:
                break
            self.asked += 1
            self._start(*nxt)
        if not population:
            return Searcher.FINISHED
        self._live[trial_id] = population
        return {"population": [{"number": u.number, "params": u.params, "replicate": u.replicate}
                               for u in population]}

    def _report(self, unit: _Unit, result: dict[str, Any]) -> None:
        key = f"stage1_{self.objectives[0]}"
        trial = self._asked[unit.number].trial
        if trial is not None and len(self.objectives) == 1 and STAGE1_EPOCHS in result and key in result:
            step = int(result[STAGE1_EPOCHS])
            steps = self._reported.setdefault(unit.number, set())
            if step not in steps:
                trial.report(float(result[key]), step=step)
                steps.add(step)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """A Stage-I epoch of a one-config trial: its ``stage1_<objective>`` becomes an intermediate value."""
        population = self._live.get(trial_id, [])
        if len(population) == 1:
            self._report(population[0], result)

    def _finish(self, number: int) -> None:
        asked = self._asked.pop(number)
        target = asked.trial if asked.trial is not None else number
        if asked.failed or any(v is None for v in asked.values):
            _tell(self.study, target, state=TrialState.FAIL)
            return
        values = aggregate_values(asked.values, self.aggregate, self.modes)
        _tell(self.study, target, values if len(values) > 1 else values[0])
        if self.on_told is not None:
            self.on_told(number, values)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        population = self._live.pop(trial_id, [])
        outcomes = {r["calib_trial_id"]: r for r in json.loads((result or {}).get("calib_results", "[]"))}
        if error and self.stored_results is not None:  # configs the failed Tune trial did store ok count
            outcomes = self.stored_results([u.calib_id for u in population])
        stopped = not error and not outcomes
        if stopped and len(population) == 1 and result:
            self._report(population[0], result)  # the epoch that got it stopped (Tune kept it from us)
        for unit in population:
            self._reported.pop(unit.number, None)
            outcome = outcomes.get(unit.calib_id)
            values = _values(outcome, self.objectives) if outcome and outcome["status"] == "ok" else None
            asked = self._asked[unit.number]
            if values is None and stopped and len(population) == 1 and len(asked.values) == 1:
                self._asked.pop(unit.number)
                _tell(self.study, asked.trial if asked.trial is not None else unit.number, state=TrialState.PRUNED)
                continue
            asked.values[unit.replicate] = values
            asked.failed |= values is None
            asked.pending -= 1
            if asked.pending == 0:
                self._finish(unit.number)


def sync_with_store(study: optuna.Study, rows: pd.DataFrame, space: dict[str, BaseDistribution],
                    objectives: Sequence[str]) -> int:
    """Tell ``study`` every stored trial (``rows``: the search's ``ok`` and ``pruned`` rows, with
    ``config_json``) it does not hold as COMPLETE or PRUNED; returns how many were added.

    Trials the study still shows RUNNING were asked by a search that was killed before telling them:
    they become FAIL (their stored rows, if any, are added as new trials). A row whose parameters
    fall outside ``space`` is not told.
    """
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        _tell(study, trial.number, state=TrialState.FAIL)
    known = {t.user_attrs.get("calib_trial_id")
             for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))}
    added = 0
    for row in rows.itertuples(index=False):
        if row.trial_id in known:
            continue
        config = json.loads(row.config_json)
        params = {key: get_dotted(config, key) for key in space}
        if not all(dist._contains(dist.to_internal_repr(params[key])) for key, dist in space.items()):
            continue
        if row.status == "ok":
            values = _values(row._asdict(), objectives)
            if values is None:
                continue
            trial = optuna.trial.create_trial(params=params, distributions=space, values=values,
                                              user_attrs={"calib_trial_id": row.trial_id})
        else:
            value = getattr(row, objectives[0], None)
            intermediate = {} if value is None or pd.isna(value) or pd.isna(row.pruned_epoch) \
                else {int(row.pruned_epoch) + 1: float(value)}
            trial = optuna.trial.create_trial(params=params, distributions=space, state=TrialState.PRUNED,
                                              intermediate_values=intermediate,
                                              user_attrs={"calib_trial_id": row.trial_id})
        study.add_trial(trial)
        added += 1
    return added


def _stored_values(rows: pd.DataFrame, objectives: Sequence[str]) -> dict[str, list[float]]:
    """The objective values of each ``ok`` row, by trial id (rows without finite values left out)."""
    out = {}
    for row in rows[rows["status"] == "ok"].itertuples(index=False):
        values = _values(row._asdict(), objectives)
        if values is not None:
            out[row.trial_id] = values
    return out


def sync_replicated_with_store(study: optuna.Study, rows: pd.DataFrame, space: dict[str, BaseDistribution],
                               objectives: Sequence[str], modes: Sequence[str], replicates: Replicates
                               ) -> tuple[int, list[tuple[int, dict[str, Any]]], set[str]]:
    """:func:`sync_with_store` for a search whose Optuna trials each run several replicates.

    A trial the study still shows RUNNING (a killed search asked it) is told COMPLETE if the store holds every
    replicate, else resumed: returned as (number, params), so the next run runs its missing replicates under the
    same number (a replicate already stored is not run again). The stored groups of replicates the study does not
    hold (a lost journal) are told COMPLETE when every replicate is stored. Returns how many were told, the resumed
    trials, and the anchor ids of the complete ones (the trials the study holds as run)."""
    values = _stored_values(rows, objectives)

    def complete(ids: list[str]) -> bool:
        return all(i in values for i in ids)

    def told_values(ids: list[str]) -> list[float]:
        return aggregate_values([values[i] for i in ids], replicates.how, modes)

    added, resumed = 0, []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        if set(trial.params) != set(space) or "calib_trial_id" not in trial.user_attrs:
            _tell(study, trial.number, state=TrialState.FAIL)
            continue
        ids = replicates.ids(trial.params)
        if complete(ids):
            told = told_values(ids)
            _tell(study, trial.number, told if len(told) > 1 else told[0])
            added += 1
        else:
            resumed.append((trial.number, dict(trial.params)))
    known = {t.user_attrs.get("calib_trial_id")
             for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))}
    running = {replicates.ids(params)[0] for _, params in resumed}
    seen: set[str] = set()
    for row in rows[rows["status"] == "ok"].itertuples(index=False):
        config = json.loads(row.config_json)
        params = {key: get_dotted(config, key) for key in space}
        key = json.dumps(params, sort_keys=True, default=str)
        if key in seen or not all(dist._contains(dist.to_internal_repr(params[k])) for k, dist in space.items()):
            continue
        seen.add(key)
        ids = replicates.ids(params)
        if ids[0] in known or ids[0] in running or not complete(ids):
            continue
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions=space, values=told_values(ids),
            user_attrs={"calib_trial_id": ids[0], "calib_replicate_ids": ids}))
        known.add(ids[0])
        added += 1
    return added, resumed, {k for k in known if k}
