"""Report steps after the trials are stored never fail a study: partial, empty or degenerate results
give a partial table and one line saying what is missing; the exit code says whether trials failed.

No Ray here: the studies' report functions and the report builder run on rows written to a store.
"""

import dataclasses
import importlib.util
import math
from pathlib import Path

import pandas as pd
import pytest
from trial_fixtures import tiny_config

from calib.registries import STUDIES
from calib.report import report_step
from calib.report.build import FULL, build_report
from calib.store import read_trials, write_result
from calib.study.main import study_exit_code
from calib.study.rows import print_row_tables
from calib.trial import run_trial

ROOT = Path(__file__).resolve().parents[2]


def study_module(script: str):
    spec = importlib.util.spec_from_file_location(f"_report_study_{Path(script).stem}", ROOT / "studies" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One vanilla and one MaC-Cal (γ 0.9) trial of seed 1, as run_trial returns them (not stored)."""
    tmp = tmp_path_factory.mktemp("reports")
    vanilla = run_trial({**tiny_config(tmp, method={"name": "vanilla"}, study="sensitivity_gamma"),
                         "label": "vanilla", "label_rank": 0})
    mac = run_trial({**tiny_config(tmp, method={"name": "mac_cal", "accuracy_weight": 0.9},
                                   study="sensitivity_gamma"), "label": "MaC-Cal γ=0.9", "label_rank": 1})
    return vanilla, mac


def store_with(tmp_path: Path, *results) -> Path:
    store = tmp_path / "results"
    for result in results:
        write_result(store, result)
    return store


def test_gamma_study_with_every_mac_cal_trial_failed(results, tmp_path, capsys):
    """The issue's KeyError: 'method_accuracy_weight' from the γ figure when only vanilla finished."""
    vanilla, _ = results
    store = store_with(tmp_path, vanilla)
    trials = read_trials(store, study="sensitivity_gamma")
    study_module("sensitivity_gamma.py").print_report(
        trials, study="sensitivity_gamma", store=str(store), figures=tmp_path / "figures", gammas=[0.8, 0.9])
    out = capsys.readouterr().out
    assert "| Vanilla | – | 1 |" in out
    assert "no finished trial for: γ=0.8, γ=0.9" in out
    assert "[sensitivity_gamma] γ figure for digits-noisy · small_cnn not drawn: no MaC-Cal trial finished" in out
    assert not (tmp_path / "figures").exists()


def test_gamma_study_without_vanilla_and_with_nan_metrics(results, tmp_path, capsys):
    _, mac = results
    broken = dataclasses.replace(mac, metrics={**mac.metrics, "test_ece": math.nan})
    store = store_with(tmp_path, broken)
    trials = read_trials(store, study="sensitivity_gamma")
    study_module("sensitivity_gamma.py").print_report(
        trials, study="sensitivity_gamma", store=str(store), figures=tmp_path / "figures", gammas=[0.9])
    out = capsys.readouterr().out
    assert "| MaC-Cal | 0.9 | 1 | – |" in out  # no ECE to show, the other metrics are there
    assert "no finished trial for: Vanilla" in out
    assert (tmp_path / "figures" / "sensitivity_gamma_digits-noisy_small_cnn.png").exists()


def test_row_tables_name_the_rows_without_a_finished_trial(results, capsys):
    vanilla, _ = results
    trials = pd.DataFrame([{"dataset": "digits-noisy", "arch": "small_cnn", "label": "Vanilla (CE)",
                            **vanilla.metrics}])
    trials["row"] = pd.Categorical(trials["label"], categories=["Vanilla (CE)", "TST", "MaC-Cal"], ordered=True)
    print_row_tables(trials, {"test_ece": "ECE", "test_accuracy": "Acc"}, study="compare_methods")
    out = capsys.readouterr().out
    assert "| Vanilla (CE) | 1 |" in out and "no finished trial for: TST, MaC-Cal" in out
    print_row_tables(trials.iloc[:0], {"test_ece": "ECE"}, study="compare_methods")  # nothing finished
    assert capsys.readouterr().out == ""


def test_report_from_a_degenerate_store(results, tmp_path):
    """Only vanilla in the γ study, and reliability bins of two different lengths: the tables are
    written, the figures that cannot be made are named in one line each."""
    vanilla, mac = results
    other_bins = dataclasses.replace(
        vanilla, trial_id="0" * 16,
        details={**vanilla.details, "test_bin_count": vanilla.details["test_bin_count"][:5]})
    store = store_with(tmp_path, vanilla, other_bins)
    lines: list[str] = []
    written = build_report(store, tmp_path / "report", log=lines.append)
    names = sorted(p.name for p in written)
    assert names == ["sensitivity_gamma_digits-noisy_small_cnn.md", "sensitivity_gamma_digits-noisy_small_cnn.tex"]
    assert "[sensitivity_gamma] γ figure of digits-noisy · small_cnn not drawn: no MaC-Cal trial in the store" in lines
    assert any(line.startswith("[sensitivity_gamma] reliability diagram of digits-noisy · small_cnn not made: "
                               "ValueError") for line in lines), lines
    assert "sensitivity_gamma · digits-noisy · small_cnn: 1 rows, 2 trials" in lines
    # the same store with the MaC-Cal trial added draws every figure
    write_result(store, mac)
    (tmp_path / "report").rename(tmp_path / "old")
    fixed = build_report(store, tmp_path / "report", log=lambda line: None)
    assert {p.name for p in fixed} >= {"sensitivity_gamma_digits-noisy_small_cnn_gamma.png"}


def test_the_report_writes_the_columns_the_study_declares(results, tmp_path):
    """The γ study's report table has the headers its script prints (its declaration's, ECE (%) first), and its
    declared figure; the columns of a study nobody declares are the full table's."""
    vanilla, mac = results
    store = store_with(tmp_path, vanilla, mac, dataclasses.replace(
        vanilla, trial_id="1" * 16, config=dataclasses.replace(vanilla.config, study="undeclared")))
    written = build_report(store, tmp_path / "report", log=lambda line: None)
    declared = STUDIES.get("sensitivity_gamma").metrics
    md = (tmp_path / "report" / "tables" / "sensitivity_gamma_digits-noisy_small_cnn.md").read_text().splitlines()
    assert md[2] == "| row | n | ECE (%) | Acc (%) | AECE (%) | MCE (%) |"
    assert md[2] == f"| row | n | {' | '.join(declared.values())} |"
    assert tmp_path / "report" / "figures" / "sensitivity_gamma_digits-noisy_small_cnn_gamma.png" in written
    other = (tmp_path / "report" / "tables" / "undeclared_digits-noisy_small_cnn.md").read_text().splitlines()
    assert other[2] == f"| row | n | {' | '.join(FULL.values())} |"
    assert not any("undeclared_digits-noisy_small_cnn_" in p.name for p in written if p.suffix == ".png"
                   and not p.name.endswith("_reliability.png"))


def test_report_of_an_empty_store(tmp_path):
    lines: list[str] = []
    assert build_report(tmp_path / "nothing", tmp_path / "report", log=lines.append) == []
    assert "skipped sensitivity_gamma: not in the store (run: python studies/sensitivity_gamma.py --store " \
           f"{tmp_path / 'nothing'})" in lines


def test_a_report_step_that_raises_is_one_line(capsys, monkeypatch):
    with report_step("demo", "the figure"):
        raise KeyError("method_accuracy_weight")
    assert capsys.readouterr().out == "[demo] the figure not made: KeyError: 'method_accuracy_weight'\n"
    monkeypatch.setenv("CALIB_DEBUG", "1")
    with report_step("demo", "the figure"):
        raise ValueError("two\nlines")
    captured = capsys.readouterr()
    assert captured.out == "[demo] the figure not made: ValueError: two\n"
    assert "Traceback" in captured.err


def test_exit_code_says_whether_trials_failed(capsys):
    assert study_exit_code("demo", "/s", failed=0, finished=3) == 0
    assert capsys.readouterr().out == ""
    assert study_exit_code("demo", "/s", failed=2, finished=3) == 1
    out = capsys.readouterr().out
    assert out.startswith("[demo] 2 trials failed; their errors: python -c ")
    assert "pd.read_parquet('/s/trials', filters=[('status', '==', 'failed')])" in out
    assert study_exit_code("demo", "/s", failed=0, finished=0) == 1
    assert capsys.readouterr().out == "[demo] no finished trial in the store\n"
