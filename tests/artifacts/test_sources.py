"""Stage I from a given file: a checkpoint's model or a features file becomes the artifact every method runs on."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from trial_fixtures import tiny_config

from calib._config import ConfigError
from calib.artifacts import get_or_train_stage1
from calib.artifacts.sources import SourceChangedError, local_copy, resolve_source
from calib.config import config_hash, parse_trial_config, stage1_identity, trial_identity
from calib.datasets import load_dataset
from calib.metrics import accuracy, expected_calibration_error, softmax64
from calib.models import create_model
from calib.trial import run_trial


def checkpoint_config(tmp_path, checkpoint, **changes):
    config = tiny_config(tmp_path, method={"name": "vanilla"})
    config["source"] = resolve_source("checkpoint", str(checkpoint))
    return {**config, **changes}


@pytest.fixture
def small_cnn_checkpoint(tmp_path):
    """A small_cnn with random weights for digits (10 classes, 1 channel), saved as a state_dict."""
    torch.manual_seed(0)
    model = create_model("small_cnn", num_classes=10, in_channels=1).eval()
    path = tmp_path / "model.pt"
    torch.save({"state_dict": model.state_dict(), "epoch": 7}, path)
    return path, model


class TestResolveSource:
    def test_main(self, tmp_path):
        path = tmp_path / "weights.pt"
        path.write_bytes(b"calib")
        source = resolve_source("checkpoint", str(path), "fc")
        assert source == {"kind": "checkpoint", "path": str(path), "sha256": hashlib.sha256(b"calib").hexdigest(),
                          "head": "fc"}

    def test_errors(self, tmp_path):
        with pytest.raises(ConfigError, match=r"`--checkpoint` file not found: '.*absent\.pt'"):
            resolve_source("checkpoint", str(tmp_path / "absent.pt"))
        with pytest.raises(ConfigError, match=r"`--features` must name a file, but '.*' is a directory"):
            resolve_source("features", str(tmp_path))


class TestIdentity:
    def test_main(self, tmp_path, small_cnn_checkpoint):
        path, _ = small_cnn_checkpoint
        seed_1 = parse_trial_config(checkpoint_config(tmp_path, path, seed=1))
        seed_2 = parse_trial_config(checkpoint_config(tmp_path, path, seed=2))
        # the backbone is fixed: one Stage I for every seed; the trials differ
        assert stage1_identity(seed_1) == stage1_identity(seed_2)
        assert trial_identity(seed_1) != trial_identity(seed_2)
        assert stage1_identity(seed_1)["source"] == {"kind": "checkpoint", "sha256": seed_1.source.sha256,
                                                     "head": None}
        # where the file lies is placement; what it holds is identity
        moved = tmp_path / "moved.pt"
        moved.write_bytes(path.read_bytes())
        assert trial_identity(parse_trial_config(checkpoint_config(tmp_path, moved))) == trial_identity(seed_1)
        torch.save(create_model("small_cnn", num_classes=10, in_channels=1).state_dict(), moved)
        changed = parse_trial_config(checkpoint_config(tmp_path, moved))
        assert config_hash(stage1_identity(changed)) != config_hash(stage1_identity(seed_1))
        # a trained Stage I keeps the id it had before sources existed: no source key in its identity
        trained = parse_trial_config(tiny_config(tmp_path))
        assert "source" not in stage1_identity(trained) and "source" not in trial_identity(trained)

    def test_errors(self, tmp_path, small_cnn_checkpoint):
        path, _ = small_cnn_checkpoint
        with pytest.raises(ConfigError, match=r"`loss`='focal' is a way to train Stage I, but this trial's Stage I "
                                              r"comes from a checkpoint file .*The methods that run on a given"):
            parse_trial_config(checkpoint_config(tmp_path, path, loss={"name": "focal"}))
        with pytest.raises(ConfigError, match=r"`stage1\.mixup_alpha` must be null: Mixup trains Stage I"):
            parse_trial_config(checkpoint_config(tmp_path, path, stage1={"epochs": 1, "mixup_alpha": 1.0}))
        with pytest.raises(ConfigError, match=r"`source\.sha256` must be the file's SHA-256"):
            parse_trial_config({**tiny_config(tmp_path), "source": {"kind": "checkpoint", "path": str(path)}})
        with pytest.raises(ConfigError, match=r"`source\.path` must be the absolute path or s3:// URI"):
            parse_trial_config({**tiny_config(tmp_path),
                                "source": {"kind": "checkpoint", "path": "model.pt", "sha256": "0" * 64}})


def test_a_checkpoint_stage1_is_the_checkpoints_model(tmp_path, small_cnn_checkpoint):
    """The artifact's cached logits are the checkpoint model's; the uncalibrated row's metrics are its own."""
    path, model = small_cnn_checkpoint
    result = run_trial(checkpoint_config(tmp_path, path))
    assert result.status == "ok" and result.history == [] and result.stage1_cache_hit is False
    data = load_dataset("digits-noisy", str(tmp_path / "data"))
    images = torch.stack([data.test[i][0] for i in range(len(data.test))])
    labels = np.array([data.test[i][1] for i in range(len(data.test))])
    with torch.no_grad():
        probs = softmax64(model(images))
    assert result.metrics["test_accuracy"] == pytest.approx(accuracy(probs, labels), abs=1e-12)
    assert result.metrics["test_ece"] == pytest.approx(expected_calibration_error(probs, labels), abs=1e-5)
    # every seed's trial reads the one Stage I; TS calibrates it
    other = run_trial(checkpoint_config(tmp_path, path, seed=2, method={"name": "temperature_scaling"}))
    assert other.stage1_id == result.stage1_id and other.stage1_cache_hit is True
    assert other.metrics["test_accuracy"] == result.metrics["test_accuracy"]


