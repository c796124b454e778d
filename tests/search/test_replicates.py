"""Replicated search objectives: the aggregates Optuna sees, replicates dispatched in populations and told once
all are in, a killed search's running trials resumed without rerunning a stored replicate, fresh seeds."""

from __future__ import annotations

import json

import numpy as np
import optuna
import pandas as pd
import pytest
from optuna.distributions import FloatDistribution
from trial_fixtures import tiny_config

from calib._config import ConfigError
from calib.search.chosen import chosen_trials, fresh_seeds
from calib.search.replicates import Replicates, aggregate
from calib.search.searcher import PopulationSearcher, sync_replicated_with_store

VALUES = [0.031, 0.052, 0.040]


@pytest.mark.parametrize(("how", "mode", "expected"), [
    ("mean", "min", (0.031 + 0.052 + 0.040) / 3),
    ("median", "min", 0.040),
    ("worst", "min", 0.052),  # the max of a minimised objective
    ("worst", "max", 0.031),  # the min of a maximised one
    # mean ± the sample standard deviation: deviations -0.010, 0.011, -0.001 → var = (1e-4 + 1.21e-4 + 1e-6) / 2
    ("mean_plus_std", "min", 0.041 + np.sqrt(0.000222 / 2)),
    ("mean_plus_std", "max", 0.041 - np.sqrt(0.000222 / 2)),
])
def test_aggregates_by_hand(how, mode, expected):
    assert aggregate(VALUES, how, mode) == pytest.approx(expected, abs=1e-15)


def test_one_replicate_is_its_own_value_and_bad_names_are_refused():
    for how in ("mean", "median", "worst", "mean_plus_std"):
        assert aggregate([0.07], how, "min") == 0.07
    with pytest.raises(ConfigError, match="--aggregate"):
        aggregate(VALUES, "max", "min")
    with pytest.raises(ConfigError, match="--aggregate"):
        Replicates(({"seed": 1},), "best")


def test_fresh_seeds_skip_every_searched_one():
    assert fresh_seeds([1, 2, 3, 4, 5], {1, 2, 3}, 5) == [4, 5, 6, 7, 8]
    assert fresh_seeds([1, 2, 3], {1, 2, 3, 7}, 2) == [8, 9]
    assert not set(fresh_seeds([1, 2], {1, 2, 4}, 3)) & {1, 2, 4}


def test_chosen_is_the_best_aggregate_or_the_pareto_front():
    completed = pd.DataFrame({"search_trial": [0, 1, 2], "val_ece": [0.05, 0.03, 0.03],
                              "val_accuracy": [0.9, 0.8, 0.85]})
    assert chosen_trials(completed, ["val_ece"])["search_trial"].tolist() == [1]  # a tie: the earliest
    assert chosen_trials(completed, ["val_ece", "val_accuracy"])["search_trial"].tolist() == [0, 2]


def replicates(tmp_path, seeds=(1, 2, 3)) -> Replicates:
    return Replicates(tuple(tiny_config(tmp_path, seed=s, study="rep") for s in seeds), "mean")


def test_a_space_that_varies_the_seed_cannot_be_replicated(tmp_path):
    with pytest.raises(ConfigError, match="varies seed"):
        replicates(tmp_path).check_space(["seed", "method.clip_init"])
    Replicates(replicates(tmp_path).bases[:1]).check_space(["seed"])  # one replicate: allowed


def test_replicates_run_in_populations_and_optuna_is_told_their_aggregate(tmp_path):
    reps = replicates(tmp_path)
    space = {"method.clip_init": FloatDistribution(0.01, 0.2)}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    stored = {}
    searcher = PopulationSearcher(study, space, objectives=["val_ece"], modes=["min"], budget=2, configs_per_trial=4,
                                  calib_id_of=lambda p: reps.ids(p)[0], replicate_ids=reps.ids, aggregate="worst",
                                  stored_values=stored)
    first = searcher.suggest("t1")["population"]
    second = searcher.suggest("t2")["population"]
    assert searcher.suggest("t3") == "FINISHED"
    # 2 trials × 3 replicates in populations of 4: one population mixes the replicates of both trials
    assert [(m["number"], m["replicate"]) for m in first + second] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    values = {}
    for tune_id, population in (("t1", first), ("t2", second)):
        results = []
        for m in population:
            calib_id = reps.ids(m["params"])[m["replicate"]]
            value = values[(m["number"], m["replicate"])] = 0.01 * (1 + m["number"]) + 0.001 * m["replicate"]
            results.append({"calib_trial_id": calib_id, "status": "ok", "val_ece": value})
        searcher.on_trial_complete(tune_id, {"calib_results": json.dumps(results)})
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert trials[0].value == pytest.approx(0.012) and trials[1].value == pytest.approx(0.022)  # worst of 3
    assert trials[0].user_attrs["calib_replicate_ids"] == reps.ids(trials[0].params)
    # each replicate's config carries its Optuna trial's number (the store's search_trial)
    assert reps.config(first[1]["params"], 1, 0)["search_trial"] == 0


