"""studies/posthoc.py and calibrate.py on a file of predictions: the benchmarks' splits, each split × method a trial,
and every bad file refused in one line before anything is written."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
from in_process import run_refused, run_report, run_study
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax
from sklearn.model_selection import train_test_split
from test_study_scripts import trial_files

from calib.datasets.synthetic_logits import overconfident_logits
from calib.study.rows import POSTHOC_METHODS


@pytest.fixture(scope="module")
def netcal_file(tmp_path_factory):
    """An over-confident 4-class model's softmax outputs on 400 samples, in netcal's record format (float32)."""
    logits, labels = overconfident_logits(400, 4, seed=5)
    path = tmp_path_factory.mktemp("records") / "my-model.npz"
    np.savez(path, predictions=np.exp(log_softmax(logits, axis=1)).astype(np.float32), ground_truth=labels)
    return path


def ts_test_nll(path, split: int) -> float:
    """Temperature scaling restated: NLL-optimal T on the calibration half of the stratified split, test NLL."""
    with np.load(path) as f:
        probs, labels = f["predictions"].astype(np.float64), f["ground_truth"]
    scores = np.log(probs / probs.sum(axis=1, keepdims=True))
    calibration, test = train_test_split(np.arange(len(labels)), train_size=0.5, stratify=labels, random_state=split)

    def nll(rows, temperature):
        return -log_softmax(scores[rows] / temperature, axis=1)[np.arange(len(rows)), labels[rows]].mean()

    best = minimize_scalar(lambda t: nll(calibration, t), bounds=(0.05, 20), method="bounded",
                           options={"xatol": 1e-10})
    return float(nll(test, best.x))


@pytest.mark.ray
def test_each_split_and_method_is_a_trial_and_the_report_ranks_them(netcal_file, tmp_path):
    store = tmp_path / "results"
    out = run_study("posthoc.py", "--store", str(store), "--predictions", str(netcal_file), "--splits", "2",
                     "--methods", "TS", "HB")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (f"Stage I from the predictions file {netcal_file}: 400 samples, 4 classes, probabilities (keys "
            "predictions, ground_truth; calibrated as their log)") in out.stdout
    assert "stratified splits of 200 calibration and 200 test samples (0.5/0.5)" in out.stdout
    assert "my-model · predictions · test split" in out.stdout and "| TS | all | 0 | 2 |" in out.stdout
    df = pd.read_parquet(store / "trials")
    assert len(df) == 2 * 3 and (df["status"] == "ok").all() and sorted(set(df["seed"])) == [0, 1]
    assert set(df["dataset"]) == {"my-model"} and set(df["arch"]) == {"predictions"}
    assert set(df["source_kind"]) == {"predictions"} and set(df["source_path"]) == {str(netcal_file)}
    assert set(df["source_sha256"]) == {hashlib.sha256(netcal_file.read_bytes()).hexdigest()}
    assert (df["source_calibration_fraction"] == 0.5).all()
    assert df.groupby("seed")["stage1_id"].nunique().eq(1).all() and df["stage1_id"].nunique() == 2
    for split in (0, 1):  # calib's TS against the restated fit on the same split
        ts = df[(df["method"] == "temperature_scaling") & (df["seed"] == split)]
        assert ts["test_nll"].item() == pytest.approx(ts_test_nll(netcal_file, split), abs=1e-7)

    report = run_report("--store", str(store))
    assert report.returncode == 0, report.stderr[-3000:]
    table = (store / "report" / "tables" / "posthoc_my-model_predictions.md").read_text()
    assert "| TS · all |" in table and "| HB · all |" in table
    # one file: the methods are ranked over its splits, with the win rates and critical-difference diagrams
    ranks = (store / "report" / "tables" / "posthoc_ranks.md").read_text()
    assert "average rank over 2 calibration/test splits of my-model · predictions" in ranks
    assert "win" in ranks and list((store / "report" / "figures").glob("posthoc_*_cd.png"))


def _write(tmp_path, name, **arrays):
    np.savez(tmp_path / name, **arrays)
    return str(tmp_path / name)


PROBS = np.array([[0.7, 0.3], [0.4, 0.6], [0.2, 0.8], [0.9, 0.1]])


@pytest.mark.parametrize(("arrays", "message"), [
    ({"predictions": PROBS}, "keys missing or ambiguous"),
    ({"predictions": PROBS, "ground_truth": np.array([0, 1, 1])}, "the labels must have shape (N,) with N = 4"),
    ({"predictions": PROBS, "ground_truth": np.array([0, 1, 2, 0])}, "labels must be in 0..1"),
    ({"logits": np.array([[0, np.nan], [1, 0], [0, 1], [1, 0]]), "labels": np.array([0, 1, 1, 0])}, "NaN or inf"),
    ({"predictions": PROBS * 0.5, "ground_truth": np.array([0, 1, 1, 0])}, "rows do not sum to 1"),
    ({"logits": np.zeros((4, 1)), "labels": np.array([1, 1, 1, 1])}, "must hold at least 2 classes"),
])
@pytest.mark.parametrize("script", ["posthoc.py", "calibrate.py"])
def test_a_bad_file_exits_2_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, script, arrays, message):
    store = tmp_path / "results"
    code, err = run_refused(script, ["--store", str(store), "--predictions", _write(tmp_path, "bad.npz", **arrays)],
                            monkeypatch, capsys)
    assert code == 2 and message in err and err.count("\n") == 1 and err.startswith("error: predictions file "), err
    assert not store.exists() and trial_files(store, script.removesuffix(".py")) == []


@pytest.mark.parametrize(("script", "args", "message"), [
    ("posthoc.py", ["--splits", "0"], "`--splits` must be an integer >= 1"),
    ("posthoc.py", ["--splits", "3", "--seeds", "1"], "`--splits` and `--seeds` both choose the splits"),
    ("posthoc.py", ["--calibration-fraction", "1"], "`--calibration-fraction` must be in (0, 1)"),
    ("posthoc.py", ["--datasets", "digits"], "`--datasets` does not apply to --predictions"),
    ("posthoc.py", ["--sizes", "300"], "`--sizes` 300 exceed the 200 images of my-model's validation split"),
    ("calibrate.py", ["--methods", "TS", "TST"], "`--methods` TST cannot run on --predictions"),
])
def test_bad_flags_with_predictions(netcal_file, tmp_path, monkeypatch, capsys, script, args, message):
    store = tmp_path / "results"
    code, err = run_refused(script, ["--store", str(store), "--predictions", str(netcal_file), *args], monkeypatch,
                            capsys)
    assert code == 2 and message in err, err
    assert not (store / "trials").exists()


def test_splits_without_predictions_is_refused(monkeypatch, capsys, tmp_path):
    code, err = run_refused("posthoc.py", ["--store", str(tmp_path), "--splits", "3"], monkeypatch, capsys)
    assert code == 2 and "`--splits` splits the files of --predictions; without --predictions it does not apply" in err


def test_calibrate_counts_the_logit_rows_of_each_split(netcal_file, tmp_path, capsys):
    from in_process import study_module

    code = study_module("calibrate.py").main(["--store", str(tmp_path / "results"), "--predictions", str(netcal_file),
                                              "--splits", "3", "--check-only"])
    out = capsys.readouterr().out
    rows = 1 + len(POSTHOC_METHODS)  # Uncalibrated and every post-hoc row; not TST, V-TST, MaC-Cal
    assert code == 0 and f"{rows} rows" in out and f"{rows * 3} trials" in out, out
