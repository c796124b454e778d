"""The trial config: what one call of ``run_trial`` trains and evaluates.

A trial config is a plain, JSON-serialisable dict (what Ray Tune passes around and what the search
spaces address with dotted keys such as ``method.accuracy_weight`` or ``stage1.mixup_alpha``)::

    {"study": "sensitivity_gamma", "seed": 1, "dataset": "digits-noisy", "arch": "small_cnn",
     "stage1": {...Stage1Config fields...},
     "loss": {"name": "cross_entropy", ...that loss's fields...},
     "method": {"name": "mac_cal", ...that method's fields...},
     "data_root": "/abs/data", "artifact_root": "/abs/results/artifacts", ...}

:func:`parse_trial_config` validates it into a frozen :class:`TrialConfig`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from calib import storage
from calib._config import (
    ConfigError,
    check,
    did_you_mean,
    field_types,
    from_dict,
    get_dotted,
    named_section,
    set_dotted,
)
from calib._registry import Registry
from calib.datasets import dataset_options
from calib.datasets.corruptions import C_DIRECTORY, CORRUPTIONS
from calib.datasets.subsets import check_train_size
from calib.models import check_arch
from calib.registries import DATASETS, DEFAULT_LOSS, LOSSES, METHODS, OOD_SETS, PROCEDURES
from calib.seeds import SEED_LIMIT, check_seed, is_seed, seed_rule
from calib.stage1_source import FILE_KINDS, Stage1Source, check_config_fits_given_stage1

__all__ = [
    "ADDED_FIELDS",
    "SEED_LIMIT",
    "Component",
    "Stage1Config",
    "TrialConfig",
    "added_fields",
    "check_seed",
    "check_trial_config_keys",
    "config_hash",
    "get_dotted",
    "is_seed",
    "parse_trial_config",
    "seed_rule",
    "set_dotted",
    "stage1_identity",
    "trial_id",
    "trial_identity",
    "validate_study_name",
]


@dataclass(frozen=True, init=False)
class Stage1Config:
    """Stage-I training (docs/methods.md §7.2). Defaults are the papers' CIFAR protocol (FOCAL-R).

    Its keys are these fields and each registered training procedure's (``mixup_alpha``, ``mit_alpha``, ``plp_gamma``,
    ``balcal_delta``, a plugin's: :mod:`calib.training.procedures`), read as attributes (``stage1.mixup_alpha``);
    ``procedures`` holds each one's config by name.

    Attributes:
        epochs: training epochs (350 in the papers).
        batch_size: minibatch size (128).
        lr: initial SGD learning rate (0.1).
        momentum: SGD momentum (0.9).
        weight_decay: L2 weight decay (5e-4).
        milestones: epochs at which the learning rate is multiplied by ``lr_decay`` ((150, 250)).
        lr_decay: multiplicative learning-rate decay at each milestone (0.1).
        grad_clip: max L2 norm of the gradient, ``None`` for no clipping (2.0).
        loss_reduction: "sum" over the batch (FOCAL-R, which MaC-Cal uses) or "mean" (ACLS/FeDLaS).
        checkpoint: the model kept: the "last" epoch (FOCAL-R's default) or the "best_val" accuracy.
        scheduler_step: when the learning-rate schedule advances: at the "epoch_end" (PyTorch's
            convention), or at the "epoch_start" as FOCAL-R's ``train.py`` does, which moves every decay
            one epoch earlier (docs/methods.md §7.2 pitfall).
        train_size: train on a stratified sample of this many images of the training split (drawn
            with seed 1, the same for every seed and method), ``None`` for all of it. The rest is the
            held-out part of the training data that MaC-Cal's ``stats_source="heldout"`` reads. For
            CPU-sized runs of a large dataset and for data-size studies.
        augment: train on the dataset's augmented images (its random crops and flips, e.g. Fashion-MNIST's
            2-pixel crop); false trains on the plain training images, as they are evaluated, which lets a small
            model such as LeNet-5 fit its training set and become overconfident (the full-cpu preset).
        amp: mixed precision on CUDA: "off", "bf16" or "fp16" autocast of the forward pass (fp16 with
            a gradient scaler); the loss is computed in float32. Ignored on the CPU. The Stage-I
            feature extraction that feeds Stage II runs in the same precision.

    How Stage I runs, without changing what it trains (these three are not part of the Stage-I
    identity: an artifact trained either way serves every trial; the store records what ran):

        data_pipeline: "device" holds the dataset as tensors on the training device and crops, flips
            and normalises each batch there (the same distribution as the loaders' torchvision
            transforms); "loader" feeds batches from a DataLoader; "auto" (default) is "device" on
            CUDA when the dataset has a tensor view that takes at most a quarter of the free GPU
            memory, else "loader" (so nothing changes on the CPU).
        compile: ``torch.compile`` mode of the training step on CUDA: "off" (default), a mode
            ("default", "reduce-overhead" = CUDA graphs, "max-autotune", "max-autotune-no-cudagraphs"),
            or "auto", the mode ``benchmarks/gpu_throughput.py`` measured fastest for the
            architecture (:data:`calib.training.compile.COMPILE_MODES`). Ignored on the CPU.
        channels_last: NHWC memory format for the model and its inputs on CUDA (default true).
    """

    epochs: int = 350
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    milestones: tuple[int, ...] = (150, 250)
    lr_decay: float = 0.1
    grad_clip: float | None = 2.0
    loss_reduction: Literal["mean", "sum"] = "sum"
    checkpoint: Literal["last", "best_val"] = "last"
    scheduler_step: Literal["epoch_end", "epoch_start"] = "epoch_end"
    train_size: int | None = None
    augment: bool = True
    amp: Literal["off", "bf16", "fp16"] = "off"
    data_pipeline: Literal["auto", "device", "loader"] = "auto"
    compile: Literal["off", "auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "off"
    channels_last: bool = True
    procedures: dict[str, Any] = dataclasses.field(default_factory=dict, init=False, repr=False, hash=False)

    EXECUTION_FIELDS: ClassVar[tuple[str, ...]] = ("data_pipeline", "compile", "channels_last")
    """Fields that change how Stage I runs, not what it trains: left out of the trial and Stage-I ids."""

    def __post_init__(self) -> None:
        check(self.epochs >= 1, "stage1.epochs", self.epochs, "be an integer >= 1",
              "It is the number of Stage-I training epochs, which a study's --epochs sets.")
        check(self.batch_size >= 1, "stage1.batch_size", self.batch_size, "be an integer >= 1")
        check(self.lr > 0, "stage1.lr", self.lr, "be > 0")
        check(0 <= self.momentum < 1, "stage1.momentum", self.momentum, "be in [0, 1)")
        check(self.weight_decay >= 0, "stage1.weight_decay", self.weight_decay, "be >= 0")
        check(
            all(0 < m for m in self.milestones) and list(self.milestones) == sorted(self.milestones),
            "stage1.milestones", self.milestones, "be increasing positive epochs",
        )
        check(0 < self.lr_decay <= 1, "stage1.lr_decay", self.lr_decay, "be in (0, 1]")
        check(self.grad_clip is None or self.grad_clip > 0, "stage1.grad_clip", self.grad_clip,
              "be > 0 or null (no clipping)")
        check(self.train_size is None or self.train_size >= 1, "stage1.train_size", self.train_size,
              "be an integer >= 1 (training images Stage I trains on), or null for the whole training split")

    def __init__(self, **values: Any) -> None:
        own = {f.name: f for f in dataclasses.fields(Stage1Config) if f.init}
        specs = PROCEDURES.items()
        unknown = sorted(set(values) - set(own) - {k for _, spec in specs for k in field_types(spec.config)})
        if unknown:
            raise TypeError(f"Stage1Config got unexpected keyword argument(s) {', '.join(map(repr, unknown))}.")
        for name, f in own.items():
            object.__setattr__(self, name, values[name] if name in values else
                               f.default if f.default is not dataclasses.MISSING else f.default_factory())
        self.__post_init__()
        object.__setattr__(self, "procedures", {name: spec.config(**{k: values[k] for k in field_types(spec.config)
                                                                     if k in values}) for name, spec in specs})
        _check_one_batch_loss(self)

    @classmethod
    def joined_configs(cls) -> tuple[type, ...]:
        """The registered training procedures' config classes: their fields are ``stage1`` keys too."""
        return tuple(spec.config for _, spec in PROCEDURES.items())

    def __getattr__(self, name: str) -> Any:  # a name that is no attribute: a training procedure's field
        for params in self.__dict__.get("procedures", {}).values():
            if name in field_types(type(params)):
                return getattr(params, name)
        raise AttributeError(f"Stage1Config has no field {name!r}.")

    def on(self) -> list[tuple[str, Any]]:
        """(name, spec) of the training procedures this config turns on, in registration order."""
        return [(name, spec) for name, spec in PROCEDURES.items() if spec.is_on(self.procedures[name])]

    def to_dict(self) -> dict[str, Any]:
        """The ``stage1`` section as a plain dict: the own fields, then each procedure's."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        for params in self.procedures.values():
            out.update(dataclasses.asdict(params))
        return _plain(out)


def _check_one_batch_loss(s1: Stage1Config) -> None:
    """At most one procedure that computes a batch's loss itself (Mixup, MIT, BalCAL) is on."""
    losses = [(name, spec) for name, spec in s1.on() if spec.computes_batch_loss]
    if len(losses) > 1:
        (_, last), others = losses[-1], [spec for _, spec in losses[:-1]]
        got = ", ".join(f"stage1.{spec.switch}={getattr(s1, spec.switch)!r}" for _, spec in losses)
        raise ConfigError(
            f"`stage1.{last.switch}` {last.excluded_because}: set {' and '.join(f'stage1.{o.switch}' for o in others)} "
            f"to null ({', '.join(spec.label or name for name, spec in losses)} each compute a batch's loss and "
            f"exclude each other), got {got}."
        )


