"""How a grid's cached configs are packed into Tune trials (``calib.run.grid.batch_roles``)."""

from __future__ import annotations

from calib.config import config_hash, parse_trial_config, stage1_identity
from calib.run.grid import assign_roles, batch_roles


def _names(trials):
    return [[(c["seed"], c["method"]["name"], c["method"].get("accuracy_weight")) for c in t["configs"]]
            for t in trials]


def test_a_stage1s_cached_configs_share_tune_trials_and_a_population_stays_whole(make_config):
    mac_cal = [{"name": "mac_cal", "epochs": 2, "accuracy_weight": w} for w in (0.3, 0.5, 0.7)]
    methods = [{"name": "vanilla"}, {"name": "temperature_scaling"}, {"name": "vector_scaling"}, *mac_cal,
               {"name": "histogram_binning_equal_mass"}]
    configs = [make_config(seed=seed, method=m) for seed in (1, 2) for m in methods]
    roles = assign_roles(configs)
    stage1_of = {id(c): config_hash(stage1_identity(parse_trial_config(c))) for c in configs}

    # up to 16 a trial: one trainer per seed, then all six cached configs of each seed in one trial
    trials = batch_roles(roles, configs_per_trial=16)
    assert [(t["role"], len(t["configs"])) for t in trials] == [("stage1", 1), ("stage1", 1), ("cached", 6),
                                                                ("cached", 6)]
    assert _names(trials[2:]) == [
        [(s, "temperature_scaling", None), (s, "vector_scaling", None), (s, "mac_cal", 0.3), (s, "mac_cal", 0.5),
         (s, "mac_cal", 0.7), (s, "histogram_binning_equal_mass", None)] for s in (1, 2)]
    for trial in trials:  # a trial's configs are its Stage I's
        assert {stage1_of[id(c)] for c in trial["configs"]} == {trial["stage1_id"]}

    # up to 4: TS and VS fill a trial's first two places; MaC-Cal's population of 3 does not fit beside them
    # and starts the next trial whole; histogram binning joins it
    trials = batch_roles(roles, configs_per_trial=4)
    assert [len(t["configs"]) for t in trials] == [1, 1, 2, 4, 2, 4]
    assert _names(trials[2:4]) == [[(1, "temperature_scaling", None), (1, "vector_scaling", None)],
                                   [(1, "mac_cal", 0.3), (1, "mac_cal", 0.5), (1, "mac_cal", 0.7),
                                    (1, "histogram_binning_equal_mass", None)]]

    # up to 2: a population larger than a trial is cut into trials of 2
    trials = batch_roles(roles, configs_per_trial=2)
    assert _names(trials[2:6]) == [[(1, "temperature_scaling", None), (1, "vector_scaling", None)],
                                   [(1, "mac_cal", 0.3), (1, "mac_cal", 0.5)],
                                   [(1, "mac_cal", 0.7), (1, "histogram_binning_equal_mass", None)],
                                   [(2, "temperature_scaling", None), (2, "vector_scaling", None)]]

    # one a trial: every cached config alone, as before populations
    assert [len(t["configs"]) for t in batch_roles(roles, configs_per_trial=1)] == [1] * 14
