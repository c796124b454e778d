"""run_trial end to end for TST, V-TST, temperature scaling and SMART on one shared Stage-I artifact."""

import math

import torch

from calib.artifacts import get_or_train_stage1
from calib.config import parse_trial_config
from calib.methods import METHODS
from calib.metrics import METRICS
from calib.trial import run_trial

METHOD_PARAMS = [
    {"name": "tst", "epochs": 2},
    {"name": "vtst", "epochs": 2, "num_samples": 2},
    {"name": "temperature_scaling"},
    {"name": "temperature_scaling", "objective": "ece", "optimizer": "grid"},
    {"name": "smart", "max_epochs": 100},
]


def test_methods_share_one_stage1_artifact(make_config):
    vanilla = run_trial(make_config(method={"name": "vanilla"}))
    results = [run_trial(make_config(method=method)) for method in METHOD_PARAMS]
    assert vanilla.stage1_cache_hit is False and all(r.stage1_cache_hit is True for r in results)
    assert {r.stage1_id for r in results} == {vanilla.stage1_id}
    for method, result in zip(METHOD_PARAMS, results, strict=True):
        assert result.status == "ok", method
        assert set(result.metrics) == set(vanilla.metrics)
        for name, value in result.metrics.items():
            low, high = METRICS[name.split("_", 1)[1]].bounds
            assert math.isfinite(value) and low <= value <= high, (method, name, value)
        assert all(0.0 <= result.metrics[f"{s}_{m}"] <= 1.0 for s in ("val", "test") for m in ("accuracy", "ece"))
        stage2 = [r["epoch"] for r in result.history if r["stage"] == "stage2"]
        assert stage2 == ([0, 1] if method["name"] in ("tst", "vtst") else [])
        if method["name"] in ("temperature_scaling", "smart"):  # the argmax, hence accuracy, is unchanged
            assert result.metrics["test_accuracy"] == vanilla.metrics["test_accuracy"]
            assert result.metrics["val_accuracy"] == vanilla.metrics["val_accuracy"]


def test_the_fitted_temperature_is_readable(make_config):
    cfg = parse_trial_config(make_config(method={"name": "temperature_scaling"}))
    artifact, _ = get_or_train_stage1(cfg, torch.device("cpu"))
    outcome = METHODS.get("temperature_scaling")(cfg.method.params, artifact, seed=1, device=torch.device("cpu"))
    temperature = outcome.predict.calibrator.temperature.item()
    assert temperature > 0
    test = artifact.splits["test"]
    torch.testing.assert_close(outcome.test_probs, (test.logits.double() / temperature).softmax(1))