@dataclass(frozen=True)
class Component:
    """A registered name plus its validated config dataclass (a loss or a method)."""

    name: str
    params: Any

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **_plain(dataclasses.asdict(self.params))}


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """One trial: identity, the Stage-I recipe, the loss, the method and where files live.

    ``seed`` seeds Stage I (initialisation, minibatch order, augmentation, Mixup draws) and the data splits;
    ``stage2_seed`` seeds what the method draws on top of it (MaC-Cal's masks and head initialisation, TST/V-TST
    head initialisation, minibatch order and sampling, a random post-hoc fit such as SMART or PTS).
    ``parse_trial_config`` fills in ``seed`` for a ``stage2_seed`` left at None (the default), and the trial
    identity leaves it out where it equals ``seed``, so the trials stored before it existed keep their ids.
    """

    study: str
    seed: int
    dataset: str
    arch: str
    stage1: Stage1Config
    loss: Component
    method: Component
    data_root: str
    artifact_root: str
    download: bool = False
    device: str = "auto"
    num_bins: int = 15
    num_workers: int | None = None
    cifar100_test_norm: Literal["cifar", "focal_bug"] = "cifar"
    ood_datasets: tuple[str, ...] = ()
    corruptions: tuple[str, ...] = ()
    label: str = ""
    label_rank: int = 0
    search_trial: int | None = None
    """The number of the Optuna trial of a search that ran this config (one of its replicates), else None:
    bookkeeping, left out of the trial id."""
    source: Stage1Source = dataclasses.field(default_factory=Stage1Source)
    dataset_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    stage2_seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plain-dict form that :func:`parse_trial_config` reads back."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (Component, Stage1Config)):
                out[f.name] = value.to_dict()
            elif dataclasses.is_dataclass(value):
                out[f.name] = _plain(dataclasses.asdict(value))
            else:
                out[f.name] = _plain(value)
        return out


