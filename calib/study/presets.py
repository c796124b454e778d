"""Study presets: ``quick`` (the embedded default: offline, CPU, minutes), ``medium`` (real images,
Fashion-MNIST × ResNet-20, GPU minutes), ``full-cpu`` (all of Fashion-MNIST × LeNet-5, CPU minutes per
Stage I) and ``paper`` (the papers' protocol).

A preset fixes the setup every study shares: datasets, architecture, seeds, the Stage-I recipe, the
Stage-II optimiser and the per-trial resources. Method hyperparameters stay at their defaults (each
method's config dataclass); studies vary them explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from calib._config import field_types
from calib._registry import Registry
from calib.registries import DEFAULT_LOSS

__all__ = ["PRESETS", "Preset", "base_config", "with_preset_stage2"]

PRESETS: Registry[Preset] = Registry("preset")


@dataclass(frozen=True)
class Preset:
    """Sizes and resources of a study setup; explicit CLI flags override them."""

    name: str
    description: str
    datasets: tuple[str, ...]
    archs: tuple[str, ...]
    seeds: tuple[int, ...]
    stage1: dict[str, Any] = field(default_factory=dict)
    stage2: dict[str, Any] = field(default_factory=dict)
    dataset_archs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Architectures of a dataset that does not take ``archs`` (Tiny-ImageNet's own ResNet-50)."""
    dataset_stage1: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Stage-I changes for one dataset (Tiny-ImageNet's 100-epoch schedule), over ``stage1``."""
    device: str = "auto"
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    cpus_per_cached_trial: float | None = None
    gpus_per_cached_trial: float | None = None
    num_workers: int | None = None
    checkpoint_every: int = 1
    """Stage-I epochs between the checkpoints a retried trial resumes from."""
    gpus_if_available: bool = False
    """The GPU shares apply only where there are GPUs (a CUDA device here, or a cluster given by
    ``--address``); on a machine without one the trials ask for none and run on the CPU."""
    keep_predictions: str = "off"
    """Whether trials keep their val and test probabilities in the store (``--keep-predictions``)."""
    source: dict[str, Any] = field(default_factory=dict)
    """Where Stage I comes from when it is not trained (``TrialConfig.source``: ``--checkpoint``,
    ``--features``); empty: trained."""
    dataset_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Options per dataset that takes them (imagefolder's ``--image-size`` ...)."""
    dataset_sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    """A Stage-I source per dataset, over ``source`` (``--predictions``: one file per setup)."""
    study_seeds: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Seeds of a study (by the name its script declares) that runs fewer than ``seeds`` by default under this
    preset: the quick compare_methods, whose 41 rows train 19 Stage Is a seed."""

    def seeds_of(self, study: str | None) -> tuple[int, ...]:
        """The seeds the study its script declares as ``study`` runs by default: ``study_seeds`` or ``seeds``."""
        return self.study_seeds.get(study or "", self.seeds)

    def setups(self, datasets: Sequence[str] | None = None, archs: Sequence[str] | None = None
               ) -> list[tuple[str, str]]:
        """(dataset, architecture) pairs a study runs: explicit ``archs`` apply to every dataset."""
        return [(dataset, arch) for dataset in (datasets or self.datasets)
                for arch in (archs or self.dataset_archs.get(dataset, self.archs))]

    def stage1_for(self, dataset: str) -> dict[str, Any]:
        """The Stage-I settings of ``dataset``: ``stage1`` with ``dataset_stage1[dataset]`` over it."""
        return {**self.stage1, **self.dataset_stage1.get(dataset, {})}


PRESETS.register("quick")(Preset(
    name="quick",
    description="digits with Gaussian input noise (σ=0.3), small CNN, 60 + 40 epochs, CPU, 5 seeds "
                "(compare_methods 3)",
    datasets=("digits-noisy",),
    archs=("small_cnn",),
    seeds=(1, 2, 3, 4, 5),
    # 41 rows × 5 seeds trained 95 Stage Is: about 25 minutes on 2 cores; 3 seeds make it a coffee break.
    study_seeds={"compare_methods": (1, 2, 3)},
    stage1={"epochs": 60, "batch_size": 64, "milestones": [30, 45], "loss_reduction": "mean"},
    stage2={},
    device="cpu",
    keep_predictions="on",
))

PRESETS.register("medium")(Preset(
    name="medium",
    description="Fashion-MNIST (real 28×28 images; offline from the system package dataset-fashion-mnist) × "
                "ResNet-20, 60 epochs (×0.1 at 30 and 45), batch 128, clip 2, sum reduction; Stage II 40 epochs; "
                "3 seeds; a quarter GPU per trial where there is a GPU, else one CPU "
                "(about 2 min per epoch on 2 cores: --train-size 4000 for CPU-sized runs)",
    datasets=("fashion-mnist",),
    archs=("resnet20",),
    seeds=(1, 2, 3),
    stage1={"epochs": 60, "milestones": [30, 45], "amp": "bf16", "compile": "auto"},
    stage2={},
    device="auto",
    cpus_per_trial=1.0,
    gpus_per_trial=0.25,
    gpus_per_cached_trial=0.125,
    gpus_if_available=True,
    checkpoint_every=5,
    keep_predictions="on",
))

PRESETS.register("full-cpu")(Preset(
    name="full-cpu",
    description="all of Fashion-MNIST (55,000 train, 5,000 val) × LeNet-5 on CPUs: 20 epochs (×0.1 at 10 and 15), "
                "batch 128, SGD 0.05, wd 1e-4, clip 2, mean reduction, no augmentation (so that LeNet-5 overfits), "
                "batches from tensors held in memory; Stage II 40 epochs; 5 seeds; 1 CPU per trial",
    datasets=("fashion-mnist",),
    archs=("lenet5",),
    seeds=(1, 2, 3, 4, 5),
    # LeNet-5 has no BatchNorm: the FOCAL-R recipe's summed loss at lr 0.1 is clipped at every step and stalls
    # near 78 % train accuracy; the mean at 0.05 learns. With the 2-pixel crops it fits its training set no
    # better than the test set (90.6 % train, test ECE 1.2 %); without them it overfits (docs/studies/presets.md).
    # "device" holds the uint8 images in memory: 2.6× the images/s of the per-image PIL loader on one core.
    stage1={"epochs": 20, "milestones": [10, 15], "lr": 0.05, "weight_decay": 1e-4, "loss_reduction": "mean",
            "augment": False, "data_pipeline": "device"},
    stage2={},
    device="cpu",
    cpus_per_trial=1.0,
    checkpoint_every=5,
    keep_predictions="on",
))

PRESETS.register("paper")(Preset(
    name="paper",
    description="MaC-Cal and FeDLaS Table 1's setups: CIFAR-10/100 × ResNet-50, ResNet-101 (FeDLaS), ResNet-110 "
                "(FOCAL-R), WRN-26-10, DenseNet-121 (350 epochs, ×0.1 at 150 and 250) and Tiny-ImageNet × "
                "ResNet-50, ResNet-101 (100 epochs, ×0.1 at 40 and 60); batch 128, clip 2, sum reduction; Stage II "
                "40 epochs at lr 0.1; one GPU per Stage-I trial, a quarter GPU per trial on a trained Stage I "
                "(docs/methods.md §7.2-7.3)",
    datasets=("cifar10", "cifar100", "tiny-imagenet"),
    archs=("resnet50", "resnet101", "resnet110", "wrn26_10", "densenet121"),
    dataset_archs={"tiny-imagenet": ("resnet50_tiny", "resnet101_tiny")},
    seeds=(1,),
    # The Stage1Config defaults are the papers' CIFAR protocol; on CUDA: bf16 autocast, the training step
    # compiled in the mode measured fastest per architecture, data held on the GPU (data_pipeline auto).
    stage1={"amp": "bf16", "compile": "auto"},
    dataset_stage1={"tiny-imagenet": {"epochs": 100, "milestones": [40, 60]}},
    stage2={},
    device="auto",
    cpus_per_trial=4.0,
    gpus_per_trial=1.0,
    cpus_per_cached_trial=2.0,
    gpus_per_cached_trial=0.25,
    checkpoint_every=10,
))


def base_config(
    preset: Preset,
    *,
    study: str,
    dataset: str,
    seed: int,
    method: dict[str, Any],
    arch: str | None = None,
    data_root: str,
    artifact_root: str,
    download: bool = False,
    device: str | None = None,
    loss: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A plain trial-config dict for ``preset``; ``method`` is ``{"name": ..., **params}``; ``arch``
    defaults to the dataset's first architecture.

    The preset's Stage-II settings apply to two-stage methods only (those with an ``epochs`` field).
    """
    config = {
        "study": study,
        "seed": seed,
        "dataset": dataset,
        "arch": arch or preset.setups([dataset])[0][1],
        "stage1": preset.stage1_for(dataset),
        "loss": dict(loss or {"name": DEFAULT_LOSS}),
        "method": dict(method),
        "data_root": data_root,
        "artifact_root": artifact_root,
        "download": download,
        "device": device or preset.device,
        "num_workers": preset.num_workers,
    }
    if source := preset.dataset_sources.get(dataset, preset.source):
        config["source"] = dict(source)
    if preset.dataset_options.get(dataset):
        config["dataset_options"] = dict(preset.dataset_options[dataset])
    return with_preset_stage2(preset, config)


def with_preset_stage2(preset: Preset, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the preset's Stage-II settings filled into its method section, for the fields
    the method has (two-stage methods); values the method section sets itself win."""
    # lazy: calib.methods imports torch; a preset is read without it (a study's --help)
    from calib.methods import METHODS

    method = config["method"]
    fields = field_types(METHODS.get(method["name"]).config)
    stage2 = {k: v for k, v in preset.stage2.items() if k in fields}
    return {**config, "method": {**stage2, **method}}
