"""``stage2_seed``: Stage II draws from a seed of its own, so one trained Stage I serves trials whose masks, heads and
minibatch orders differ; equal seeds reproduce a trial bit for bit, alone or in a population."""

from __future__ import annotations

import pytest
from trial_fixtures import tiny_config

from calib.config import parse_trial_config
from calib.store.parquet import trial_row
from calib.trial import run_trial, run_trials


def _metrics(result):
    return {k: v for k, v in result.metrics.items() if k.startswith(("val_", "test_"))}


@pytest.fixture(scope="module")
def mac_cal_trials(tmp_path_factory):
    """The MaC-Cal trial of seed 1 with Stage-II seeds 1 (the default), 5, and 5 again; then 1 and 5 as one
    population."""
    root = tmp_path_factory.mktemp("stage2_seed")
    default = tiny_config(root)
    seeded = {**default, "stage2_seed": 5}
    return {"default": run_trial(default), "five": run_trial(seeded), "five_again": run_trial(seeded),
            "population": run_trials([default, seeded])}


def test_another_stage2_seed_reuses_stage1_and_draws_another_stage2(mac_cal_trials):
    default, five = mac_cal_trials["default"], mac_cal_trials["five"]
    assert default.status == five.status == "ok"
    assert default.stage1_id == five.stage1_id, "Stage I does not depend on the Stage-II seed"
    assert not default.stage1_cache_hit and five.stage1_cache_hit, "trained once, by the first trial"
    assert default.trial_id != five.trial_id
    assert _metrics(default) != _metrics(five), "MaC-Cal's masks and head draw from stage2_seed"
    assert trial_row(default)["stage2_seed"] == 1 and trial_row(five)["stage2_seed"] == 5
    assert trial_row(five)["seed"] == 1


def test_equal_stage2_seeds_reproduce_bit_for_bit(mac_cal_trials):
    five, again = mac_cal_trials["five"], mac_cal_trials["five_again"]
    assert _metrics(five) == _metrics(again) and five.trial_id == again.trial_id
    assert [h for h in five.history if h["stage"] == "stage2"] == [h for h in again.history if h["stage"] == "stage2"]


def test_a_population_gives_each_member_its_own_stage2_seed(mac_cal_trials):
    together = {r.trial_id: r for r in mac_cal_trials["population"]}
    for alone in (mac_cal_trials["default"], mac_cal_trials["five"]):
        member = together[alone.trial_id]
        assert member.population_size == 2
        for key, value in _metrics(alone).items():
            assert member.metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_the_trial_config_says_which_seed_stage2_used(tmp_path):
    assert parse_trial_config(tiny_config(tmp_path, seed=3)).stage2_seed == 3
    assert parse_trial_config({**tiny_config(tmp_path, seed=3), "stage2_seed": 9}).stage2_seed == 9