_TOP_LEVEL = {f.name for f in dataclasses.fields(TrialConfig)}
# Keys that say where and how a trial runs or how a study names it, not what it computes: excluded from
# the identity hashes.
_PLACEMENT_KEYS = ("data_root", "artifact_root", "download", "device", "num_workers", "label", "label_rank",
                   "search_trial")


_STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def validate_study_name(study: str) -> str:
    """A study name is a store partition and a directory name: letters, digits, '_', '-', '.'."""
    if not isinstance(study, str) or not _STUDY_NAME.match(study):
        raise ConfigError(
            f"`study` must start with a letter or digit and contain only letters, digits, '_', '-' and '.', "
            f"got study={study!r}."
        )
    return study


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _component(registry: Registry, data: Any, key: str) -> Component:
    if isinstance(data, Component):
        return data
    name, params = named_section(data, key)
    name = registry.canonical(name)  # a renamed component's former name reads as its name
    return Component(name, from_dict(registry.get(name).config, params, prefix=f"{key}."))


def check_trial_config_keys(data: Mapping[str, Any]) -> None:
    """Every key of the trial-config dict ``data`` is a :class:`TrialConfig` field; an unknown one is a
    :class:`ConfigError` listing the valid keys and the closest ones."""
    unknown = sorted(set(data) - _TOP_LEVEL, key=str)
    if unknown:
        raise ConfigError(
            f"Unknown trial config key(s) {', '.join(map(repr, unknown))}. Valid keys: {', '.join(sorted(_TOP_LEVEL))}."
            f"{did_you_mean(unknown, _TOP_LEVEL)}"
        )


