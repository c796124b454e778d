"""Kept predictions: written beside each row, compacted with it, through kills and concurrent writers; re-scored."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from in_process import run_report, run_study
from trial_copies import copy_of
from trial_fixtures import tiny_config

from calib.config import parse_trial_config, trial_id
from calib.store import compact, read_trials, write_result
from calib.store.__main__ import main as store_main
from calib.store.predictions import (
    encode_predictions,
    kept_predictions_note,
    predictions_file,
    read_predictions,
    stored_prediction_ids,
)
from calib.store.rescore import read_rescored
from calib.trial import TrialResult, run_trial

STUDY = "test"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> TrialResult:
    """One real temperature-scaling trial on digits-noisy (630 test, 269 val samples, 10 classes)."""
    return run_trial(parse_trial_config(tiny_config(tmp_path_factory.mktemp("base"),
                                                    method={"name": "temperature_scaling"})))


def own(store: Path, table: str = "predictions") -> list[str]:
    folder = store / table / f"study={STUDY}"
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(("part-", "."))) if folder.exists() else []


def test_a_trial_keeps_the_probabilities_its_metrics_were_computed_from(base: TrialResult, tmp_path: Path):
    assert base.predictions["test"]["probs"].shape == (630, 10) and base.predictions["val"]["probs"].shape == (269, 10)
    write_result(tmp_path, base, keep_predictions="on")
    kept = read_predictions(str(tmp_path), STUDY, [base.trial_id])[base.trial_id]
    assert kept["test"].precision == "float64"
    np.testing.assert_array_equal(kept["test"].probs, base.predictions["test"]["probs"])
    np.testing.assert_array_equal(kept["val"].labels, base.predictions["val"]["labels"])
    # a trial written without keeping predictions has none; the rows are the same either way
    other = copy_of(base, 1)
    write_result(tmp_path, other)
    assert stored_prediction_ids(str(tmp_path), STUDY) == {base.trial_id}
    assert read_predictions(str(tmp_path), STUDY, [other.trial_id]) == {}


def test_keeping_predictions_leaves_trial_ids_as_they_were(tmp_path: Path):
    """The choice is an execution option, not a config field: the id of a config is the one stores hold."""
    # the ids calib computed for these configs before kept predictions existed (commit 1851750's code)
    assert trial_id(tiny_config(tmp_path, method={"name": "temperature_scaling"})) == "30e55c2e613af750"
    assert trial_id(tiny_config(tmp_path, method={"name": "mac_cal"})) == "d178e7d3a6fb2cc2"


def test_compaction_moves_predictions_with_the_rows_and_reads_one_trial_alone(base: TrialResult, tmp_path: Path):
    results = [copy_of(base, i) for i in range(5)] + [copy_of(base, 5, status="failed")]
    for i, result in enumerate(results):
        write_result(tmp_path, result, keep_predictions=("on", "float32", "float16")[i % 3])
    assert len(own(tmp_path)) == 6
    (report,) = compact(tmp_path)
    assert report.trials_moved == 5
    assert own(tmp_path) == [f"{results[5].trial_id}.parquet"]  # the failed trial's stays, as its rows do
    (part,) = [p for p in (tmp_path / "predictions" / f"study={STUDY}").iterdir() if p.name.startswith("part-")]
    meta = pq.ParquetFile(part).metadata
    assert meta.num_rows == 10 and meta.num_row_groups == 1
    kept = read_predictions(str(tmp_path), STUDY, [results[3].trial_id])
    assert list(kept) == [results[3].trial_id]
    np.testing.assert_array_equal(kept[results[3].trial_id]["test"].probs, base.predictions["test"]["probs"])
    f16 = read_predictions(str(tmp_path), STUDY, [results[2].trial_id])[results[2].trial_id]["test"]
    assert f16.precision == "float16" and np.allclose(f16.probs.sum(axis=1), 1.0, atol=1e-12)
    assert np.abs(f16.probs - base.predictions["test"]["probs"]).max() < 2e-3


def _compact_and_die(store: str, kill_at: int) -> None:
    steps = iter(range(10_000))

    def on_step(step: str) -> None:
        if next(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    compact(store, on_step=on_step)


def test_a_compaction_killed_at_each_step_keeps_every_prediction(base: TrialResult, tmp_path: Path):
    start = tmp_path / "start"
    for i in range(4):
        write_result(start, copy_of(base, i), keep_predictions="on")
        if i == 1:
            compact(start)
    ids = [copy_of(base, i).trial_id for i in range(4)]
    steps: list[str] = []
    probe = tmp_path / "probe"
    shutil.copytree(start, probe)
    compact(probe, on_step=steps.append)
    assert "write predictions parts" in steps and "delete predictions sources" in steps
    fork = multiprocessing.get_context("fork")
    for kill_at in range(len(steps)):
        store = tmp_path / f"killed-at-{kill_at}"
        shutil.copytree(start, store)
        child = fork.Process(target=_compact_and_die, args=(str(store), kill_at))
        child.start()
        child.join()
        assert child.exitcode == -signal.SIGKILL
        assert set(read_predictions(str(store), STUDY, ids)) == set(ids), (kill_at, steps[kill_at])
        compact(store)
        assert set(read_predictions(str(store), STUDY, ids)) == set(ids) and own(store) == []
        assert not [p for p in (store / "predictions" / f"study={STUDY}").iterdir() if p.name.startswith(".")]


def test_concurrent_writers_and_a_compaction_keep_every_prediction(base: TrialResult, tmp_path: Path):
    results = [copy_of(base, i) for i in range(12)]

    def write(chunk: list[TrialResult]) -> None:
        for result in chunk:
            write_result(tmp_path, result, keep_predictions="float32")

    threads = [threading.Thread(target=write, args=(results[i::3],)) for i in range(3)]
    threads.append(threading.Thread(target=lambda: compact(tmp_path, wait_seconds=30)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    compact(tmp_path, wait_seconds=30)
    kept = read_predictions(str(tmp_path), STUDY, [r.trial_id for r in results])
    assert set(kept) == {r.trial_id for r in results} and own(tmp_path) == []
    assert all(k["test"].precision == "float32" for k in kept.values())


def test_the_settings_line_says_what_the_predictions_will_take():
    assert kept_predictions_note([{"dataset": "cifar100"}], "off") == \
        "predictions not kept (--keep-predictions on would take ≈ 12.1 MB, 12.1 MB a trial)"
    # CIFAR-100's test set alone: 10,000 × 100 float32 values and int32 labels, about 4 MB a trial
    assert kept_predictions_note([{"dataset": "digits-noisy"}] * 2, "float16") == \
        "predictions kept (float16) ≈ 43.2 kB, 21.6 kB a trial"  # (269 + 630) × (10 × 2 + 4) bytes


# ---------------------------------------------------------------------------------------------------
# Rescoring the kept predictions of a real quick study


@pytest.fixture(scope="module")
def quick_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """compare_methods on the quick preset (one seed, three rows): predictions kept by default."""
    store = tmp_path_factory.mktemp("quick") / "results"
    out = run_study("compare_methods.py", "--store", str(store), "--seeds", "1", "--methods", "Vanilla (CE)",
                    "CE+TS", "MaC-Cal", "--epochs", "2", "--stage2-epochs", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    return store, out.stdout


@pytest.mark.ray
def test_rescore_reproduces_every_stored_metric(quick_study, capsys):
    store, stdout = quick_study
    assert "predictions kept (float64)" in stdout
    trials = read_trials(store).set_index("trial_id")
    assert len(trials) == 3 and stored_prediction_ids(str(store), "compare_methods") == set(trials.index)
    for metric in ("ece", "aece", "mce", "nll"):
        assert store_main(["rescore", "--store", str(store), "--metric", metric]) == 0
    assert "3 values computed, 0 already there" in capsys.readouterr().out
    rescored = read_rescored(store).set_index("trial_id")
    for column in ("ece", "aece", "mce"):
        values = rescored[rescored["column"] == f"test_{column}_bins15"]["value"]
        np.testing.assert_allclose(values, trials.loc[values.index, f"test_{column}"], rtol=0, atol=1e-9)
    nll = rescored[rescored["column"] == "test_nll"]["value"]
    np.testing.assert_allclose(nll, trials.loc[nll.index, "test_nll"], rtol=0, atol=1e-9)
    assert (rescored["bound"] == 0).all()
    # idempotent: a rerun computes nothing and writes nothing
    files = sorted((store / "rescored").rglob("*.parquet"))
    assert store_main(["rescore", "--store", str(store), "--metric", "ece"]) == 0
    assert "0 values computed, 3 already there" in capsys.readouterr().out
    assert sorted((store / "rescored").rglob("*.parquet")) == files


@pytest.mark.ray
def test_rescored_10_bin_ece_matches_torchmetrics(quick_study):
    from torchmetrics.classification import MulticlassCalibrationError

    store, _ = quick_study
    assert store_main(["rescore", "--store", str(store), "--metric", "ece", "--bins", "10"]) == 0
    rescored = read_rescored(store)
    rescored = rescored[rescored["column"] == "test_ece_bins10"].set_index("trial_id")["value"]
    kept = read_predictions(str(store), "compare_methods", list(rescored.index))
    for trial, value in rescored.items():
        test = kept[trial]["test"]
        metric = MulticlassCalibrationError(num_classes=10, n_bins=10, norm="l1")
        expected = metric(torch.from_numpy(test.probs), torch.from_numpy(test.labels)).item()
        assert value == pytest.approx(expected, abs=1e-6)  # torchmetrics bins in float32


@pytest.mark.ray
def test_float16_predictions_rescore_within_their_bound(quick_study, tmp_path: Path):
    store, _ = quick_study
    rounded = tmp_path / "rounded"
    shutil.copytree(store / "trials", rounded / "trials")
    trials = read_trials(store).set_index("trial_id")
    kept = read_predictions(str(store), "compare_methods", list(trials.index))
    from calib.store.parquet import write_file

    for trial, splits in kept.items():
        values = {s: {"probs": k.probs, "labels": k.labels, "indices": k.indices} for s, k in splits.items()}
        write_file(encode_predictions(trial, values, "float16"), predictions_file(str(rounded), "compare_methods",
                                                                                  trial))
    for metric in ("ece", "aece", "mce", "nll"):
        assert store_main(["rescore", "--store", str(rounded), "--metric", metric]) == 0
    rescored = read_rescored(rounded)
    assert len(rescored) == 12 and (rescored["precision"] == "float16").all()
    for _, row in rescored.iterrows():
        stored = trials.loc[row["trial_id"], row["column"].removesuffix("_bins15")]
        assert abs(row["value"] - stored) <= row["bound"], row.to_dict()
    assert rescored.loc[rescored["metric"] == "nll", "bound"].max() < 1e-3


@pytest.mark.ray
def test_the_report_shows_rescored_columns_and_bootstrap_markers(quick_study, tmp_path: Path):
    store, _ = quick_study
    assert store_main(["rescore", "--store", str(store), "--metric", "ece", "--bins", "10"]) == 0
    out = run_report("--store", str(store), "--out", str(tmp_path / "report"))
    assert out.returncode == 0, out.stderr[-2000:]
    (table,) = (tmp_path / "report" / "tables").glob("compare_methods_*.md")
    text = table.read_text()
    assert "ECE (10 bins)" in text.splitlines()[2]
    assert ("paired bootstrap over the 630 test samples (1 seed: the seeds' own variation is not in the test) "
            "(1000 draws, seed 0") in text


def test_rescore_refuses_an_unknown_metric_with_one_line(base: TrialResult, tmp_path: Path, capsys):
    write_result(tmp_path, base, keep_predictions="on")
    assert store_main(["rescore", "--store", str(tmp_path), "--metric", "ecee"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown metric 'ecee' for rescore; allowed: accuracy, ece,")
    assert store_main(["rescore", "--store", str(tmp_path), "--metric", "nll", "--bins", "10"]) == 2
    assert "has no bins" in capsys.readouterr().err
    assert not (tmp_path / "rescored").exists()


def test_the_rounding_bound_holds_on_a_hand_made_case():
    """Two samples of class 0: 0.5 / 0.5 (a tie: the class may flip) and 0.7 / 0.3 (far from the 15 bins' edges 2/3 and
    11/15). ECE bound: (the flip's 1 + both confidences' shifts Δ ≈ 2.4e-4 and 5.1e-4) / 2; NLL: the mean of
    ln(q / (q − δ)), about 4.9e-4 and 7.3e-4."""
    from calib.store.rounding import rounding_bound

    probs = np.array([[0.5, 0.5], [0.7, 0.3]])
    labels = np.array([0, 0])
    stored = probs.astype(np.float16).astype(np.float64)
    q = stored / stored.sum(axis=1, keepdims=True)
    assert rounding_bound("ece", probs, probs, labels, "float64") == 0.0
    assert rounding_bound("smece", stored, q, labels, "float16") is None
    assert 0.5 + 3.7e-4 < rounding_bound("ece", stored, q, labels, "float16", num_bins=15) < 0.5 + 3.9e-4
    assert 6.0e-4 < rounding_bound("nll", stored, q, labels, "float16") < 6.2e-4
    # a confidence on an edge (0.8 = 12/15) may cross it: 2 / N more
    edge = np.array([[0.8, 0.2]]).astype(np.float16).astype(np.float64)
    assert rounding_bound("ece", edge, edge / edge.sum(), np.array([0]), "float16") == pytest.approx(2.0)


def test_unsorted_row_groups_are_indexed(tmp_path: Path, base: TrialResult):
    """A part's trial -> row-group index: reading one trial reads its row groups only."""
    from calib.store import predictions as module

    for i in range(20):
        write_result(tmp_path, copy_of(base, i), keep_predictions="float16")
    compact(tmp_path)
    (part,) = (tmp_path / "predictions" / f"study={STUDY}").glob("part-*.parquet")
    import pyarrow.fs as pafs

    groups = module._row_groups(pafs.LocalFileSystem(), str(part), part.stat().st_size)
    assert len(groups) == 20 and pq.ParquetFile(part).metadata.num_row_groups == 3
    assert all(len(g) == 1 for g in groups.values())
    assert pd.Series([len(v) for v in groups.values()]).sum() == 20
