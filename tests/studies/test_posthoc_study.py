"""studies/posthoc.py: post-hoc methods on nested validation subsets of one cached Stage I, and its bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from in_process import run_report, run_study
from test_study_reports import study_module
from test_study_scripts import TINY, trial_files

from calib.posthoc import calibration_indices


@pytest.mark.ray
def test_sizes_and_draws_on_one_stage1_and_the_report(tmp_path):
    store = tmp_path / "results"
    out = run_study("posthoc.py", "--store", str(store), "--methods", "TS", "HB", "HB-EM", "--sizes", "50", "120",
                     "all", "--draws", "2", "--set", "histogram_binning.num_bins=5", *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("| method | calibration set | degenerate | n | ECE | smECE | NLL | Brier | Acc | ΔAcc | changed | KS | "
            "NLL cal | NLL ref | Brier cal | Brier ref | fit s |") in out.stdout
    # n counts seeds (one here), the 2 draws of a size averaged within it
    assert "| TS | n=50 | 0 | 1 |" in out.stdout and "| HB-EM | all | 0 | 1 |" in out.stdout
    assert "| HB | all | 0 | 1 |" in out.stdout and "| Vanilla | – | 0 | 1 |" in out.stdout
    df = pd.read_parquet(store / "trials")
    assert len(df) == 1 + 3 * (2 * 2 + 1) and (df["status"] == "ok").all() and df["trial_id"].is_unique
    assert df["stage1_id"].nunique() == 1 and (~df["stage1_cache_hit"]).sum() == 1, "one Stage I for every fit"
    posthoc = df[df["method"] != "vanilla"]
    # `histogram_binning`, HB-EM's former name, still reads in --set; the rows carry its name now
    assert posthoc.loc[posthoc["method"] == "histogram_binning_equal_mass", "method_num_bins"].eq(5).all()
    assert posthoc.loc[posthoc["method"] == "histogram_binning_equal_width", "method_num_bins"].eq(15).all()
    sized = posthoc[posthoc["method_calibration_size"].notna()]
    assert sorted(set(zip(sized["method_calibration_size"], sized["method_calibration_draw"], strict=True))) == [
        (50, 0), (50, 1), (120, 0), (120, 1)]
    # temperature scaling keeps the argmax whatever it was fitted on
    vanilla_accuracy = df.loc[df["method"] == "vanilla", "test_accuracy"].item()
    assert df.loc[df["method"] == "temperature_scaling", "test_accuracy"].eq(vanilla_accuracy).all()
    ts = df[df["method"].isin(["temperature_scaling", "vanilla"])]
    assert ts["test_argmax_changed"].eq(0).all() and ts["test_accuracy_change"].eq(0).all()
    binned = df[df["method"].str.startswith("histogram_binning")]
    change = binned["test_accuracy"] - vanilla_accuracy
    assert np.allclose(binned["test_accuracy_change"], change, atol=1e-12) and binned["test_argmax_changed"].gt(0).any()
    assert df[["test_ks_ce", "test_nll_refinement", "test_brier_refinement"]].notna().all().all()
    # two draws of one size fit different subsets, hence (almost surely) different calibrated models
    ts50 = sized[(sized["method"] == "temperature_scaling") & (sized["method_calibration_size"] == 50)]
    assert ts50["test_nll"].nunique() == 2
    assert (store / "figures" / "posthoc_digits-noisy_small_cnn_sizes.png").read_bytes()[:4] == b"\x89PNG"

    report = run_report("--store", str(store))
    assert report.returncode == 0, report.stderr[-3000:]
    table = (store / "report" / "tables" / "posthoc_digits-noisy_small_cnn.md").read_text()
    assert table.index("| TS · n=50 |") < table.index("| TS · n=120 |") < table.index("| TS · all |") < table.index(
        "| HB · n=50 |") < table.index("| HB-EM · n=50 |")
    assert (store / "report" / "figures" / "posthoc_digits-noisy_small_cnn_sizes.png").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--sizes", "50", "500"], "`--sizes` 500 exceed the 269 images of digits-noisy's validation split"),
    (["--sizes", "1"], "'1' is not a calibration-set size"),
    (["--methods", "TS", "Platt"], "invalid choice: 'Platt'"),
    (["--set", "histogram_binning.num_bins=0"], "`method.num_bins` must be an integer >= 1, got method.num_bins=0"),
    (["--methods", "TS", "--set", "histogram_binning.num_bins=5"], "names method 'histogram_binning_equal_mass'"),
    (["--synthetic-classes", "1"], "`--synthetic-classes` must be an integer >= 2, got --synthetic-classes 1"),
    (["--synthetic-seed", "3"], "`--synthetic-seed` draws the data of --synthetic-classes; without it it does not "
                                "apply, got --synthetic-seed 3"),
])
def test_bad_input_is_one_error_before_any_trial(tmp_path, capsys, args, message):
    store = tmp_path / "results"
    try:  # in this process: the study's main, as its __main__ calls it (argparse exits by itself)
        code = study_module("posthoc.py").main(["--store", str(store), *args, *TINY])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("error") == 1, err
    assert trial_files(store, "posthoc") == [] and not (store / "trials").exists()


def test_synthetic_classes_write_the_data_once_and_calibrate_it_as_a_features_file(tmp_path, capsys):
    from calib.artifacts.features_file import read_features_file

    store = tmp_path / "results"
    args = ["--store", str(store), "--synthetic-classes", "7", "--synthetic-seed", "2", "--check-only"]
    assert study_module("posthoc.py").main(args) == 0
    out = capsys.readouterr().out
    path = store / "synthetic" / "synthetic-logits-7-seed2.npz"
    features = read_features_file(path)
    assert features.num_classes == 7 and [len(features.splits[s].labels) for s in ("train", "val", "test")] == [
        1000, 5000, 10000]
    assert "Stage I from the features file" in out and "synthetic-logits-7-seed2" in out
    written = path.stat().st_mtime_ns
    assert study_module("posthoc.py").main(args) == 0 and path.stat().st_mtime_ns == written  # written once
    capsys.readouterr()
    try:
        code = study_module("posthoc.py").main([*args, "--datasets", "digits"])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2 and "`--datasets` does not apply with it" in capsys.readouterr().err


def test_a_draw_nests_its_subsets_and_draws_differ():
    small, large = calibration_indices(269, 50, 3), calibration_indices(269, 100, 3)
    assert len(small) == 50 == len(set(small)) and set(small) <= set(large)
    assert not np.array_equal(small, calibration_indices(269, 50, 4))
    assert calibration_indices(269, None, 7).tolist() == list(range(269))
    with pytest.raises(ValueError, match="at most the validation split's 269 samples, got calibration_size=270"):
        calibration_indices(269, 270, 0)
