"""Study presets: ``quick`` (the embedded default: offline, CPU, minutes) and ``paper`` (the seeds' protocol).

A preset fixes the setup every study shares: datasets, architecture, seeds, the Stage-I recipe, the
Stage-II optimiser and the per-trial resources. Method hyperparameters stay at their defaults (each
method's config dataclass); studies vary them explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from calib._registry import Registry

__all__ = ["PRESETS", "Preset", "base_config", "with_preset_stage2"]

PRESETS: Registry[Preset] = Registry("preset")


@dataclass(frozen=True)
class Preset:
    """Sizes and resources of a study setup; explicit CLI flags override them."""

    name: str
    description: str
    datasets: tuple[str, ...]
    arch: str
    seeds: tuple[int, ...]
    stage1: dict[str, Any] = field(default_factory=dict)
    stage2: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    cpus_per_cached_trial: float | None = None
    gpus_per_cached_trial: float | None = None
    num_workers: int | None = None


PRESETS.register("quick")(Preset(
    name="quick",
    description="digits with Gaussian input noise (σ=0.3), small CNN, 60 + 40 epochs, CPU, 5 seeds",
    datasets=("digits-noisy",),
    arch="small_cnn",
    seeds=(1, 2, 3, 4, 5),
    stage1={"epochs": 60, "batch_size": 64, "milestones": [30, 45], "loss_reduction": "mean"},
    stage2={},
    device="cpu",
))

PRESETS.register("paper")(Preset(
    name="paper",
    description="CIFAR-10/100, ResNet-110 (FOCAL-R), 350 epochs (×0.1 at 150, 250), batch 128, clip 2, sum "
                "reduction; Stage II 40 epochs at lr 0.1; one GPU per trial (METHODS.md §7.2)",
    datasets=("cifar10", "cifar100"),
    arch="resnet110",
    seeds=(1,),
    stage1={},  # the Stage1Config defaults are the paper's protocol
    stage2={},
    device="auto",
    cpus_per_trial=4.0,
    gpus_per_trial=1.0,
    cpus_per_cached_trial=2.0,
    gpus_per_cached_trial=0.25,
))


def base_config(
    preset: Preset,
    *,
    study: str,
    dataset: str,
    seed: int,
    method: dict[str, Any],
    data_root: str,
    artifact_root: str,
    download: bool = False,
    device: str | None = None,
    loss: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A plain trial-config dict for ``preset``; ``method`` is ``{"name": ..., **params}``.

    The preset's Stage-II settings apply to two-stage methods only (those with an ``epochs`` field).
    """
    config = {
        "study": study,
        "seed": seed,
        "dataset": dataset,
        "arch": preset.arch,
        "stage1": dict(preset.stage1),
        "loss": dict(loss or {"name": "cross_entropy"}),
        "method": dict(method),
        "data_root": data_root,
        "artifact_root": artifact_root,
        "download": download,
        "device": device or preset.device,
        "num_workers": preset.num_workers,
    }
    return with_preset_stage2(preset, config)


def with_preset_stage2(preset: Preset, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the preset's Stage-II settings filled into its method section, for the fields
    the method has (two-stage methods); values the method section sets itself win."""
    from calib._config import field_types
    from calib.methods import METHODS

    method = config["method"]
    fields = field_types(METHODS.get(method["name"]).config)
    stage2 = {k: v for k, v in preset.stage2.items() if k in fields}
    return {**config, "method": {**stage2, **method}}
