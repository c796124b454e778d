"""Stage-I artifacts are trained once per Stage-I config and shared; run_trial evaluates from them."""

import json
import threading

import pytest
import torch

from calib.artifacts import get_or_train_stage1, stage1_dir
from calib.config import config_hash, parse_trial_config, stage1_identity
from calib.metrics import METRICS, compute_all, softmax64
from calib.trial import run_trial, trial_id


def test_stage1_is_trained_once_and_reused(make_config):
    cfg = parse_trial_config(make_config())
    first, hit1 = get_or_train_stage1(cfg, torch.device("cpu"))
    other_method = parse_trial_config(make_config(method={"name": "vanilla"}))
    second, hit2 = get_or_train_stage1(other_method, torch.device("cpu"))
    assert (hit1, hit2) == (False, True)
    assert first.stage1_id == second.stage1_id == config_hash(stage1_identity(cfg))
    assert torch.equal(first.splits["test"].logits, second.splits["test"].logits)
    path = stage1_dir(cfg.artifact_root, first.stage1_id)
    assert sorted(p.name for p in path.iterdir()) == ["cache.pt", "model.pt", "record.json"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]
    record = json.loads((path / "record.json").read_text())
    assert record["seed"] == 1 and len(record["history"]) == 2 and record["num_classes"] == 10


def test_cached_features_match_the_model(make_config):
    cfg = parse_trial_config(make_config())
    artifact, _ = get_or_train_stage1(cfg, torch.device("cpu"))
    split = artifact.splits["val"]
    assert split.features.shape == (269, 128) and split.logits.shape == (269, 10)
    model = artifact.load_model()
    torch.testing.assert_close(model.head(split.features), split.logits)
    head = artifact.head_state()
    torch.testing.assert_close(split.features @ head["weight"].T + head["bias"], split.logits)
    stored = artifact.record["metrics"]
    assert stored["test_ece"] == pytest.approx(
        compute_all(softmax64(artifact.splits["test"].logits), artifact.splits["test"].labels.numpy())["ece"])


def test_concurrent_requests_train_once(make_config):
    cfg = parse_trial_config(make_config(seed=7))
    hits = []
    threads = [threading.Thread(target=lambda: hits.append(get_or_train_stage1(cfg, torch.device("cpu"))[1]))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(hits) == [False, True, True]


def test_stage1_is_deterministic_on_cpu(make_config, tmp_path):
    a, _ = get_or_train_stage1(parse_trial_config(make_config()), torch.device("cpu"))
    other = {**make_config(), "artifact_root": str(tmp_path / "other")}
    b, hit = get_or_train_stage1(parse_trial_config(other), torch.device("cpu"))
    assert not hit
    assert torch.equal(a.splits["test"].logits, b.splits["test"].logits)


def test_mixup_changes_stage1(make_config):
    plain, _ = get_or_train_stage1(parse_trial_config(make_config()), torch.device("cpu"))
    mixed, hit = get_or_train_stage1(parse_trial_config(make_config(mixup_alpha=1.0)), torch.device("cpu"))
    assert not hit and plain.stage1_id != mixed.stage1_id
    assert not torch.equal(plain.splits["test"].logits, mixed.splits["test"].logits)


class TestRunTrial:
    def test_vanilla_equals_stage1_metrics(self, make_config):
        result = run_trial(make_config(method={"name": "vanilla"}))
        artifact, _ = get_or_train_stage1(parse_trial_config(make_config()), torch.device("cpu"))
        assert result.metrics["test_ece"] == pytest.approx(artifact.record["metrics"]["test_ece"])
        assert set(result.metrics) == {f"{s}_{m}" for s in ("val", "test") for m in METRICS} | {
            "test_argmax_changed", "test_accuracy_change"}
        assert result.metrics["test_argmax_changed"] == result.metrics["test_accuracy_change"] == 0.0  # itself
        assert result.metrics["test_nll_refinement"] == pytest.approx(artifact.record["metrics"]["test_nll_refinement"])
        assert [r["stage"] for r in result.history] == ["stage1", "stage1"]

    def test_mac_cal_trial(self, make_config):
        result = run_trial(make_config(stage2_epochs=4))
        assert result.status == "ok" and result.stage1_cache_hit is False
        assert [r["stage"] for r in result.history] == ["stage1"] * 2 + ["stage2"] * 4
        assert all(0.0 <= result.metrics[f"test_{m}"] <= 1.0 for m in ("accuracy", "ece", "aece", "mce"))
        assert result.trial_id == trial_id(make_config(stage2_epochs=4))
        assert result.timings["total_seconds"] >= result.timings["method_seconds"] > 0
        assert result.environment["torch_version"] == torch.__version__

    def test_bad_config_fails_before_work(self, make_config, tmp_path):
        from calib._config import ConfigError

        with pytest.raises(ConfigError, match="retention_init"):
            run_trial(make_config(method={"name": "mac_cal", "retention_init": 0.0}))
        assert not (tmp_path / "artifacts").exists()