def parse_trial_config(data: dict[str, Any] | TrialConfig) -> TrialConfig:
    """Validate a plain trial-config dict; any bad key or value raises ``ConfigError``/``KeyError``."""
    if isinstance(data, TrialConfig):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"A trial config must be a mapping of trial config keys, got {data!r}.")
    check_trial_config_keys(data)
    missing = sorted(k for k in ("study", "seed", "dataset", "arch", "method", "data_root", "artifact_root")
                     if k not in data)
    if missing:
        raise ConfigError(f"Trial config is missing required key(s): {', '.join(missing)}.")
    validate_study_name(data["study"])
    source = data.get("source") or {}
    source = source if isinstance(source, Stage1Source) else from_dict(Stage1Source, source, prefix="source.")
    if source.kind in FILE_KINDS:
        for key in ("dataset", "arch"):
            check(isinstance(data[key], str) and _STUDY_NAME.match(data[key]) is not None, key, data[key],
                  f"be a name (letters, digits, '_', '-', '.') for the {source.kind} file's data and model: a "
                  f"{source.kind} Stage I (source.kind={source.kind!r}) reads no registered dataset or architecture")
    else:
        DATASETS.get(data["dataset"])
        check_arch(data["arch"])
    check(isinstance(data["data_root"], str) and os.path.isabs(data["data_root"]), "data_root", data["data_root"],
          "be an absolute path (Ray Tune changes each trial's working directory)")
    check(isinstance(data["artifact_root"], str) and (os.path.isabs(data["artifact_root"])
                                                      or storage.is_remote(data["artifact_root"])),
          "artifact_root", data["artifact_root"],
          "be an absolute path or an object-store URI such as s3://bucket/prefix "
          "(Ray Tune changes each trial's working directory)")
    fields: dict[str, Any] = {k: v for k, v in data.items() if k not in ("stage1", "loss", "method")}
    fields["source"] = source
    options = data.get("dataset_options") or {}
    if source.kind in FILE_KINDS:
        check(not options, "dataset_options", options, f"be empty for a {source.kind} Stage I (no dataset is read)")
    fields["dataset_options"] = {} if source.kind in FILE_KINDS else dataset_options(data["dataset"], options)
    fields["stage1"] = from_dict(Stage1Config, data.get("stage1", {}), prefix="stage1.") \
        if not isinstance(data.get("stage1"), Stage1Config) else data["stage1"]
    fields["loss"] = _component(LOSSES, data.get("loss", DEFAULT_LOSS), "loss")
    fields["method"] = _component(METHODS, data["method"], "method")
    if fields.get("stage2_seed") is None:
        fields["stage2_seed"] = data["seed"]
    cfg = from_dict(TrialConfig, fields)
    for key in ("seed", "stage2_seed"):
        check_seed(getattr(cfg, key), key, why="it seeds Python, NumPy and torch; NumPy's seeding takes no other")
    if cfg.source.kind != "train":
        check_config_fits_given_stage1(cfg)
        if cfg.source.kind in FILE_KINDS:
            return cfg
    info = DATASETS.get(cfg.dataset)
    if cfg.stage1.train_size is not None:
        check_train_size(cfg.stage1.train_size, info.num_classes, info.train_images, cfg.dataset)
    calibration_size = getattr(cfg.method.params, "calibration_size", None)
    if calibration_size is not None and info.val_images is not None:
        check(calibration_size <= info.val_images, "method.calibration_size", calibration_size,
              f"be at most the {info.val_images} images of {cfg.dataset}'s validation split",
              "Leave it null (the default) to calibrate on all of them.")
    spec = METHODS.get(cfg.method.name)
    if spec.check is not None:
        spec.check(cfg.method.params, cfg)
    check(cfg.num_bins >= 1, "num_bins", cfg.num_bins, "be an integer >= 1")
    check(cfg.num_workers is None or cfg.num_workers >= 0, "num_workers", cfg.num_workers,
          "be an integer >= 0, or null to size the DataLoader workers from the trial's CPUs")
    check(cfg.cifar100_test_norm == "cifar" or cfg.dataset == "cifar100", "cifar100_test_norm",
          cfg.cifar100_test_norm, "be 'cifar' unless the dataset is 'cifar100'")
    for name in cfg.corruptions:
        check(name in CORRUPTIONS, "corruptions", cfg.corruptions, f"name corruptions from {', '.join(CORRUPTIONS)}")
    if cfg.corruptions:
        check(cfg.dataset in C_DIRECTORY, "corruptions", cfg.corruptions,
              f"be empty for {cfg.dataset!r}: corrupted test sets exist for {', '.join(C_DIRECTORY)}")
    for name in cfg.ood_datasets:
        compatible = OOD_SETS.get(name).compatible
        check(cfg.dataset in compatible, "ood_datasets", cfg.ood_datasets,
              f"hold OOD sets in the input format of {cfg.dataset!r}; {name!r} fits {', '.join(compatible)}")
    check(cfg.device in ("auto", "cpu") or re.fullmatch(r"cuda(:\d+)?", cfg.device) is not None, "device",
          cfg.device, "be 'auto', 'cpu', 'cuda' or 'cuda:N' (N a GPU index)")
    return cfg


