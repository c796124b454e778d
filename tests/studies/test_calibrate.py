"""studies/calibrate.py as a user runs it: a torchvision resnet18 checkpoint on an ImageFolder tree of PNGs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torchvision
from in_process import run_report
from PIL import Image

from calib.datasets import load_dataset
from calib.metrics import accuracy, expected_calibration_error, softmax64

ROOT = Path(__file__).resolve().parents[2]


def image_folder(root: Path) -> None:
    """train/ (10 per class) and test/ (6 per class) of 3 classes, PNGs of two sizes, no val/."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 10), ("test", 6)):
        for label, name in enumerate(("cat", "dog", "fox")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                size = (20, 20) if i % 2 else (24, 18)
                pixels = rng.integers(0, 80, (size[1], size[0], 3)) + 60 * label
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}.png")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("calibrate")
    image_folder(tmp / "images")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3).eval()
    torch.save(model.state_dict(), tmp / "resnet18.pt")
    trackers = {"MLFLOW_TRACKING_URI": (tmp / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true",
                "CALIB_TENSORBOARD_DIR": str(tmp / "tb")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "studies" / "calibrate.py"), "--checkpoint", str(tmp / "resnet18.pt"),
         "--arch", "torchvision:resnet18", "--datasets", "imagefolder", "--data-root", str(tmp / "images"),
         "--image-size", "16", "--methods", "Uncalibrated", "TS", "TST", "--seeds", "1", "2", "--stage2-epochs", "2",
         "--log-to", "mlflow", "--log-to", "tensorboard", "--store", str(tmp / "store")],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, **trackers})
    return tmp, model, done


@pytest.mark.ray
def test_calibrate_runs_every_method_on_the_checkpoints_model(calibrated):
    tmp, model, done = calibrated
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Stage I from the checkpoint" in done.stdout and "head fc" in done.stdout
    # "Uncalibrated", the uncalibrated model's former name, typed in --methods: its row is "Vanilla"
    assert "| Vanilla | 2 |" in done.stdout and "| TST | 2 |" in done.stdout
    trials = pd.read_parquet(tmp / "store" / "trials")
    assert len(trials) == 6 and set(trials["status"]) == {"ok"}
    assert trials["stage1_id"].nunique() == 1 and (~trials["stage1_cache_hit"]).sum() == 1  # one Stage I, no seed
    assert set(trials["source_kind"]) == {"checkpoint"} and set(trials["arch"]) == {"torchvision:resnet18"}
    assert set(trials["source_sha256"]) == {hashlib.sha256((tmp / "resnet18.pt").read_bytes()).hexdigest()}
    assert set(trials["dataset_options"]) == {'{"image_size": 16, "mean": null, "resize": null, "std": null, '
                                              '"val_fraction": 0.1}'}

    # the uncalibrated rows are the checkpoint's own model on the test images, as torchvision computes it
    data = load_dataset("imagefolder", str(tmp / "images"), options={"image_size": 16})
    images = torch.stack([data.test[i][0] for i in range(len(data.test))])
    labels = np.array([data.test[i][1] for i in range(len(data.test))])
    with torch.no_grad():
        probs = softmax64(model(images))
    uncalibrated = trials[trials["label"] == "Vanilla"]
    assert np.allclose(uncalibrated["test_accuracy"], accuracy(probs, labels), atol=1e-12)
    assert np.allclose(uncalibrated["test_ece"], expected_calibration_error(probs, labels), atol=1e-5)
    assert (tmp / "store" / "figures" / "calibrate_imagefolder_torchvision:resnet18_reliability.png").exists()


@pytest.mark.ray
def test_the_report_regenerates_the_calibrate_table(calibrated):
    tmp, _, done = calibrated
    assert done.returncode == 0
    report = run_report("--store", str(tmp / "store"))
    assert report.returncode == 0, report.stderr[-3000:]
    table = (tmp / "store" / "report" / "tables" / "calibrate_imagefolder_torchvision:resnet18.md").read_text()
    assert "| Vanilla |" in table and "| TS |" in table and "| TST |" in table


@pytest.mark.ray
def test_the_study_is_followed_in_mlflow_and_tensorboard(calibrated, monkeypatch):
    """--log-to through Ray: each worker logs its trials as child runs of the study's run; rows hold the ids."""
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tmp, _, done = calibrated
    assert done.returncode == 0
    trials = pd.read_parquet(tmp / "store" / "trials")
    client = MlflowClient(tracking_uri=(tmp / "mlruns").as_uri())
    (parent,) = client.search_runs([client.get_experiment_by_name("calibrate").experiment_id],
                                   filter_string="tags.`calib.parent` = 'calibrate'")
    for _, row in trials.iterrows():
        run = client.get_run(row["mlflow_run_id"])
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert (run.data.tags["trial_id"], run.data.tags["arch"]) == (row["trial_id"], "torchvision:resnet18")
        assert run.data.metrics["test_ece"] == pytest.approx(row["test_ece"])
        assert Path(row["tensorboard_run"]) == tmp / "tb" / "calibrate" / row["trial_id"]
        assert any(Path(row["tensorboard_run"]).glob("events.out.tfevents.*"))
    assert trials["wandb_run_id"].isna().all()
