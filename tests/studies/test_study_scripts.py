"""The study scripts as a user runs them (their ``main`` with the command line's arguments, in this process, on
one local Ray: tests/in_process.py): through Ray Tune into the store, resumable, with clean errors. Their real
command lines run in tests/test_faults.py and tests/studies/test_study_output.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest
from in_process import run_refused, run_report, run_study

from calib.study.rows import METHOD_ROWS, POSTHOC_ROWS

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--epochs", "2", "--stage2-epochs", "2"]


def trial_files(store: Path, study: str) -> list[Path]:
    folder = store / "trials" / f"study={study}"
    return sorted(p for p in folder.glob("*.parquet")) if folder.exists() else []


@pytest.fixture(scope="module")
def gamma_and_ablation(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """One store holding the ablation ladder (seed 1) and a γ study (seeds 2 and 3 × (vanilla + 3 γ): no
    Stage I in common with the ladder), as the studies printed them; tests copy it before changing it."""
    store = tmp_path_factory.mktemp("gamma_ablation") / "results"
    ablation = run_study("ablation.py", "--store", str(store), "--seeds", "1", *TINY)
    assert ablation.returncode == 0, ablation.stderr[-3000:]
    gamma = run_study("sensitivity_gamma.py", *GAMMA_ARGS, "--store", str(store))
    assert gamma.returncode == 0, gamma.stderr[-3000:]
    return store, gamma, ablation


GAMMA_ARGS = ["--seeds", "2", "3", "--gammas", "0.8", "0.9", "1.0", *TINY]


@pytest.mark.ray
def test_gamma_study_trains_stage1_once_per_seed_and_resumes(gamma_and_ablation):
    store, first, _ = gamma_and_ablation
    assert "| MaC-Cal | 0.9 | 2 |" in first.stdout and "| Vanilla | – | 2 |" in first.stdout
    assert (store / "figures" / "sensitivity_gamma_digits-noisy_small_cnn.png").read_bytes()[:4] == b"\x89PNG"

    df = pd.read_parquet(store / "trials", filters=[("study", "==", "sensitivity_gamma")])
    assert len(df) == 2 * (1 + 3) and df["trial_id"].is_unique and (df["status"] == "ok").all()
    trainings = df[~df["stage1_cache_hit"]]
    assert sorted(trainings["seed"]) == [2, 3], "Stage I must be trained exactly once per seed"
    assert df.groupby("seed")["stage1_id"].nunique().eq(1).all()
    assert df["node_id"].notna().all()
    # per seed: the Stage-I trainer alone, then the seed's cached MaC-Cal configs as one population
    cached = df[(df["method"] == "mac_cal") & df["stage1_cache_hit"]]
    assert (cached["population_size"] > 1).all()
    assert cached["population_size"].eq(cached.groupby("seed")["trial_id"].transform("size")).all()
    assert df.loc[df["method"] == "vanilla", "population_size"].eq(1).all()
    history = pd.read_parquet(store / "history", filters=[("study", "==", "sensitivity_gamma")])
    assert set(history["stage"]) == {"stage1", "stage2"}

    mtimes = {p: p.stat().st_mtime_ns for p in trial_files(store, "sensitivity_gamma")}
    again = run_study("sensitivity_gamma.py", *GAMMA_ARGS, "--store", str(store))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "8 trials: 8 already in the store, 0 to run" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in trial_files(store, "sensitivity_gamma")} == mtimes
    assert len(pd.read_parquet(store / "trials", filters=[("study", "==", "sensitivity_gamma")])) == 8


@pytest.mark.ray
def test_optuna_search_two_objectives(tmp_path):
    store = tmp_path / "results"
    out = run_study("search.py", "--space", str(ROOT / "search_spaces" / "mac_cal.yaml"), "--num-trials", "3",
                     "--objective", "val_ece", "val_accuracy", "--store", str(store), *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Pareto front of 3 trials on ['val_ece', 'val_accuracy']" in out.stdout
    df = pd.read_parquet(store / "trials")
    assert len(df) == 3 and set(df["study"].astype(str)) == {"search_mac_cal"}
    assert df["method_accuracy_weight"].between(0.8, 1.0).all()
    assert df["method_bottleneck_width"].between(32, 512).all()
    assert df["method_accuracy_weight"].nunique() == 3
    assert (store / "report" / "search_mac_cal_importances.md").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--datasets", "cifar11"], "Unknown dataset 'cifar11'. Did you mean 'cifar10'"),
    (["--preset", "paper"], "CIFAR-10 not found: expected the directory"),
    (["--gammas", "0"], "`method.accuracy_weight` must be > 0 (it is γ), got method.accuracy_weight=0.0."),
    (["--seeds", "1", "--study", "../escape"], "`study` must start with a letter or digit"),
    (["--train-size", "898"], "`--train-size` must be below the 898 images of digits-noisy's training split, "
                              "got --train-size=898. Leave it out to train on all of them."),
    (["--stats-source", "heldout"], "`method.stats_source`='heldout' reads the training images Stage I did not "
                                    "train on"),
])
def test_bad_input_exits_2_before_any_trial(tmp_path, monkeypatch, capsys, args, message):
    store = tmp_path / "results"
    code, stderr = run_refused("sensitivity_gamma.py", ["--store", str(store), "--data-root", str(tmp_path / "data"),
                                                       *args], monkeypatch, capsys)
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr
    assert not store.exists()


def test_missing_dataset_message_names_the_flag(tmp_path, monkeypatch, capsys):
    code, stderr = run_refused("sensitivity_gamma.py", ["--preset", "paper", "--store", str(tmp_path / "r"),
                                                       "--data-root", str(tmp_path / "data")], monkeypatch, capsys)
    assert code == 2 and f"{tmp_path / 'data'}/cifar-10-batches-py" in stderr and "--download" in stderr


@pytest.mark.ray
def test_compare_methods_shares_the_ce_stage1(tmp_path):
    store = tmp_path / "results"
    rows = ["Vanilla", "CE+TS", "CE+SMART", "TST", "V-TST", "MaC-Cal", "LS"]
    out = run_study("compare_methods.py", "--store", str(store), "--seeds", "1", "2", "--methods", *rows, *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    for row in rows:
        assert f"| {row} | 2 |" in out.stdout
    df = pd.read_parquet(store / "trials")
    assert len(df) == 2 * len(rows) and (df["status"] == "ok").all()
    ce = df[df["loss"] == "cross_entropy"]
    assert sorted(ce.loc[~ce["stage1_cache_hit"], "seed"]) == [1, 2], "one CE Stage I per seed for six methods"
    assert ce.groupby("seed")["stage1_id"].nunique().eq(1).all()
    ls = df[df["loss"] == "label_smoothing"]
    assert (ls["loss_smoothing"] == 0.05).all() and not ls["stage1_cache_hit"].any()
    assert df.loc[df["method"] == "tst", "method_latent_dim"].eq(256).all()


@pytest.mark.ray
def test_compare_methods_runs_fedlas_table1_baselines(tmp_path):
    # FeDLaS Table 1's ECP, MDCA, CRL and AdaFocal rows: each trains its Stage I (2 epochs, digits-noisy, quick preset)
    # with its defaults and stores an ok row; CRL gets the samples' positions, AdaFocal the validation logits.
    store = tmp_path / "results"
    rows = ["ECP", "MDCA", "CRL", "AdaFocal"]
    out = run_study("compare_methods.py", "--store", str(store), "--seeds", "1", "--methods", *rows, *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    for row in rows:
        assert f"| {row} | 1 |" in out.stdout
    df = pd.read_parquet(store / "trials")
    assert sorted(df["loss"]) == ["adafocal", "crl", "ecp", "mdca"] and (df["status"] == "ok").all()
    assert df["stage1_id"].nunique() == 4 and not df["stage1_cache_hit"].any()
    by_loss = df.set_index("loss")
    assert by_loss.loc["ecp", "loss_penalty_weight"] == 0.1 and by_loss.loc["ecp", "loss_entropy_reduction"] == "mean"
    assert by_loss.loc["mdca", "loss_penalty_weight"] == 1.0 and by_loss.loc["crl", "loss_rank_target"] == "softmax"
    assert by_loss.loc["adafocal", "loss_num_bins"] == 15 and by_loss.loc["adafocal", "loss_gamma_max"] == 20.0


@pytest.mark.ray
def test_ablation_study_prints_the_ladder(gamma_and_ablation):
    store, _, out = gamma_and_ablation
    assert "| Vanilla | 1 |" in out.stdout and "| +Decaying Adaptive Sparsity (Δ ECE " in out.stdout
    df = pd.read_parquet(store / "trials", filters=[("study", "==", "ablation")])
    assert len(df) == 6 and df["stage1_id"].nunique() == 1 and (~df["stage1_cache_hit"]).sum() == 1
    assert df["method_epochs"].dropna().eq(2).all(), "--stage2-epochs reaches every MaC-Cal step"
    figure = store / "figures" / "ablation_digits-noisy_small_cnn_retention.png"
    assert figure.exists() and f"figure (q_t per step): {figure}" in out.stdout


@pytest.mark.ray
def test_row_studies_run_into_the_store(tmp_path):
    store = tmp_path / "results"
    # "CE" is the uncalibrated model's former name: still accepted, the table says "Vanilla"
    combine = run_study("combine.py", "--store", str(store), "--seeds", "1", "--losses", "CE", "LS", *TINY)
    assert combine.returncode == 0, combine.stderr[-3000:]
    assert "| LS +MaC-Cal | 1 |" in combine.stdout and "| Vanilla +MaC-Cal | 1 |" in combine.stdout
    decompose = run_study("decompose.py", "--store", str(store), "--seeds", "1",
                           "--methods", "Vanilla", "FeDLaS-LS", "CE+TS", "CE+HB", "MaC-Cal", *TINY)
    assert decompose.returncode == 0, decompose.stderr[-3000:]
    assert "| row | n | ECE | O-ECE | U-ECE | Acc |" in decompose.stdout
    mixup = run_study("mixup_alpha.py", "--store", str(store), "--seeds", "1", "--alphas", "0.2", "1.0", *TINY)
    assert mixup.returncode == 0, mixup.stderr[-3000:]
    assert "| Mixup+MaC-Cal α=0.2 | 1 |" in mixup.stdout
    assert (store / "figures" / "mixup_alpha_digits-noisy_small_cnn.png").exists()
    df = pd.read_parquet(store / "trials")
    by_study = df.groupby(df["study"].astype(str)).size().to_dict()
    assert by_study == {"combine": 4, "decompose": 5, "mixup_alpha": 6}
    # combine: "+MaC-Cal" rows reuse their loss's Stage I
    combine_rows = df[df["study"] == "combine"]
    assert combine_rows.groupby("loss")["stage1_id"].nunique().eq(1).all()
    assert (~combine_rows["stage1_cache_hit"]).sum() <= 2
    # decompose: O-ECE + U-ECE = ECE for every trial
    assert ((df["test_oece"] + df["test_uece"] - df["test_ece"]).abs() < 1e-9).all()


@pytest.mark.ray
def test_cost_reuses_the_comparison_trials(tmp_path):
    store = tmp_path / "results"
    # every row that trains a Stage I or a Stage II, and three post-hoc ones (PTS alone fits for ~40 s)
    rows = [row for row in METHOD_ROWS if row not in POSTHOC_ROWS] + ["CE+TS", "CE+ETS", "CE+HB"]
    first = run_study("cost.py", "--store", str(store), "--seeds", "1", "--methods", *rows, *TINY)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "| MIT |" in first.stdout and "| Vanilla |" in first.stdout and "| CE+HB |" in first.stdout
    again = run_study("cost.py", "--store", str(store), "--seeds", "1", "--methods", *rows, *TINY)
    assert f"{len(rows)} trials: {len(rows)} already in the store, 0 to run" in again.stdout


@pytest.mark.ray
def test_report_regenerates_tables_byte_for_byte(gamma_and_ablation, tmp_path):
    import shutil

    store = tmp_path / "results"
    shutil.copytree(gamma_and_ablation[0], store)
    first = run_report("--store", str(store))
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"skipped combine: not in the store (run: python studies/combine.py --store {store})" in first.stdout
    report = store / "report"
    tables = {p.name: p.read_bytes() for p in sorted((report / "tables").iterdir())}
    assert set(tables) == {"ablation_digits-noisy_small_cnn.md", "ablation_digits-noisy_small_cnn.tex",
                           "sensitivity_gamma_digits-noisy_small_cnn.md",
                           "sensitivity_gamma_digits-noisy_small_cnn.tex"}
    md = tables["sensitivity_gamma_digits-noisy_small_cnn.md"].decode()
    assert [line.split(" | ")[0] for line in md.splitlines()[4:]] == ["| Vanilla", "| MaC-Cal γ=0.8",
                                                                        "| MaC-Cal γ=0.9", "| MaC-Cal γ=1"]
    assert md.count("**") == 2 * 4, "one bold best per metric column"
    assert r"\textbf{" in tables["ablation_digits-noisy_small_cnn.tex"].decode()
    figures = sorted(p.name for p in (report / "figures").iterdir())
    setup = "digits-noisy_small_cnn"
    assert figures == [f"ablation_{setup}_bars.png", f"ablation_{setup}_reliability.png",
                       f"sensitivity_gamma_{setup}_gamma.png", f"sensitivity_gamma_{setup}_reliability.png"]

    shutil.rmtree(report)
    again = run_report("--store", str(store))
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in sorted((report / "tables").iterdir())} == tables


@pytest.mark.ray
def test_ood_study(tmp_path):
    store = tmp_path / "results"
    out = run_study("ood.py", "--store", str(store), "--seeds", "1", "--methods", "Vanilla (CE)", "CE+IRM", "MaC-Cal",
                     *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| row | n | AUROC (mean) | FPR95 (mean) | AUROC natural-patches | Acc | ECE |" in out.stdout
    df = pd.read_parquet(store / "trials")
    assert df["ood_auroc"].between(0, 1).all()
    assert all(list(names) == ["natural-patches"] for names in df["ood_datasets"])


@pytest.mark.ray
def test_corruption_study_generates_digits_c(tmp_path):
    store, data = tmp_path / "results", tmp_path / "data"
    out = run_study("corruption.py", "--store", str(store), "--data-root", str(data), "--seeds", "1",
                     "--methods", "Vanilla (CE)", "CE+TS", "CE+VS", *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| row | n | ECE s1 | ECE s2 | ECE s3 | ECE s4 | ECE s5 | Acc (all) | ECE clean |" in out.stdout
    assert len(list((data / "digits-C").glob("*.npy"))) == 11
    assert (store / "figures" / "corruption_digits-noisy_small_cnn.png").exists()
    df = pd.read_parquet(store / "trials")
    assert df["corrupted_ece_by_severity"].map(len).eq(5).all()
