"""calib's Ray Tune searchers: grids that start a Stage I's dependents after it, and Optuna's ask-and-tell.

:class:`Stage1FirstSearcher` hands Tune a grid's trials, each trial that reads a Stage I only once
the trial that trains it has ended.

Ray's own ``OptunaSearch`` asks one config per Tune trial. :class:`PopulationSearcher` asks
``configs_per_trial`` configs per Tune trial (a population that trains its Stage II in one process,
docs/architecture.md §6) and tells each its own result. :func:`sync_with_store` tells the Optuna
study every finished trial of the search that the store holds and it does not (a search killed
before it could tell them, or run before the study was persisted), so that a re-run samples
conditioned on everything already run. Imports Optuna and Ray: load it where a search runs.
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Callable, Collection, Sequence
from typing import Any

import optuna
import pandas as pd
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState
from ray.tune.search import Searcher

from calib.artifacts import stage1_exists
from calib.config import get_dotted, parse_trial_config
from calib.search.execution import STAGE1_EPOCHS

__all__ = ["MAX_REPEATS", "PopulationSearcher", "Stage1FirstSearcher", "sync_with_store"]

def _stage1_published(trial: dict[str, Any]) -> bool:
    return stage1_exists(parse_trial_config(trial["configs"][0]))


MAX_REPEATS = 1000
"""Proposals of already-run configs a search tolerates before it calls the space exhausted."""


class Stage1FirstSearcher(Searcher):
    """A grid's Tune trials (:func:`calib.search.grid.batch_roles`), in order, each ``"cached"`` one
    only once the ``"stage1"`` trial of its Stage I has ended: no dependent starts, on any node,
    before its artifact is published, so none trains it again.

    A trainer that ends without its Stage I published (it failed for good, its retries spent; or a
    population whose Stage I failed) releases its dependents, and the first of them becomes the
    trainer (with a Stage-I trial's resources) while the others wait for it in turn.
    ``published(trial)``: whether a trial's Stage I is stored (default
    :func:`calib.artifacts.stage1_exists` of its first config).
    """

    def __init__(self, trials: Sequence[dict[str, Any]],
                 published: Callable[[dict[str, Any]], bool] | None = None) -> None:
        super().__init__()
        self._published = published or _stage1_published
        self._queue = [dict(trial) for trial in trials]
        self._training = {trial["stage1_id"] for trial in trials if trial["role"] == "stage1"}
        self._failed: set[str] = set()
        self._trainer_of: dict[str, tuple[str, dict[str, Any]]] = {}  # Tune trial id -> (stage1_id, trial)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        for position, trial in enumerate(self._queue):
            stage1_id = trial["stage1_id"]
            if trial["role"] == "stage1" or stage1_id not in self._training:
                del self._queue[position]
                if stage1_id in self._failed:  # its trainer failed: this one trains it instead
                    self._failed.discard(stage1_id)
                    trial["role"] = "stage1"
                if trial["role"] == "stage1":
                    self._training.add(stage1_id)
                    self._trainer_of[trial_id] = (stage1_id, trial)
                return {"trial": trial}
        return Searcher.FINISHED if not self._queue else None

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        entry = self._trainer_of.pop(trial_id, None)
        if entry is not None:
            stage1_id, trial = entry
            self._training.discard(stage1_id)
            if error or not self._published(trial):
                self._failed.add(stage1_id)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as out:
            pickle.dump({k: v for k, v in self.__dict__.items() if k != "_published"}, out)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as source:
            self.__dict__.update(pickle.load(source))


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


class PopulationSearcher(Searcher):
    """Asks ``budget`` configs of ``space`` from ``study``, ``configs_per_trial`` per Tune trial.

    A Tune trial's config is ``{"population": [{"number": n, "params": {...}}, ...]}``. Its final
    result carries ``calib_results``: a JSON list with one entry per config with ``calib_trial_id``, ``status`` and the
    objective values. A config that ended ``ok`` is told COMPLETE with its values, any other FAIL; a
    Tune trial that ended without its final result and without an error was stopped by the scheduler:
    its config is told PRUNED (its per-epoch values were reported as intermediate values).
    ``calib_id_of(params)`` is the store id of a config; it is kept as the Optuna trial's
    ``calib_trial_id`` user attribute. A proposal whose id is among ``stored`` (or asked before) is
    told FAIL with the user attribute ``repeats_stored_trial`` and another is asked instead, so a
    search never runs a config twice; after :data:`MAX_REPEATS` of them the search asks no more.
    ``stored_results(ids)``: the summaries of those ids stored ``ok``, read when a Tune trial errors
    (its configs that were stored before the error are told COMPLETE).
    """

    def __init__(self, study: optuna.Study, space: dict[str, BaseDistribution], *, objectives: Sequence[str],
                 modes: Sequence[str], budget: int, configs_per_trial: int,
                 calib_id_of: Callable[[dict[str, Any]], str], stored: Collection[str] = (),
                 stored_results: Callable[[list[str]], dict[str, dict[str, Any]]] | None = None) -> None:
        single = len(objectives) == 1
        super().__init__(metric=objectives[0] if single else list(objectives), mode=modes[0] if single else list(modes))
        self.study, self.space = study, space
        self.objectives = list(objectives)
        self.budget, self.configs_per_trial = budget, configs_per_trial
        self.calib_id_of = calib_id_of
        self.asked = 0
        self.asked_ids: list[str] = []
        self.known = set(stored)
        self.stored_results = stored_results
        self.repeats = 0
        self._live: dict[str, list[optuna.Trial]] = {}
        self._reported: dict[int, set[int]] = {}  # Optuna trial number -> steps reported

    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: the Optuna journal in the store is the searcher's state."""

    def restore(self, checkpoint_path: str) -> None:
        """Nothing to restore: a re-run reads the journal and the store (:func:`sync_with_store`)."""

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self.asked >= self.budget:
            return Searcher.FINISHED
        population = []
        while len(population) < min(self.configs_per_trial, self.budget - self.asked):
            trial = self.study.ask(fixed_distributions=self.space)
            calib_id = self.calib_id_of(trial.params)
            trial.set_user_attr("calib_trial_id", calib_id)
            if calib_id in self.known:  # a config the study has already run: not run twice
                trial.set_user_attr("repeats_stored_trial", True)
                _tell(self.study, trial.number, state=TrialState.FAIL)
                self.repeats += 1
                if self.repeats > MAX_REPEATS:  # the space looks exhausted: ask no more
                    self.budget = self.asked + len(population)
                    break
                continue
            self.known.add(calib_id)
            self.asked_ids.append(calib_id)
            population.append(trial)
        if not population:
            return Searcher.FINISHED
        self.asked += len(population)
        self._live[trial_id] = population
        return {"population": [{"number": t.number, "params": t.params} for t in population]}

    def _report(self, trial: optuna.Trial, result: dict[str, Any]) -> None:
        key = f"stage1_{self.objectives[0]}"
        if len(self.objectives) == 1 and STAGE1_EPOCHS in result and key in result:
            step = int(result[STAGE1_EPOCHS])
            steps = self._reported.setdefault(trial.number, set())
            if step not in steps:
                trial.report(float(result[key]), step=step)
                steps.add(step)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """A Stage-I epoch of a one-config trial: its ``stage1_<objective>`` becomes an intermediate value."""
        population = self._live.get(trial_id, [])
        if len(population) == 1:
            self._report(population[0], result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        population = self._live.pop(trial_id, [])
        outcomes = {r["calib_trial_id"]: r for r in json.loads((result or {}).get("calib_results", "[]"))}
        if error and self.stored_results is not None:  # configs the failed Tune trial did store ok count
            outcomes = self.stored_results([t.user_attrs["calib_trial_id"] for t in population])
        stopped = not error and not outcomes
        if stopped and len(population) == 1 and result:
            self._report(population[0], result)  # the epoch that got it stopped (Tune kept it from us)
        for trial in population:
            self._reported.pop(trial.number, None)
            outcome = outcomes.get(trial.user_attrs["calib_trial_id"])
            values = _values(outcome, self.objectives) if outcome and outcome["status"] == "ok" else None
            if values is not None:
                _tell(self.study, trial, values if len(values) > 1 else values[0])
            elif stopped and len(population) == 1:
                _tell(self.study, trial, state=TrialState.PRUNED)
            else:
                _tell(self.study, trial, state=TrialState.FAIL)


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
