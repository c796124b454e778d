"""Searches that resume and extend from the store, with the Optuna study persisted in it."""

from __future__ import annotations

from pathlib import Path

import optuna
import pandas as pd
import pytest
from trial_fixtures import tiny_config

from calib.config import set_dotted
from calib.run import ExecutionOptions
from calib.search import SchedulerSettings, journal, load_search_space, run_search
from calib.search.journal import ObjectStoreJournalBackend, export_journal, journal_location, optuna_storage
from calib.search.optimize import resumed_seed, stage1_parameters
from calib.store import read_trials

pytestmark = pytest.mark.ray  # its searches run their trials on a local Ray

ROOT = Path(__file__).resolve().parents[2]
HEAD_SPACE = ROOT / "search_spaces" / "mac_cal_head.yaml"
STUDY = "resume"
QUIET = ExecutionOptions(verbose=False)


def search(tmp: Path, num_trials: int, **kwargs):
    base = tiny_config(tmp, study=STUDY, stage2_epochs=2)
    return run_search(base, load_search_space(HEAD_SPACE), store=str(tmp / "store"), study=STUDY,
                      num_trials=num_trials, options=kwargs.pop("options", QUIET), **kwargs)


def load(tmp: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=optuna_storage(str(tmp / "store"), STUDY))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """4 trials; then a killed driver's leftovers (2 asked, never told); then a re-run to 6. Every run
    leaves a journal snapshot (each is due), so the re-run and ``load`` restore one and replay what follows."""
    tmp = tmp_path_factory.mktemp("search")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(journal, "SNAPSHOT_EVERY", 1)
        first = search(tmp, 4)
        study = load(tmp)
        space = load_search_space(HEAD_SPACE).optuna_space()
        for _ in range(2):
            study.ask(fixed_distributions=space)  # RUNNING forever: what a kill leaves
        before = [t for t in load(tmp).trials]
        second = search(tmp, 6)
    return tmp, first, before, second


def test_resumed_search_runs_only_the_missing_trials(resumed):
    tmp, first, _, second = resumed
    rows = read_trials(str(tmp / "store"), study=STUDY)
    assert len(first.trial_ids) == 4 and len(second.trial_ids) == 6
    assert (rows["status"] == "ok").sum() == 6 and rows["trial_id"].is_unique
    assert set(first.trial_ids) < set(second.trial_ids)
    assert optuna_storage(str(tmp / "store"), STUDY).restored_logs > 0  # the re-run left a snapshot


def test_killed_asks_fail_and_every_stored_trial_is_in_the_optuna_study(resumed):
    tmp, *_ = resumed
    study = load(tmp)
    states = [t.state for t in study.trials]
    assert states[4:6] == [optuna.trial.TrialState.FAIL] * 2  # the killed driver's asks
    complete = {t.user_attrs["calib_trial_id"]: t.value for t in study.trials
                if t.state == optuna.trial.TrialState.COMPLETE}
    rows = read_trials(str(tmp / "store"), study=STUDY).set_index("trial_id")
    assert set(complete) == set(rows.index)
    for calib_id, value in complete.items():
        assert value == pytest.approx(rows.loc[calib_id, "val_ece"], abs=1e-12)


def test_first_new_proposal_is_conditioned_on_the_stored_trials(resumed):
    # Replay: a fresh study holding exactly the trials the re-run started from, and the re-run's sampler
    # seed, proposes what the re-run proposed first.
    tmp, _, before, _ = resumed
    space = load_search_space(HEAD_SPACE).optuna_space()
    history = [t.user_attrs.get("calib_trial_id", "") for t in before]
    replay = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=resumed_seed(0, history),
                                                                    constant_liar=True))
    for trial in before:
        state = trial.state if trial.state != optuna.trial.TrialState.RUNNING else optuna.trial.TrialState.FAIL
        replay.add_trial(optuna.trial.create_trial(params=trial.params, distributions=trial.distributions,
                                                   value=trial.value if state.is_finished() and trial.value
                                                   is not None else None, state=state))
    proposal = replay.ask(fixed_distributions=space).params
    first_new = load(tmp).trials[len(before)]
    assert first_new.params == proposal
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in before) == 4


def test_extending_adds_the_difference_and_a_lost_journal_is_rebuilt_from_the_store(resumed):
    tmp, *_ = resumed
    Path(journal_location(str(tmp / "store"), STUDY)).unlink()
    again = search(tmp, 6)
    study = load(tmp)
    assert len(again.trial_ids) == 6 and len(study.trials) == 6  # told from the store, nothing ran
    rows = read_trials(str(tmp / "store"), study=STUDY).set_index("trial_id")
    assert {t.user_attrs["calib_trial_id"]: t.value for t in study.trials} == pytest.approx(
        rows["val_ece"].to_dict(), abs=1e-12)
    assert len(search(tmp, 8).trial_ids) == 8


def test_head_space_leaves_stage1_alone_and_mixup_does_not(tmp_path):
    base = tiny_config(tmp_path)
    assert stage1_parameters(base, load_search_space(HEAD_SPACE)) == []
    assert stage1_parameters(set_dotted(base, "method", {"name": "vanilla"}),
                             load_search_space(ROOT / "search_spaces" / "mixup.yaml")) == ["stage1.mixup_alpha"]


