"""The search protocol's flags: ``--check-only`` writes nothing (no journal, no folder) and counts the replicate and
confirm trials; ``--per-setup`` tunes each setup on its own, one row file each recording the seeds it was tuned on
and the configs tried; ``--confirm-against`` adds baseline rows to the confirm table. (A replicated search's
importances, plots and progress line: tests/studies/test_search_rows.py.)"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from in_process import run_study, study_module

from calib.search.journal import optuna_storage
from calib.store import read_trials
from calib.store.predictions import kept_predictions_note

ROOT = Path(__file__).resolve().parents[2]
HEAD_SPACE = str(ROOT / "search_spaces" / "mac_cal_head.yaml")
TINY = ["--epochs", "2", "--stage2-epochs", "2"]
SETUPS = {"digits": "search_mac_cal_head_digits_small_cnn",
          "digits-noisy": "search_mac_cal_head_digits-noisy_small_cnn"}
SEARCH = ["--space", HEAD_SPACE, "--per-setup", "--datasets", "digits", "digits-noisy", "--num-trials", "2",
          "--confirm", "2", "--confirm-against", "CE+TS", "--seeds", "1", "2", "3", *TINY]


def check_only(argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """``search.py ARGV --check-only`` in this process: exit code and stdout (Ray never starts)."""
    import calib.run.skeleton as skeleton  # where every grid and search starts Ray (TuneRun.fit)

    monkeypatch.setattr(skeleton, "init_ray", lambda *a, **k: pytest.fail("Ray was started"))
    capsys.readouterr()
    code = study_module("search.py").main([*argv, "--check-only"])
    return code, capsys.readouterr().out


def test_check_only_counts_replicates_and_confirm_trials_and_writes_nothing(tmp_path, monkeypatch, capsys):
    store = tmp_path / "results"
    code, out = check_only(["--space", HEAD_SPACE, "--replicates", "2", "--num-trials", "4", "--confirm", "3",
                            "--confirm-against", "CE+TS", "--seeds", "1", "2", "3", "--store", str(store), *TINY],
                           monkeypatch, capsys)
    assert code == 0, out
    # 4 Optuna trials × 2 replicates, then the chosen config, MaC-Cal and CE+TS on 3 fresh seeds
    assert ("[search_mac_cal_head] checked: 17 trials to run (4 Optuna trials × 2 replicates, then at most 9 "
            "confirm trials: 3 rows × 3 seeds × 1 setup); nothing was started (--check-only)") in out
    assert "4 trials × 2 replicates: 0 already in the store, 4 to run (8 replicate trials)" in out
    assert kept_predictions_note([{"dataset": "digits-noisy"}] * 17, "on") in out  # the predictions of all 17
    assert not store.exists()  # no journal, no folder: a later run with other --replicates is not refused
    code, out = check_only(["--space", HEAD_SPACE, "--replicates", "3", "--num-trials", "4", "--seeds", "1", "2", "3",
                            "--store", str(store), *TINY], monkeypatch, capsys)
    assert code == 0 and "checked: 12 trials to run (4 Optuna trials × 3 replicates)" in out, out
    assert not store.exists()


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    store = tmp_path_factory.mktemp("search_protocol") / "results"
    out = run_study("search.py", *SEARCH, "--store", str(store))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return store, out.stdout


def complete_trials(store: Path, study: str) -> list:
    opened = optuna.load_study(study_name=study, storage=optuna_storage(str(store), study))
    return [t for t in opened.trials if t.state == optuna.trial.TrialState.COMPLETE]


@pytest.mark.ray
def test_per_setup_writes_one_row_file_per_setup_tuned_on_its_own_setup(searched):
    store, _ = searched
    for dataset, study in SETUPS.items():
        rows = read_trials(str(store), study=study)
        assert set(rows["dataset"]) == {dataset} and set(rows["seed"]) == {1} and len(rows) == 2
        written = yaml.safe_load((store / "rows" / f"{study}.yaml").read_text())
        assert written["tuning_seeds"] == [1] and written["configs_tried"] == 2
        best = min(complete_trials(store, study), key=lambda t: (t.value, t.number))
        assert written["search"]["search_trial"] == best.number
        assert written["search"]["trial_ids"] == [best.user_attrs["calib_trial_id"]]
        assert rows.loc[rows["trial_id"] == best.user_attrs["calib_trial_id"], "val_ece"].item() == best.value
        assert written["search"]["replicates"] == [[dataset, "small_cnn", 1]]
    assert not list((store / "rows").glob("search_mac_cal_head.yaml"))


@pytest.mark.ray
def test_confirm_against_adds_the_baseline_rows_to_the_confirm_table(searched):
    store, out = searched
    for dataset, study in SETUPS.items():
        confirmed = read_trials(str(store), study=f"{study}_confirm")
        label = yaml.safe_load((store / "rows" / f"{study}.yaml").read_text())["label"]
        assert set(confirmed["label"]) == {"MaC-Cal", "CE+TS", label}
        assert set(confirmed["dataset"]) == {dataset} and sorted(set(confirmed["seed"])) == [2, 3]
        assert f"[{study}] confirming on 2 fresh seeds 2 3 (the search used 1) beside MaC-Cal at its defaults " \
               f"and CE+TS: study {study}_confirm" in out
    assert out.count("| CE+TS | 2 |") == 2
