"""The result store, the Stage-I artifacts and Ray Tune's state on S3, against moto's S3 server on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pyarrow.dataset as pads
import pytest
import torch

from calib import storage
from calib.artifacts import get_or_train_stage1, ood_split, stage1_exists
from calib.config import config_hash, parse_trial_config, stage1_identity
from calib.store import read_history, read_trials, write_result
from calib.trial import run_trial

ROOT = Path(__file__).resolve().parents[2]


def keys(bucket: str, prefix: str) -> list[str]:
    listing = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for item in listing.get("Contents", []))


def test_locations():
    assert storage.is_remote("s3://b/p") and not storage.is_remote("/tmp/x") and not storage.is_remote("file:///x")
    assert storage.normalize("s3://b/p/") == "s3://b/p"
    assert storage.normalize("file:///tmp/x") == "/tmp/x"
    assert storage.join("s3://b/p", "trials", "f.parquet") == "s3://b/p/trials/f.parquet"


def test_store_round_trip_on_s3(s3, make_config):
    bucket, _ = s3
    store = f"s3://{bucket}/results"
    assert read_trials(store).empty  # nothing there yet: an empty table with every column
    result = run_trial(make_config(method={"name": "vanilla"}))
    location = write_result(store, result)
    assert location == f"{store}/trials/study=test/{result.trial_id}.parquet"
    assert keys(bucket, "results/") == [f"results/history/study=test/{result.trial_id}.parquet",
                                f"results/trials/study=test/{result.trial_id}.parquet"]
    trials = read_trials(store, study="test", filters=pads.field("status") == "ok")
    assert list(trials["trial_id"]) == [result.trial_id]
    assert trials["test_ece"].iloc[0] == pytest.approx(result.metrics["test_ece"])
    assert len(read_history(store, study="test")) == len(result.history)


def test_artifacts_are_published_once_and_fetched_by_other_nodes(s3, make_config, tmp_path, monkeypatch):
    bucket, _ = s3
    config = {**make_config(method={"name": "vanilla"}), "artifact_root": f"s3://{bucket}/artifacts"}
    cfg = parse_trial_config(config)
    stage1_id = config_hash(stage1_identity(cfg))
    cpu = torch.device("cpu")

    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-a"))
    assert not stage1_exists(cfg)
    trained, hit = get_or_train_stage1(cfg, cpu)
    assert not hit and stage1_exists(cfg)
    writer = trained.record["writer"]
    assert keys(bucket, "artifacts/") == sorted([f"artifacts/stage1/{stage1_id}/record.json",
                                         f"artifacts/stage1/{stage1_id}/{writer}/model.pt",
                                         f"artifacts/stage1/{stage1_id}/{writer}/cache.pt"])
    computed = ood_split(trained, cfg, "natural-patches", cpu)
    assert f"artifacts/stage1/{stage1_id}/{writer}/ood-natural-patches.pt" in keys(bucket, "artifacts/")

    # A second node (another local cache) finds the record, downloads the writer's files and trains nothing.
    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-b"))
    fetched, hit = get_or_train_stage1(cfg, cpu)
    assert hit and fetched.path.is_relative_to(tmp_path / "node-b")
    assert torch.equal(fetched.splits["test"].features, trained.splits["test"].features)
    assert torch.equal(fetched.load_model().head.weight, trained.load_model().head.weight)
    assert torch.equal(ood_split(fetched, cfg, "natural-patches", cpu).logits, computed.logits)


@pytest.mark.ray
def test_study_writes_store_artifacts_and_tune_state_to_s3(s3, tmp_path):
    bucket, aws = s3
    store = f"s3://{bucket}/calib"
    command = [sys.executable, str(ROOT / "studies" / "sensitivity_gamma.py"), "--store", store,
               "--storage", f"{store}/_ray", "--seeds", "1", "--gammas", "0.9", "--epochs", "2",
               "--stage2-epochs", "2", "--data-root", str(tmp_path / "data")]
    env = {**os.environ, **aws, "CALIB_ARTIFACT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = read_trials(store, study="sensitivity_gamma")
    assert sorted(trials["method"]) == ["mac_cal", "vanilla"] and (trials["status"] == "ok").all()
    assert trials["stage1_cache_hit"].sum() == 1
    assert any(k.endswith("/record.json") for k in keys(bucket, "calib/artifacts/stage1/"))
    assert keys(bucket, "calib/_ray/"), "Ray Tune's experiment state goes to --storage"
    assert (tmp_path / "results" / "figures" / "sensitivity_gamma_digits-noisy_small_cnn.png").exists()