def test_a_changed_checkpoint_is_refused_by_the_trial(tmp_path, small_cnn_checkpoint):
    path, _ = small_cnn_checkpoint
    cfg = parse_trial_config(checkpoint_config(tmp_path, path))
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(SourceChangedError, match=r"changed since the study resolved it .*run the study again"):
        local_copy(cfg)
    with pytest.raises(SourceChangedError):
        get_or_train_stage1(cfg, torch.device("cpu"))


def features_file(tmp_path, *, head: bool = True):
    g = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(3, 5, generator=g), torch.tensor([0.5, 0.0, -0.5])
    content = {}
    for split, n in (("train", 60), ("val", 30), ("test", 45)):
        labels = torch.arange(n) % 3
        content[f"{split}_features"] = weight[labels] + torch.randn(n, 5, generator=g)
        content[f"{split}_labels"] = labels
        if not head:
            content[f"{split}_logits"] = content[f"{split}_features"] @ weight.T + bias
    if head:
        content.update(head_weight=weight, head_bias=bias)
    path = tmp_path / "features.pt"
    torch.save(content, path)
    return path, content, weight, bias


def features_config(tmp_path, path, **changes):
    config = tiny_config(tmp_path, method={"name": "temperature_scaling"})
    config.update(dataset="my-texts", arch="features", source=resolve_source("features", str(path)))
    return {**config, **changes}


def test_a_features_stage1_runs_the_two_stage_and_posthoc_methods(tmp_path):
    path, content, weight, bias = features_file(tmp_path)
    vanilla = run_trial(features_config(tmp_path, path, method={"name": "vanilla"}))
    logits = content["test_features"].double() @ weight.T.double() + bias.double()
    probs = softmax64(logits.float())
    labels = content["test_labels"].numpy()
    assert vanilla.metrics["test_accuracy"] == pytest.approx(accuracy(probs, labels), abs=1e-12)
    assert vanilla.metrics["test_nll"] == pytest.approx(
        float(-np.log(probs[np.arange(len(labels)), labels]).mean()), rel=1e-6)
    for method in ({"name": "temperature_scaling"}, {"name": "tst", "epochs": 2},
                   {"name": "mac_cal", "epochs": 2, "head": "linear", "head_init": "stage1"}):
        result = run_trial(features_config(tmp_path, path, method=method))
        assert result.status == "ok" and result.stage1_id == vanilla.stage1_id, method


def test_a_features_stage1_refuses_what_needs_a_model(tmp_path):
    path, *_ = features_file(tmp_path, head=False)
    with pytest.raises(ConfigError, match=r"`ood_datasets` must be empty for a features Stage I"):
        parse_trial_config(features_config(tmp_path, path, ood_datasets=["natural-patches"]))
    with pytest.raises(ConfigError, match=r"read only the train/val/test splits of a features Stage I"):
        parse_trial_config(features_config(tmp_path, path, method={"name": "mac_cal", "stats_source": "heldout"}))
    with pytest.raises(ConfigError, match=r"`dataset` must be a name"):
        parse_trial_config(features_config(tmp_path, path, dataset="my texts"))
    with pytest.raises(ConfigError, match=r"has no linear head: its features file holds logits but no head_weight"):
        run_trial(features_config(tmp_path, path, method={"name": "mac_cal", "epochs": 1, "head": "linear",
                                                           "head_init": "stage1"}))


def test_a_checkpoint_in_the_object_store_is_fetched_once_per_node(tmp_path, small_cnn_checkpoint, s3, monkeypatch):
    from calib import storage

    bucket, _ = s3
    path, _ = small_cnn_checkpoint
    uri = f"s3://{bucket}/models/model.pt"
    storage.upload(path, uri)
    monkeypatch.setenv("CALIB_ARTIFACT_CACHE", str(tmp_path / "cache"))
    source = resolve_source("checkpoint", uri)
    assert source["path"] == uri and source["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    result = run_trial(checkpoint_config(tmp_path, path, source=source))
    assert result.status == "ok"
    assert (tmp_path / "cache" / "sources" / f"{source['sha256']}.pt").read_bytes() == path.read_bytes()
    with pytest.raises(ConfigError, match=r"The checkpoint 's3://.*/absent\.pt' does not exist"):
        resolve_source("checkpoint", f"s3://{bucket}/models/absent.pt")
