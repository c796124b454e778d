"""From a search to a table: a replicated search stores each replicate as a row with its Optuna trial's number and
tells Optuna their aggregate; its importances, plots and progress line are on that aggregate, one point per Optuna
trial; it writes its choice as a row file that compare_methods.py runs as a row (the same config); --confirm runs it
on seeds the search never used, marked against the default row; --check-only on it changes nothing; a bad row file
exits 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest
import yaml
from in_process import run_refused, run_study, study_module

from calib.search.journal import optuna_storage
from calib.store import read_trials

ROOT = Path(__file__).resolve().parents[2]
HEAD_SPACE = ROOT / "search_spaces" / "mac_cal_head.yaml"
STUDY = "search_mac_cal_head"
TINY = ["--epochs", "2", "--stage2-epochs", "2"]
SEARCH = ["--space", str(HEAD_SPACE), "--replicates", "2", "--num-trials", "3", "--confirm", "2", "--seeds", "1", "2",
          "3", *TINY]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    store = tmp_path_factory.mktemp("search_rows") / "results"
    out = run_study("search.py", *SEARCH, "--store", str(store))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return store, out


@pytest.mark.ray
def test_each_optuna_trial_stores_its_replicates_and_is_told_their_mean(searched):
    store, _ = searched
    rows = read_trials(str(store), study=STUDY)
    assert (rows["status"] == "ok").all() and rows.groupby("search_trial").size().tolist() == [2, 2, 2]
    assert all(sorted(group) == [1, 2] for _, group in rows.groupby("search_trial")["seed"])
    assert (rows["population_size"] > 1).any()  # the replicates of several trials trained together
    study = optuna.load_study(study_name=STUDY, storage=optuna_storage(str(store), STUDY))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 3
    for trial in complete:
        replicate_values = rows.loc[rows["search_trial"] == trial.number, "val_ece"].tolist()
        assert trial.value == pytest.approx(sum(replicate_values) / 2, abs=1e-12)


@pytest.mark.ray
def test_the_row_file_is_the_chosen_config_in_compare_methods(searched):
    store, out = searched
    row_file = store / "rows" / f"{STUDY}.yaml"
    assert f"as a table row: {row_file}" in out.stdout
    written = yaml.safe_load(row_file.read_text())
    rows = read_trials(str(store), study=STUDY)
    best = min((t for t in optuna.load_study(study_name=STUDY, storage=optuna_storage(str(store), STUDY)).trials
                if t.value is not None), key=lambda t: (t.value, t.number))
    assert written["search"]["search_trial"] == best.number
    chosen = json.loads(rows.loc[rows["trial_id"] == best.user_attrs["calib_trial_id"], "config_json"].item())
    table = run_study("compare_methods.py", "--row", str(row_file), "--methods", "MaC-Cal", "--seeds", "4", "5",
                      "--store", str(store), *TINY)
    assert table.returncode == 0, table.stdout[-3000:] + table.stderr[-3000:]
    assert f"| {written['label']} | 2 |" in table.stdout
    # 2 seeds with kept predictions: the policy's two-level bootstrap, against the tuned row's default row
    assert "significantly better / worse than MaC-Cal by a paired bootstrap over the 2 seeds and the" in table.stdout
    compared = read_trials(str(store), study="compare_methods")
    tuned = compared[compared["label"] == written["label"]]
    assert sorted(tuned["seed"]) == [4, 5]
    for config_json in tuned["config_json"]:
        config = json.loads(config_json)
        assert config["method"] == chosen["method"] and config["stage1"] == chosen["stage1"]


@pytest.mark.ray
def test_confirm_runs_on_seeds_the_search_never_used(searched):
    store, out = searched
    confirmed = read_trials(str(store), study=f"{STUDY}_confirm")
    searched_seeds = set(read_trials(str(store), study=STUDY)["seed"])
    assert searched_seeds == {1, 2} and sorted(set(confirmed["seed"])) == [3, 4]
    assert "confirming on 2 fresh seeds 3 4 (the search used 1 2)" in out.stdout
    label = yaml.safe_load((store / "rows" / f"{STUDY}.yaml").read_text())["label"]
    assert set(confirmed["label"]) == {"MaC-Cal", label}
    assert "significantly better / worse than MaC-Cal by a paired bootstrap over the 2 seeds and the" in out.stdout


def complete_trials(store: Path) -> list:
    opened = optuna.load_study(study_name=STUDY, storage=optuna_storage(str(store), STUDY))
    return [t for t in opened.trials if t.state == optuna.trial.TrialState.COMPLETE]


@pytest.mark.ray
def test_importances_are_counted_on_optuna_trials_and_equal_optunas(searched):
    store, _ = searched
    table = (store / "report" / f"{STUDY}_importances.md").read_text()
    assert table.startswith("fANOVA importance of each parameter for val_ece (3 trials, each the mean of 2 "
                            "replicates)"), table
    ours = {key: float(value) for key, value in re.findall(r"^\| (\S+) \| ([0-9.]+) \|$", table, re.M)}
    assert ours and abs(sum(ours.values()) - 1) < 5e-3
    opened = optuna.load_study(study_name=STUDY, storage=optuna_storage(str(store), STUDY))
    optunas = optuna.importance.get_param_importances(
        opened, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0), params=list(ours))
    assert ours == pytest.approx(optunas, abs=5e-4)  # the table's 3 decimals
    assert (store / "report" / f"{STUDY}_history.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.ray
def test_the_progress_best_is_the_objective(searched):
    store, out = searched
    best = min(complete_trials(store), key=lambda t: (t.value, t.number))
    lines = [line for line in out.stdout.splitlines() if line.startswith(f"[{STUDY}] ") and "done ·" in line]
    shown = [m.group(1) for line in lines if (m := re.search(r"best val_ece (\S+) \(", line))]
    assert shown and all(not re.search(r"best val_ece \S+ \((?!trial #)", line) for line in lines)
    assert f"best val_ece {best.value:.2%} (trial #{best.number}, 2 replicates)" in lines[-1], lines[-1]
    assert set(shown) <= {f"{t.value:.2%}" for t in complete_trials(store)}  # never one replicate's value


@pytest.mark.ray
def test_check_only_on_a_searched_store_changes_nothing(searched, monkeypatch, capsys):
    import calib.run.skeleton as skeleton  # where every grid and search starts Ray (TuneRun.fit)

    store, _ = searched
    before = {p: p.stat().st_mtime_ns for p in store.rglob("*")}
    monkeypatch.setattr(skeleton, "init_ray", lambda *a, **k: pytest.fail("Ray was started"))
    capsys.readouterr()
    assert study_module("search.py").main([*SEARCH, "--store", str(store), "--check-only"]) == 0
    out = capsys.readouterr().out
    assert f"[{STUDY}] 3 trials × 2 replicates: 3 already in the store, 0 to run (0 replicate trials)" in out
    assert {p: p.stat().st_mtime_ns for p in store.rglob("*")} == before


@pytest.mark.parametrize(("text", "message"), [
    ("- a list\n", "a row file is a YAML mapping"),
    ("label: x\nmethod: {name: mac_cal}\nrows: 3\n", "unknown key(s) rows"),
    ("label: x\nmethod: {name: mac_cal, clip_inti: 0.1}\n", "clip_inti"),
    ("label: x\nmethod: {name: mac_call}\n", "mac_call"),
    ("method: {name: mac_cal}\n", "the file has no `label`"),
])
def test_a_bad_row_file_exits_2_with_one_line(tmp_path, monkeypatch, capsys, text, message):
    bad = tmp_path / "row.yaml"
    bad.write_text(text)
    store = tmp_path / "results"
    code, stderr = run_refused("compare_methods.py", ["--row", str(bad), "--store", str(store)], monkeypatch, capsys)
    assert code == 2 and message in stderr and "Traceback" not in stderr, stderr
    assert len([line for line in stderr.splitlines() if "error:" in line]) == 1
    assert not store.exists()
