"""The full-cpu preset's whole path on a slice: real Fashion-MNIST (Debian's dataset-fashion-mnist, which .ci/run
installs) × LeNet-5 through compare_methods, Ray Tune and the store, with only the training size and the epochs
overridden (``--train-size 300 --epochs 2 --stage2-epochs 2``): the same code path as the full preset."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from in_process import run_study

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
