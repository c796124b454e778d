"""A row file records the seeds its config was tuned on and how many configs were tried; every study that takes
``--row`` refuses to run it on any of those seeds (exit 2 naming them, before anything runs or is written) unless
``--allow-tuning-seeds``; a file written before the seeds were recorded still runs, with a note."""

from __future__ import annotations

import pytest
import yaml
from in_process import run_refused, study_module

from calib.study.row import Row
from calib.study.row_file import tuning_seeds, write_row_file

ROW = Row(method={"name": "mac_cal", "accuracy_weight": 0.9})
TABLE_STUDIES = ["compare_methods.py", "combine.py", "ablation.py", "ood.py", "corruption.py", "decompose.py"]


def row_file(tmp_path, seeds=(2, 1), tried=4):
    return write_row_file(tmp_path / "rows" / "tuned.yaml", "MaC-Cal (tuned)", ROW, {"study": "s"},
                          tuning_seeds=seeds, configs_tried=tried)


def checked(script: str, argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """``--check-only`` of a study that must accept its input: exit code and stdout (Ray never starts)."""
    import calib.run.skeleton as skeleton  # where every grid and search starts Ray (TuneRun.fit)

    monkeypatch.setattr(skeleton, "init_ray", lambda *a, **k: pytest.fail("Ray was started"))
    capsys.readouterr()
    code = study_module(script).main([*argv, "--check-only"])
    return code, capsys.readouterr().out


def test_the_file_records_its_tuning_seeds_and_configs_tried(tmp_path):
    path = row_file(tmp_path)
    written = yaml.safe_load(path.read_text())
    assert written["tuning_seeds"] == [1, 2] and written["configs_tried"] == 4
    assert tuning_seeds(str(path)) == [1, 2]


@pytest.mark.parametrize("script", TABLE_STUDIES)
def test_a_run_on_a_tuning_seed_is_refused_naming_them(tmp_path, monkeypatch, capsys, script):
    path, store = row_file(tmp_path), tmp_path / "results"
    code, stderr = run_refused(script, ["--row", str(path), "--seeds", "1", "2", "3", "--store", str(store)],
                               monkeypatch, capsys)
    assert code == 2 and "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if "error:" in line] == [
        f"error: --row {path} was tuned on seeds 1 2, and this run's seeds include 1 2: a row scored on the seeds "
        f"it was tuned on looks better than it is. Give --seeds without them, or --allow-tuning-seeds to run it "
        f"there anyway."]
    assert not store.exists()


def test_the_preset_seeds_count_too_and_other_seeds_pass(tmp_path, monkeypatch, capsys):
    path, store = row_file(tmp_path, seeds=[3]), tmp_path / "results"
    code, stderr = run_refused("compare_methods.py", ["--row", str(path), "--methods", "MaC-Cal", "--store",
                                                      str(store)], monkeypatch, capsys)
    assert code == 2 and "include 3:" in stderr  # the quick preset's seeds of compare_methods are 1-3
    code, out = checked("compare_methods.py", ["--row", str(path), "--methods", "MaC-Cal", "--seeds", "1", "2",
                                               "--store", str(store), "--epochs", "2", "--stage2-epochs", "2"],
                        monkeypatch, capsys)
    assert code == 0 and "[compare_methods] checked: 4 trials to run" in out, out


def test_allow_tuning_seeds_runs_it_there(tmp_path, monkeypatch, capsys):
    path = row_file(tmp_path)
    code, out = checked("compare_methods.py", ["--row", str(path), "--methods", "MaC-Cal", "--seeds", "1", "2", "3",
                                               "--allow-tuning-seeds", "--store", str(tmp_path / "results"),
                                               "--epochs", "2", "--stage2-epochs", "2"], monkeypatch, capsys)
    assert code == 0 and "[compare_methods] checked: 6 trials to run" in out, out


def test_an_old_file_without_tuning_seeds_runs_with_a_note(tmp_path, monkeypatch, capsys):
    path = tmp_path / "old.yaml"
    path.write_text("label: MaC-Cal (old search)\nmethod: {name: mac_cal, accuracy_weight: 0.9}\n"
                    "search: {study: s, search_trial: 3}\n")
    assert tuning_seeds(str(path)) is None
    code, out = checked("compare_methods.py", ["--row", str(path), "--methods", "MaC-Cal", "--seeds", "1",
                                               "--store", str(tmp_path / "results"), "--epochs", "2",
                                               "--stage2-epochs", "2"], monkeypatch, capsys)
    assert code == 0 and "checked: 2 trials to run" in out, out
    notes = [line for line in out.splitlines() if "records no tuning seeds" in line]
    assert notes == [f"[compare_methods] note: --row {path} records no tuning seeds (written before row files did), "
                     f"so nothing checks that --seeds 1 are not the ones it was tuned on"]


def test_bad_tuning_seeds_exit_2(tmp_path, monkeypatch, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("label: x\nmethod: {name: mac_cal}\ntuning_seeds: [1, two]\n")
    code, stderr = run_refused("compare_methods.py", ["--row", str(path), "--seeds", "3"], monkeypatch, capsys)
    assert code == 2 and "`tuning_seeds` must be a list of integer seeds, got [1, 'two']" in stderr