ADDED_FIELDS: dict[str, dict[str, Any]] = {
    "stage1": {"train_size": None, "augment": True},
    "source": {"labels_sha256": None, "calibration_fraction": None},
}
"""Fields added after results were stored, per section ("stage1", "source"), with their defaults; a method's or
a loss's own are its spec's ``added_fields``, a training procedure's its config's fields unless its spec says
``identity_at_default`` (:func:`added_fields`). At its default such a field is left out of the
identity hashes, so the trials and Stage-I artifacts stored before it existed keep their ids (a re-run skips them
instead of training them again). The top-level ``stage2_seed`` is left out where it equals ``seed`` (its default)."""


def added_fields(section: str, name: str | None = None) -> dict[str, Any]:
    """The added fields (with their defaults) of ``section`` "stage1" or "source", or of the method or loss
    ``name`` (``section`` "method" or "loss")."""
    if section in ("method", "loss"):
        registry = METHODS if section == "method" else LOSSES
        return dict(registry.get(name).added_fields) if name in registry else {}
    if section == "stage1":
        procedures = {f.name: f.default for _, spec in PROCEDURES.items() if not spec.identity_at_default
                      for f in dataclasses.fields(spec.config) if f.init}
        return {**ADDED_FIELDS["stage1"], **procedures}
    return ADDED_FIELDS.get(section, {})


