"""Checksummed Stage-I artifacts on S3 (moto): bad published files are quarantined in the bucket and rebuilt,
a bad node-local copy is downloaded again."""

from __future__ import annotations

import json

import boto3
import pytest
import torch

from calib.artifacts import ArtifactWarning, get_or_train_stage1, ood_split, stage1_dir
from calib.config import TrialConfig, config_hash, parse_trial_config, stage1_identity

CPU = torch.device("cpu")


def keys(bucket: str, prefix: str) -> list[str]:
    """The objects under ``prefix``, without the directory markers pyarrow leaves behind after a move."""
    listing = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for item in listing.get("Contents", []) if not item["Key"].endswith("/"))


def get(bucket: str, key: str) -> bytes:
    return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()


def put(bucket: str, key: str, data: bytes) -> None:
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=data)


@pytest.fixture
def published(s3, make_config, tmp_path, monkeypatch) -> tuple[str, TrialConfig, str, str]:
    """A Stage-I artifact trained on node a and published: ``(bucket, cfg, stage1_id, writer)``."""
    bucket, _ = s3
    cfg = parse_trial_config({**make_config(method={"name": "vanilla"}), "artifact_root": f"s3://{bucket}/artifacts"})
    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-a"))
    artifact, hit = get_or_train_stage1(cfg, CPU)
    assert not hit
    return bucket, cfg, config_hash(stage1_identity(cfg)), artifact.record["writer"]


def test_bad_published_cache_is_quarantined_retrained_and_republished(published, tmp_path, monkeypatch):
    bucket, cfg, stage1_id, writer = published
    prefix = f"artifacts/stage1/{stage1_id}"
    bad = get(bucket, f"{prefix}/{writer}/cache.pt")[:1000]  # a partial sync
    put(bucket, f"{prefix}/{writer}/cache.pt", bad)

    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-b"))
    with pytest.warns(ArtifactWarning) as caught:
        artifact, hit = get_or_train_stage1(cfg, CPU)

    assert not hit and artifact.record["writer"] != writer
    messages = [str(w.message) for w in caught]
    assert "downloading again" in messages[0] and "failed its check twice" in messages[1]
    quarantined = keys(bucket, "artifacts/quarantine/")
    (incident,) = {k.split("/")[2] for k in quarantined}
    assert incident.startswith(f"{stage1_id}-") and incident in messages[1]
    assert quarantined == sorted(f"artifacts/quarantine/{incident}/{name}"
                                 for name in ("record.json", f"{writer}/cache.pt", f"{writer}/model.pt"))
    assert get(bucket, f"artifacts/quarantine/{incident}/{writer}/cache.pt") == bad
    new_writer = artifact.record["writer"]
    assert keys(bucket, prefix) == sorted([f"{prefix}/record.json", f"{prefix}/{new_writer}/model.pt",
                                           f"{prefix}/{new_writer}/cache.pt"])
    assert json.loads(get(bucket, f"{prefix}/record.json"))["writer"] == new_writer
    assert get(bucket, f"{prefix}/{new_writer}/cache.pt") == (artifact.path / "cache.pt").read_bytes()
    assert not (stage1_dir(cfg.artifact_root, stage1_id).parents[1] / "quarantine").exists()  # downloads discarded


def test_bad_local_copy_is_downloaded_again(published):
    bucket, cfg, stage1_id, writer = published
    local = stage1_dir(cfg.artifact_root, stage1_id)
    good = (local / "cache.pt").read_bytes()
    (local / "cache.pt").write_bytes(good[: len(good) // 2])

    with pytest.warns(ArtifactWarning, match="cache.pt has"):
        artifact, hit = get_or_train_stage1(cfg, CPU)

    assert hit and artifact.record["writer"] == writer
    assert (local / "cache.pt").read_bytes() == good
    (quarantined,) = (local.parents[1] / "quarantine").iterdir()
    assert (quarantined / "cache.pt").read_bytes() == good[: len(good) // 2]
    assert not keys(bucket, "artifacts/quarantine/")


def test_bad_published_ood_cache_is_quarantined_and_recomputed(published, tmp_path, monkeypatch):
    bucket, cfg, stage1_id, writer = published
    artifact, _ = get_or_train_stage1(cfg, CPU)
    computed = ood_split(artifact, cfg, "natural-patches", CPU)
    key = f"artifacts/stage1/{stage1_id}/{writer}/ood-natural-patches.pt"
    assert json.loads(get(bucket, key + ".json"))["bytes"] == len(get(bucket, key))  # the sidecar follows it
    data = bytearray(get(bucket, key))
    data[len(data) // 2] ^= 0xFF
    put(bucket, key, bytes(data))

    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "node-b"))
    fetched, hit = get_or_train_stage1(cfg, CPU)
    with pytest.warns(ArtifactWarning, match="ood-natural-patches.pt does not match its SHA-256"):
        recomputed = ood_split(fetched, cfg, "natural-patches", CPU)

    assert hit and torch.equal(recomputed.logits, computed.logits)
    (incident,) = {k.split("/")[2] for k in keys(bucket, "artifacts/quarantine/")}
    assert get(bucket, f"artifacts/quarantine/{incident}/{writer}/ood-natural-patches.pt") == bytes(data)
    assert get(bucket, key) == (fetched.path / "ood-natural-patches.pt").read_bytes()
    assert get(bucket, key + ".json") == (fetched.path / "ood-natural-patches.pt.json").read_bytes()