def test_asha_prunes_stage1_trials_and_a_rerun_counts_them(tmp_path):
    base = tiny_config(tmp_path, study="asha", epochs=6, method={"name": "vanilla"})
    space = load_search_space(ROOT / "search_spaces" / "mixup.yaml")
    options = ExecutionOptions(verbose=False, max_concurrent=1, configs_per_trial=1)
    scheduler = SchedulerSettings("asha", grace_period=1, reduction_factor=4)
    store = str(tmp_path / "store")
    run_search(base, space, store=store, study="asha", num_trials=5, options=options, scheduler=scheduler)
    rows = read_trials(store, study="asha")
    pruned = rows[rows["status"] == "pruned"]
    assert len(rows) == 5 and len(pruned) >= 1 and set(rows["status"]) <= {"ok", "pruned"}
    assert pruned["pruned_epoch"].between(0, 4).all() and pruned["val_ece"].notna().all()
    study = optuna.load_study(study_name="asha", storage=optuna_storage(store, "asha"))
    by_state = {t.user_attrs["calib_trial_id"]: t.state.name for t in study.trials}
    assert by_state == {r.trial_id: {"ok": "COMPLETE", "pruned": "PRUNED"}[r.status] for r in rows.itertuples()}
    rerun = run_search(base, space, store=store, study="asha", num_trials=5, options=options, scheduler=scheduler)
    assert rerun.skipped == 5 and len(read_trials(store, study="asha")) == 5


def test_hyperband_search_stores_every_trial_once(tmp_path):
    base = tiny_config(tmp_path, study="hb", epochs=6, method={"name": "vanilla"})
    space = load_search_space(ROOT / "search_spaces" / "mixup.yaml")
    store = str(tmp_path / "store")
    run_search(base, space, store=store, study="hb", num_trials=4, options=ExecutionOptions(
        verbose=False, max_concurrent=2, configs_per_trial=1), scheduler=SchedulerSettings("hyperband"))
    rows = read_trials(store, study="hb")
    assert len(rows) == 4 and rows["trial_id"].is_unique and set(rows["status"]) <= {"ok", "pruned"}
    study = optuna.load_study(study_name="hb", storage=optuna_storage(store, "hb"))
    assert {t.user_attrs["calib_trial_id"]: t.state.name for t in study.trials} == {
        r.trial_id: {"ok": "COMPLETE", "pruned": "PRUNED"}[r.status] for r in rows.itertuples()}


def test_a_finite_space_runs_each_config_once(tmp_path):
    base = tiny_config(tmp_path, study="grid", stage2_epochs=1)
    space = tmp_path / "space.yaml"
    space.write_text("base: {method.name: mac_cal}\nparameters:\n"
                     "  method.accuracy_weight: {distribution: categorical, choices: [0.9, 1.0]}\n")
    store = str(tmp_path / "store")
    run = run_search(base, load_search_space(space), store=store, study="grid", num_trials=5, options=QUIET)
    assert len(run.trial_ids) == 2 and len(read_trials(store, study="grid")) == 2


def test_scheduler_refuses_objectives_stage1_does_not_report(tmp_path):
    from calib._config import ConfigError

    base = tiny_config(tmp_path, method={"name": "vanilla"})
    with pytest.raises(ConfigError, match="val_ece, val_accuracy; got --objective val_nll"):
        run_search(base, load_search_space(ROOT / "search_spaces" / "mixup.yaml"), store=str(tmp_path / "s"),
                   study="x", num_trials=1, objectives=["val_nll"], options=QUIET,
                   scheduler=SchedulerSettings("asha"))
    with pytest.raises(ConfigError, match="'val_nll_calibration' is a calibration-error estimate that is best at 0"):
        run_search(base, load_search_space(ROOT / "search_spaces" / "mixup.yaml"), store=str(tmp_path / "s"),
                   study="x", num_trials=1, objectives=["val_nll_calibration"], options=QUIET)
    assert not (tmp_path / "s").exists()
    with pytest.raises(ConfigError, match="must be one of none, asha, hyperband"):
        SchedulerSettings("median")


def test_object_store_journal_round_trip(s3, tmp_path):
    bucket, _ = s3
    store = f"s3://{bucket}/results"
    study = optuna.create_study(study_name="j", storage=optuna_storage(store, "j"))
    study.optimize(lambda t: (t.suggest_float("x", -1, 1) - 0.5) ** 2, n_trials=3)
    again = optuna.load_study(study_name="j", storage=optuna_storage(store, "j"))
    assert [t.value for t in again.trials] == [t.value for t in study.trials]
    logs = list(ObjectStoreJournalBackend(journal_location(store, "j")).read_logs(0))
    assert logs and pd.Series([log["op_code"] for log in logs]).notna().all()
    exported = export_journal(store, "j", tmp_path / "j.journal")
    local = optuna.load_study(study_name="j", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(exported))))
    assert [t.value for t in local.trials] == [t.value for t in study.trials]


def test_a_proposal_of_a_stored_config_is_not_run_again():
    from optuna.distributions import FloatDistribution

    from calib.search.searcher import PopulationSearcher

    space = {"x": FloatDistribution(0.0, 1.0)}
    first = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3)).ask(space).params
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    searcher = PopulationSearcher(study, space, objectives=["val_ece"], modes=["min"], budget=2, configs_per_trial=2,
                                  calib_id_of=lambda p: f"{p['x']:.12f}", stored={f"{first['x']:.12f}"})
    population = searcher.suggest("t1")["population"]
    assert len(population) == 2 and first not in [m["params"] for m in population]
    assert study.trials[0].state == optuna.trial.TrialState.FAIL and study.trials[0].params == first
    assert study.trials[0].user_attrs["repeats_stored_trial"] is True
    assert searcher.suggest("t2") == "FINISHED"