def _without_added(values: dict[str, Any], section: str, name: str | None = None) -> dict[str, Any]:
    added = added_fields(section, name)
    return {k: v for k, v in values.items() if not (k in added and v == added[k])}


def stage1_identity(cfg: TrialConfig) -> dict[str, Any]:
    """Exactly the config fields that change Stage I (docs/architecture.md contract 3).

    A given Stage I (``source``) is identified by its file's SHA-256: a checkpoint with the dataset, its
    options, the architecture and how the splits are computed (no seed: nothing is trained); a features
    file by the file alone; a predictions file by the file and the split (its calibration share and the seed)."""
    source = cfg.source
    if source.kind == "features":
        return {"source": {"kind": "features", "sha256": source.sha256}}
    if source.kind == "predictions":  # the seed draws the calibration/test split
        return {"source": {"kind": "predictions", "sha256": source.sha256, "labels_sha256": source.labels_sha256,
                           "calibration_fraction": source.calibration_fraction}, "seed": cfg.seed}
    stage1 = _trained(cfg.stage1.to_dict())
    identity: dict[str, Any] = {"dataset": cfg.dataset, "arch": cfg.arch}
    if source.kind == "checkpoint":
        identity["source"] = {"kind": "checkpoint", "sha256": source.sha256, "head": source.head}
        identity["stage1"] = {k: v for k, v in stage1.items() if k in ("train_size", "amp")}
    else:
        identity.update(seed=cfg.seed, stage1=stage1, loss=_without_added(cfg.loss.to_dict(), "loss", cfg.loss.name))
    identity["cifar100_test_norm"] = cfg.cifar100_test_norm
    if cfg.dataset_options:
        identity["dataset_options"] = dict(cfg.dataset_options)
    return identity


def _trained(stage1: dict[str, Any]) -> dict[str, Any]:
    """The Stage-I section without :attr:`Stage1Config.EXECUTION_FIELDS` and added fields at their default."""
    return _without_added({k: v for k, v in stage1.items() if k not in Stage1Config.EXECUTION_FIELDS}, "stage1")


def trial_identity(cfg: TrialConfig) -> dict[str, Any]:
    """Everything that changes a trial's result: the config without its placement keys."""
    identity = {k: v for k, v in cfg.to_dict().items() if k not in _PLACEMENT_KEYS}
    method = identity["method"]
    if cfg.source == Stage1Source():
        del identity["source"]
    else:  # the file is its hash; where it lies is placement
        source = {k: v for k, v in identity["source"].items() if k not in ("path", "labels_path")}
        identity["source"] = _without_added(source, "source")
    if not cfg.dataset_options:
        del identity["dataset_options"]
    if cfg.stage2_seed in (None, cfg.seed):
        del identity["stage2_seed"]
    return {**identity, "stage1": _trained(identity["stage1"]),
            "loss": _without_added(identity["loss"], "loss", identity["loss"]["name"]),
            "method": {**_without_added(method, "method", method["name"]), "name": _identity_name(method["name"])}}


def _identity_name(method: str) -> str:
    """The name a method's trial ids hash: its ``former_name`` when it was renamed after its results were stored
    (:class:`~calib.methods.MethodSpec`), so those trials keep their ids; else its name."""
    return (METHODS.get(method).former_name if method in METHODS else None) or method


def config_hash(identity: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of the canonical JSON of ``identity``."""
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def trial_id(config: dict[str, Any] | TrialConfig) -> str:
    """The store key of a trial: the hash of its config without paths and placement."""
    return config_hash(trial_identity(parse_trial_config(config)))
