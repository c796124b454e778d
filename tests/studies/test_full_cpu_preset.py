"""The full-cpu preset's whole path on a slice: real Fashion-MNIST (Debian's dataset-fashion-mnist, which .ci/run
installs) × LeNet-5 through compare_methods, Ray Tune and the store, with only the training size and the epochs
overridden (``--train-size 300 --epochs 2 --stage2-epochs 2``): the same code path as the full preset."""

from __future__ import annotations

import hashlib
import os

import pandas as pd
import pytest
import torch
from in_process import run_study

from calib.artifacts.features_file import read_features_file
from calib.datasets import fashion_mnist

HAS_FILES = all(os.path.isfile(os.path.join(fashion_mnist.SYSTEM_FOLDER, name))
                for name in fashion_mnist.FILES.values())
SLICE = ["--preset", "full-cpu", "--train-size", "300", "--epochs", "2", "--stage2-epochs", "2", "--seeds", "1"]


@pytest.mark.ray
@pytest.mark.skipif(not HAS_FILES and not os.environ.get("CALIB_CI"),
                    reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist); .ci/run installs "
                           "it, runs this")
def test_full_cpu_preset_runs_on_a_slice(tmp_path):
    """Never skipped in CI (.ci/run sets CALIB_CI and installs the files): there missing files fail."""
    store = tmp_path / "results"
    rows = ["Vanilla", "CE+TS", "MaC-Cal"]
    out = run_study("compare_methods.py", *SLICE, "--store", str(store), "--data-root", str(tmp_path / "data"),
                    "--methods", *rows)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("preset full-cpu · Stage I 2 epochs · Stage II 2 epochs · seeds 1 · train size 300 · device cpu · "
            "per trial 1 CPU") in out.stdout
    for row in rows:
        assert f"| {row} | 1 |" in out.stdout
    df = pd.read_parquet(store / "trials")
    assert len(df) == 3 and (df["status"] == "ok").all()
    assert set(df["dataset"]) == {"fashion-mnist"} and set(df["arch"]) == {"lenet5"}
    assert df["stage1_id"].nunique() == 1 and (~df["stage1_cache_hit"]).sum() == 1, "one Stage I for the three rows"
    assert (df["stage1_train_size"] == 300).all() and (df["stage1_epochs"] == 2).all()
    assert (df["stage1_lr"] == 0.05).all() and (df["stage1_loss_reduction"] == "mean").all()
    assert not df["stage1_augment"].any()
    assert df["test_bin_count"].map(sum).eq(10_000).all()  # the whole t10k test set, whatever the training slice
    history = pd.read_parquet(store / "history")
    assert sorted(history.loc[history["stage"] == "stage1", "epoch"].unique()) == [0, 1]  # 2 epochs, from 0
    exported_rows_reproduce_from_their_features_file(tmp_path, store, df)


def exported_rows_reproduce_from_their_features_file(tmp_path, store, trained):
    """report.py --export-features writes the Stage I as a features file (its cached splits and head, bitwise) and
    SHA256SUMS; the same rows run from that file (--features) give the trained Stage I's numbers."""
    exported = tmp_path / "features"
    out = run_study("report.py", "--store", str(store), "--export-features", str(exported))
    assert out.returncode == 0, out.stderr[-3000:]
    file = exported / "fashion-mnist_lenet5_Vanilla_seed1.pt"
    assert sorted(p.name for p in exported.iterdir()) == ["SHA256SUMS", file.name]
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    assert (exported / "SHA256SUMS").read_text() == f"{digest}  {file.name}\n"
    assert f"sha256 {digest}" in out.stdout
    stage1_id = str(trained["stage1_id"].iloc[0])
    cache = torch.load(store / "artifacts" / "stage1" / stage1_id / "cache.pt", weights_only=True)
    model = torch.load(store / "artifacts" / "stage1" / stage1_id / "model.pt", weights_only=True)
    features = read_features_file(file)
    for split in ("train", "val", "test"):
        assert torch.equal(features.splits[split].features, cache[f"{split}_features"])
        assert torch.equal(features.splits[split].logits, cache[f"{split}_logits"])
        assert torch.equal(features.splits[split].labels, cache[f"{split}_labels"])
    assert torch.equal(features.head_state["weight"], model["head.weight"])
    assert torch.equal(features.head_state["bias"], model["head.bias"])

    again = tmp_path / "again"
    out = run_study("compare_methods.py", "--preset", "full-cpu", "--stage2-epochs", "2", "--seeds", "1",
                    "--store", str(again), "--features", str(file),
                    "--methods", "Vanilla", "CE+TS", "MaC-Cal")
    assert out.returncode == 0, out.stderr[-3000:]
    rerun = pd.read_parquet(again / "trials").set_index("label")
    assert set(rerun["source_kind"]) == {"features"} and set(rerun["source_sha256"]) == {digest}
    trained = trained.set_index("label")
    for label in ("Vanilla", "CE+TS", "MaC-Cal"):
        for metric in ("test_ece", "test_accuracy", "test_nll"):
            assert rerun.loc[label, metric] == pytest.approx(trained.loc[label, metric], rel=1e-6, abs=1e-9), \
                (label, metric)


def test_export_features_refuses_a_label_without_rows_and_options_without_export(tmp_path):
    """A label the store has no ok row of, and --label without --export-features: one error line, exit 2, no file."""
    out = run_study("report.py", "--store", str(tmp_path / "results"), "--export-features", str(tmp_path / "out"),
                    "--label", "Nope")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: `--label` must be the label of an ok row")
    assert not (tmp_path / "out").exists()
    out = run_study("report.py", "--store", str(tmp_path / "results"), "--label", "LS")
    assert out.returncode == 2 and "`--label` must come with --export-features DIR, got --label='LS'" in out.stderr