def test_a_failed_replicate_fails_its_trial(tmp_path):
    reps = replicates(tmp_path, seeds=(1, 2))
    space = {"method.clip_init": FloatDistribution(0.01, 0.2)}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    searcher = PopulationSearcher(study, space, objectives=["val_ece"], modes=["min"], budget=1, configs_per_trial=1,
                                  calib_id_of=lambda p: reps.ids(p)[0], replicate_ids=reps.ids)
    (one,) = searcher.suggest("a")["population"]
    assert len(searcher.suggest("b")["population"]) == 1  # its second replicate
    ids = reps.ids(one["params"])
    searcher.on_trial_complete("a", {"calib_results": json.dumps([{"calib_trial_id": ids[0], "status": "ok",
                                                                   "val_ece": 0.1}])})
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING  # waits for its other replicate
    searcher.on_trial_complete("b", {"calib_results": json.dumps([{"calib_trial_id": ids[1], "status": "failed"}])})
    assert study.trials[0].state == optuna.trial.TrialState.FAIL


def stored_rows(reps: Replicates, params: dict, values: list[float], replicates_stored: list[int]) -> pd.DataFrame:
    return pd.DataFrame([{"trial_id": reps.ids(params)[r], "status": "ok", "pruned_epoch": None,
                          "config_json": json.dumps(reps.config(params, r)), "val_ece": values[r]}
                         for r in replicates_stored])


def test_a_killed_search_resumes_its_running_trial_without_rerunning_a_stored_replicate(tmp_path):
    reps = replicates(tmp_path)
    space = {"method.clip_init": FloatDistribution(0.01, 0.2)}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    killed = study.ask(space)  # a killed run: its trial RUNNING, replicates 0 and 2 stored
    killed.set_user_attr("calib_trial_id", reps.ids(killed.params)[0])
    done = {"method.clip_init": 0.05}  # and a complete group the journal lost
    rows = pd.concat([stored_rows(reps, killed.params, [0.02, 0.0, 0.04], [0, 2]),
                      stored_rows(reps, done, [0.01, 0.02, 0.06], [0, 1, 2])], ignore_index=True)
    told, resumed, known = sync_replicated_with_store(study, rows, space, ["val_ece"], ["min"], reps)
    assert told == 1 and resumed == [(killed.number, killed.params)] and known == {reps.ids(done)[0]}
    assert study.trials[1].value == pytest.approx(0.03)  # the mean of the stored 0.01, 0.02, 0.06
    values = {row.trial_id: [row.val_ece] for row in rows.itertuples()}
    searcher = PopulationSearcher(study, space, objectives=["val_ece"], modes=["min"], budget=1, configs_per_trial=4,
                                  calib_id_of=lambda p: reps.ids(p)[0], replicate_ids=reps.ids, stored=known,
                                  stored_values=values, resumed=resumed)
    population = searcher.suggest("t")["population"]
    assert [(m["number"], m["replicate"]) for m in population] == [(killed.number, 1)]  # only the missing one
    searcher.on_trial_complete("t", {"calib_results": json.dumps([{"calib_trial_id": reps.ids(killed.params)[1],
                                                                   "status": "ok", "val_ece": 0.03}])})
    assert study.trials[killed.number].state == optuna.trial.TrialState.COMPLETE
    assert study.trials[killed.number].value == pytest.approx((0.02 + 0.03 + 0.04) / 3)
