"""run_trials: configs on one Stage I trained as populations give their lone run_trial's numbers."""

from __future__ import annotations

import pytest

from calib.config import parse_trial_config, set_dotted
from calib.trial import population_groups, run_trial, run_trials


@pytest.fixture
def configs(make_config):
    base = make_config(stage2_epochs=4)
    mac_cal = [set_dotted(set_dotted(base, "method.accuracy_weight", gamma), "method.clip_init", theta)
               for gamma, theta in ((0.8, 0.05), (0.95, 0.2), (1.0, 0.01))]
    tst = [set_dotted(base, "method", {"name": "tst", "epochs": 3, "latent_dim": 16, "checkpoint": checkpoint})
           for checkpoint in ("last", "best_val_loss")]
    temperature = set_dotted(base, "method", {"name": "temperature_scaling"})
    return [*mac_cal, *tst, temperature]


def test_groups_follow_stage1_method_and_population_key(configs):
    parsed = [parse_trial_config(c) for c in configs]
    assert population_groups(parsed) == [[0, 1, 2], [3, 4], [5]]
    wider = parse_trial_config(set_dotted(configs[0], "method.bottleneck_width", 32))
    assert population_groups([*parsed[:3], wider]) == [[0, 1, 2], [3]]


def test_population_results_equal_lone_trials(configs):
    stored = []
    together = run_trials(configs, on_result=stored.append)
    assert [r.trial_id for r in stored] == [r.trial_id for r in together]
    assert [r.population_size for r in together] == [3, 3, 3, 2, 2, 1]
    for config, batched in zip(configs, together, strict=True):
        alone = run_trial(config)
        assert batched.status == "ok" and batched.trial_id == alone.trial_id
        assert batched.metrics.keys() == alone.metrics.keys()
        for name, value in alone.metrics.items():
            assert batched.metrics[name] == pytest.approx(value, abs=1e-5), name
        assert [r.get("retention_prob") for r in batched.history] == pytest.approx(
            [r.get("retention_prob") for r in alone.history], abs=1e-6)


def test_a_failing_config_fails_its_own_row(configs, monkeypatch):
    import calib.methods.tst as tst

    def broken(*args, **kwargs):
        raise RuntimeError("TST head exploded")

    monkeypatch.setattr(tst, "_initial_tst_head", broken)  # every TST member's head, built in its population
    results = run_trials(configs)
    assert [r.status for r in results] == ["ok", "ok", "ok", "failed", "failed", "ok"]
    assert "TST head exploded" in results[3].error and results[3].failed_stage == "stage2"


def test_a_rerun_population_skips_its_stored_configs(configs, tmp_path, monkeypatch):
    import json

    from calib.run import execution
    from calib.run.execution import ExecutionOptions, execute_population
    from calib.store import read_trials, write_result

    monkeypatch.setattr(execution, "_worker_threads", lambda: None)  # the worker's Ray context: none in this process

    store = str(tmp_path / "store")
    first = write_result(store, run_trial(configs[0]))
    mtime = (tmp_path / "store" / first.split("/store/", 1)[1]).stat().st_mtime_ns
    result = execute_population(configs[:3], store, ExecutionOptions(verbose=False))
    summaries = json.loads(result["calib_results"])
    assert [s["status"] for s in summaries] == ["ok"] * 3
    rows = read_trials(store, study="test")
    assert len(rows) == 3 and rows["trial_id"].is_unique
    assert (tmp_path / "store" / first.split("/store/", 1)[1]).stat().st_mtime_ns == mtime
    assert sorted(rows["population_size"]) == [1, 2, 2]  # the stored one ran alone; the rest together
