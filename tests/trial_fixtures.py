"""A tiny quick-preset trial config on digits-noisy (a few epochs, CPU), shared by the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_config(tmp_path: Path, *, method: dict[str, Any] | None = None, seed: int = 1,
                study: str = "test", epochs: int = 2, stage2_epochs: int = 3, **stage1: Any) -> dict[str, Any]:
    """A valid trial config that trains in about a second."""
    method = dict(method or {"name": "mac_cal"})
    if method["name"] == "mac_cal":
        method.setdefault("epochs", stage2_epochs)
    return {
        "study": study, "seed": seed, "dataset": "digits-noisy", "arch": "small_cnn",
        "stage1": {"epochs": epochs, "batch_size": 64, "milestones": [], "loss_reduction": "mean", **stage1},
        "loss": {"name": "cross_entropy"}, "method": method,
        "data_root": str(tmp_path / "data"), "artifact_root": str(tmp_path / "artifacts"), "device": "cpu",
    }
