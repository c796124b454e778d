"""Command-line plumbing shared by the study scripts: common flags, paths, and clean error exits."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from calib import storage
from calib._config import ConfigError
from calib._help import HelpFormatter
from calib._registry import UnknownNameError
from calib.config import SEED_LIMIT, Stage1Config
from calib.datasets import DATASETS, DatasetNotFoundError
from calib.exit_codes import ExitCode
from calib.models import check_arch
from calib.presets import PRESETS, Preset
from calib.search.execution import DEFAULT_CONFIGS_PER_TRIAL, ExecutionOptions
from calib.tracking import check_trackers

__all__ = [
    "HelpFormatter",
    "StudyPaths",
    "add_common_args",
    "add_predictions_args",
    "execution_options",
    "guarded_main",
    "machine_resources",
    "preset_of",
    "require_datasets",
    "settings_line",
    "study_exit_code",
    "study_parser",
    "study_paths",
    "study_setups",
]


def study_parser(description: str | None, *, study: str | None, study_default: str | None = None
                 ) -> argparse.ArgumentParser:
    """The argument parser of a study script: its docstring as description, the common flags.
    ``study_default`` describes the study name when ``study`` is None (derived from other flags)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    add_common_args(parser, study=study, study_default=study_default)
    return parser


def _per_preset(value_of: Callable[[Preset], object]) -> str:
    """``"quick: 60; paper: 350"`` (or the one value when every preset agrees), for ``--help``."""
    values = {name: value_of(PRESETS.get(name)) for name in PRESETS.names()}
    shown = {name: f"{v:g}" if isinstance(v, float) else str(v) for name, v in values.items()}
    if len(set(shown.values())) == 1:
        return next(iter(shown.values()))
    return "; ".join(f"{name}: {text}" for name, text in shown.items())


def _words(values: Sequence[object]) -> str:
    return " ".join(map(str, values))


def _archs_of(preset: Preset) -> str:
    special = [f"{d}: {_words(a)}" for d, a in preset.dataset_archs.items()]
    return _words(preset.archs) + (f" ({', '.join(special)})" if special else "")


def _epochs_of(preset: Preset) -> str:
    epochs = preset.stage1.get("epochs", Stage1Config.epochs)
    special = [f"{d}: {s['epochs']}" for d, s in preset.dataset_stage1.items() if "epochs" in s]
    return f"{epochs}" + (f" ({', '.join(special)})" if special else "")


def _stage2_epochs_of(preset: Preset) -> str:
    from calib._config import field_types
    from calib.methods import METHODS

    if "epochs" in preset.stage2:
        return str(preset.stage2["epochs"])
    defaults = sorted({METHODS.get(name).config.epochs for name in METHODS.names()
                       if "epochs" in field_types(METHODS.get(name).config)})
    return "/".join(map(str, defaults)) + " (the method's own)"


def _resource_of(name: str, fallback: str | None = None) -> Callable[[Preset], object]:
    def value_of(preset: Preset) -> object:
        value = getattr(preset, name)
        value = getattr(preset, fallback) if value is None and fallback else value
        return f"{value} (0 without a GPU)" if name.startswith("gpus") and preset.gpus_if_available else value
    return value_of


def add_common_args(parser: argparse.ArgumentParser, *, study: str | None, study_default: str | None = None) -> None:
    """Flags every study shares: preset, paths, seeds, and where/how trials run. Defaults that the
    preset decides are listed per preset in ``--help``."""
    parser.add_argument("--preset", default="quick", choices=PRESETS.names(),
                        help="study setup: quick = offline CPU minutes; medium = real images (Fashion-MNIST × "
                             "ResNet-20), GPU minutes; paper = the papers' protocol on GPUs")
    parser.add_argument("--study", default=study, help="study name: the store partition (study=<name>)"
                        + (f" (default: {study_default})" if study_default else ""))
    parser.add_argument("--store", default="results", help="result-store directory or s3:// URI")
    parser.add_argument("--artifacts", default=None,
                        help="Stage-I artifact directory or s3:// URI (default: <store>/artifacts)")
    parser.add_argument("--data-root", default="data", help="directory holding the datasets")
    parser.add_argument("--download", action="store_true", help="download missing datasets into --data-root")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help=f"seeds (default: {_per_preset(lambda p: _words(p.seeds))})")
    parser.add_argument("--datasets", nargs="+", default=None,
                        help=f"datasets (default: {_per_preset(lambda p: _words(p.datasets))})")
    parser.add_argument("--archs", "--arch", nargs="+", default=None,
                        help=f"architectures, applied to every dataset (default: {_per_preset(_archs_of)})")
    parser.add_argument("--device", default=None,
                        help=f"auto, cpu, cuda or cuda:N (default: {_per_preset(lambda p: p.device)})")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join ('auto' or host:port) (default: start Ray on this machine)")
    parser.add_argument("--cpus-per-trial", type=float, default=None,
                        help=f"CPUs of a trial that trains its Stage I (default: "
                             f"{_per_preset(_resource_of('cpus_per_trial'))})")
    parser.add_argument("--gpus-per-trial", type=float, default=None,
                        help=f"GPUs of a trial that trains its Stage I, fractions allowed (default: "
                             f"{_per_preset(_resource_of('gpus_per_trial'))})")
    parser.add_argument("--cpus-per-cached-trial", type=float, default=None,
                        help=f"CPUs of a trial whose Stage I is already trained (default: "
                             f"{_per_preset(_resource_of('cpus_per_cached_trial', 'cpus_per_trial'))})")
    parser.add_argument("--gpus-per-cached-trial", type=float, default=None,
                        help=f"GPUs of a trial whose Stage I is already trained, fractions allowed (default: "
                             f"{_per_preset(_resource_of('gpus_per_cached_trial', 'gpus_per_trial'))})")
    parser.add_argument("--max-failures", type=int, default=0,
                        help="retries of a failed trial; a trial training Stage I resumes from its last checkpoint")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help=f"Stage-I epochs between the checkpoints a retry resumes from (default: "
                             f"{_per_preset(lambda p: p.checkpoint_every)})")
    parser.add_argument("--checkpoint-min-seconds", type=float, default=60.0,
                        help="least seconds between two Stage-I checkpoints of a trial; 0 checkpoints every "
                             "--checkpoint-every epochs however fast they are")
    parser.add_argument("--storage", default=None,
                        help="Ray Tune's experiment storage, a path or s3:// URI (default: <store>/_ray)")
    parser.add_argument("--max-concurrent", type=int, default=None,
                        help="cap on trials running at once (default: as many as the resources allow)")
    parser.add_argument("--configs-per-trial", type=int, default=None,
                        help=f"trials on an already trained Stage I that one Ray trial runs, their Stage II "
                             f"trained together as one population; 1 runs each alone (default: "
                             f"{DEFAULT_CONFIGS_PER_TRIAL}, and 1 in a search whose space changes Stage I)")
    parser.add_argument("--check-only", action="store_true",
                        help="check the command (names, values, datasets, the store and the study's fixed config) "
                             "and say how many trials would run, without starting Ray; resources are checked "
                             "against the cluster when the study runs there (python -m calib.cluster slurm does this "
                             "before it submits)")
    parser.add_argument("--compact-every", type=int, default=1000, metavar="N",
                        help="compact the study's result store in the background every N finished trials (its "
                             "rows moved from one file per trial into a few large Parquet files), and once when "
                             "the run ends; 0: only at the end")
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"Stage-I epochs, every dataset (default: {_per_preset(_epochs_of)})")
    parser.add_argument("--train-size", type=int, default=None,
                        help="Stage I trains on a stratified sample of this many training images, the same for "
                             "every seed (default: the whole training split)")
    parser.add_argument("--stage2-epochs", type=int, default=None,
                        help=f"Stage-II epochs of two-stage methods (default: {_per_preset(_stage2_epochs_of)})")
    parser.add_argument("--log-to", action="append", default=[], choices=["mlflow", "tensorboard", "wandb"],
                        help="also log the study to this tracker (repeatable): a parent per study, a child run per "
                             "trial; where to comes from MLFLOW_TRACKING_URI, WANDB_MODE/WANDB_PROJECT, "
                             "CALIB_TENSORBOARD_DIR (default <store>/tensorboard)")
    add_own_model_args(parser)


class _LoadPlugin(argparse.Action):
    """``--plugin NAME``: imported as soon as it is parsed, so its names are valid in every other flag."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from calib.plugins import use_plugin

        use_plugin(str(values))
        getattr(namespace, self.dest).append(str(values))


FEATURES_ARCH = "features"
"""The architecture name of a features Stage I in configs and tables (it has no model)."""

PREDICTIONS_ARCH = "predictions"
"""The architecture name of a predictions-file Stage I in configs and tables (it has no model)."""

DEFAULT_SPLITS = 10
"""Calibration/test splits of a predictions file (the benchmarks' 10)."""

DEFAULT_CALIBRATION_FRACTION = 0.5
"""The share of a predictions file in each split's calibration part (the benchmarks' 50/50)."""


def add_predictions_args(parser: argparse.ArgumentParser) -> None:
    """``--predictions FILE [FILE ...]``, ``--splits``, ``--calibration-fraction``: post-hoc calibration of given
    predictions (the studies that run only post-hoc methods: posthoc.py, calibrate.py)."""
    group = parser.add_argument_group("a model's predictions (calibrated by the post-hoc methods)")
    group.add_argument("--predictions", nargs="+", default=None, metavar="FILE",
                       help="files of a model's predictions and labels: .npz (netcal's predictions and ground_truth, "
                            "or logits/probs and labels), a .npy pair written PREDICTIONS.npy,LABELS.npy, or "
                            ".parquet with a labels column; logits or probabilities (detected); one setup per file, "
                            "named by its stem")
    group.add_argument("--splits", type=int, default=None, metavar="R",
                       help=f"random stratified calibration/test splits of each file, seeded 0..R-1 (default: "
                            f"{DEFAULT_SPLITS}; --seeds names the splits instead)")
    group.add_argument("--calibration-fraction", type=float, default=None, metavar="F",
                       help=f"the share of each file in a split's calibration part, in (0, 1) (default: "
                            f"{DEFAULT_CALIBRATION_FRACTION:g}); the rest is the test split")


def add_own_model_args(parser: argparse.ArgumentParser) -> None:
    """Flags for a user's model, data and code (docs/how-to/own-model.md)."""
    own = parser.add_argument_group("your own model, data and code")
    own.add_argument("--checkpoint", default=None, metavar="FILE",
                     help="Stage I from this trained model's weights (a path or s3:// URI; a state_dict) instead of "
                          "training: --archs names its architecture (calib's, torchvision:NAME or timm:NAME), "
                          "--datasets its data; loss-based rows do not apply")
    own.add_argument("--head", default=None, metavar="MODULE",
                     help="the checkpoint architecture's final linear layer (e.g. fc, classifier.3) where it is not "
                          "found automatically")
    own.add_argument("--features", default=None, metavar="FILE",
                     help="Stage I from a file of precomputed features, labels and the final linear layer or the "
                          "logits (.pt or .npz, docs/extending.md): no model, no dataset")
    own.add_argument("--features-name", default=None, metavar="NAME",
                     help="the dataset name of --features in the store and tables (default: the file's stem)")
    own.add_argument("--image-size", type=int, default=None,
                     help="imagefolder: side of the square crop the model sees (default: the images' own size)")
    own.add_argument("--resize", type=int, default=None,
                     help="imagefolder: resize the shorter side to this before cropping (default: --image-size)")
    own.add_argument("--mean", type=float, nargs="+", default=None,
                     help="imagefolder: per-channel normalisation mean (default: computed from the training images)")
    own.add_argument("--std", type=float, nargs="+", default=None,
                     help="imagefolder: per-channel normalisation std (default: computed from the training images)")
    own.add_argument("--val-fraction", type=float, default=None,
                     help="imagefolder without val/: the stratified share of train/ held out for validation "
                          "(default: 0.1)")
    own.add_argument("--plugin", action=_LoadPlugin, default=[], metavar="MODULE",
                     help="import this module (a dotted name or a .py file) on the driver and every Ray worker: "
                          "the datasets, models, losses and methods it registers become valid names; repeatable")


class StudyPaths:
    """Absolute store, artifact and data locations (Ray Tune changes each trial's working directory).

    ``store`` and ``artifacts`` are absolute paths or object-store URIs (``s3://...``); ``outputs`` is
    the local directory for figures and reports: the store itself when it is local, else ``./results``.
    """

    def __init__(self, store: str, artifacts: str | None, data_root: str) -> None:
        self.store = storage.normalize(store)
        self.artifacts = storage.normalize(artifacts) if artifacts else storage.join(self.store, "artifacts")
        self.data_root = Path(data_root).resolve()
        self.outputs = Path("results").resolve() if storage.is_remote(self.store) else Path(self.store)


def study_paths(args: argparse.Namespace) -> StudyPaths:
    return StudyPaths(args.store, args.artifacts, args.data_root)


def preset_of(args: argparse.Namespace) -> Preset:
    """The chosen preset with ``--epochs`` / ``--train-size`` / ``--stage2-epochs`` applied; any < 1 is a
    ``ConfigError`` (also in a study none of whose methods has a Stage II), as is a ``--seeds`` value
    outside ``0 <= seed < 2**32``."""
    train_size = getattr(args, "train_size", None)
    for flag, value, what in (("--epochs", args.epochs, "Stage-I training epochs"),
                              ("--train-size", train_size, "training images Stage I trains on"),
                              ("--stage2-epochs", args.stage2_epochs, "Stage-II epochs of two-stage methods")):
        if value is not None and value < 1:
            raise ConfigError(f"`{flag}` must be an integer >= 1 (the {what}), got {flag}={value}.")
    for seed in getattr(args, "seeds", None) or ():
        if not 0 <= seed < SEED_LIMIT:
            raise ConfigError(f"`--seeds` must be integers with 0 <= seed < 2**32 = {SEED_LIMIT} (NumPy's seeding "
                              f"takes no other), got --seeds={seed}.")
    preset = PRESETS.get(args.preset)
    preset = _with_own_model(args, preset)
    if train_size is not None:
        preset = dataclasses.replace(preset, stage1={**preset.stage1, "train_size": train_size})
    stage2 = dict(preset.stage2)
    if args.stage2_epochs is not None:
        stage2["epochs"] = args.stage2_epochs
    if args.epochs is None:
        return dataclasses.replace(preset, stage2=stage2)

    def shortened(stage1: dict) -> dict:
        # Milestones past the last epoch never fire; drop them so a shortened run stays valid.
        milestones = [m for m in stage1.get("milestones", Stage1Config.milestones) if m < args.epochs]
        return {**stage1, "epochs": args.epochs, "milestones": milestones}

    return dataclasses.replace(
        preset, stage1=shortened(preset.stage1), stage2=stage2,
        dataset_stage1={d: shortened(preset.stage1_for(d)) for d in preset.dataset_stage1})


_OPTION_FLAGS = {"image_size": "--image-size", "resize": "--resize", "mean": "--mean", "std": "--std",
                 "val_fraction": "--val-fraction"}


def _with_own_model(args: argparse.Namespace, preset: Preset) -> Preset:
    """``preset`` with the Stage-I source (``--checkpoint``, ``--features``) and the dataset options flags."""
    from calib.artifacts.sources import resolve_source

    checkpoint, features = getattr(args, "checkpoint", None), getattr(args, "features", None)
    if getattr(args, "predictions", None) is not None:
        return _with_predictions(args, preset)
    for flag, value in (("--splits", getattr(args, "splits", None)),
                        ("--calibration-fraction", getattr(args, "calibration_fraction", None))):
        if value is not None:
            raise ConfigError(f"`{flag}` splits the files of --predictions; without --predictions it does not apply, "
                              f"got {flag} {value}.")
    if checkpoint and features:
        raise ConfigError(f"`--checkpoint` and `--features` exclude each other (Stage I comes from one of them), got "
                          f"--checkpoint {checkpoint} --features {features}.")
    if getattr(args, "head", None) and not checkpoint:
        raise ConfigError(f"`--head` names the final linear layer of a --checkpoint's architecture; without "
                          f"--checkpoint it does not apply, got --head {args.head}.")
    if getattr(args, "features_name", None) and not features:
        raise ConfigError(f"`--features-name` names the data of --features; without --features it does not apply, "
                          f"got --features-name {args.features_name}.")
    options = {key: getattr(args, key) for key in _OPTION_FLAGS if getattr(args, key, None) is not None}
    changes: dict[str, Any] = {}
    if checkpoint:
        changes["source"] = resolve_source("checkpoint", checkpoint, args.head)
    elif features:
        changes["source"] = resolve_source("features", features)
        if options:
            raise ConfigError(f"`{_OPTION_FLAGS[next(iter(options))]}` sets how images are read, but --features "
                              f"reads no images.")
    if options:
        datasets = args.datasets or preset.datasets
        takers = [d for d in datasets if DATASETS.get(d).options is not None]
        if not takers:
            raise ConfigError(f"`{_OPTION_FLAGS[next(iter(options))]}` applies to a dataset with options "
                              f"(imagefolder), but the study's datasets are {', '.join(datasets)}.")
        changes["dataset_options"] = {d: options for d in takers}
    return dataclasses.replace(preset, **changes) if changes else preset


def _with_predictions(args: argparse.Namespace, preset: Preset) -> Preset:
    """``preset`` with one Stage-I source per ``--predictions`` file (named by its stem) and its splits as seeds."""
    from calib.artifacts.sources import resolve_source

    given = [flag for flag, dest in (("--checkpoint", "checkpoint"), ("--features", "features"),
                                     ("--datasets", "datasets"), ("--archs", "archs"), ("--train-size", "train_size"))
             if getattr(args, dest, None)]
    given += [flag for key, flag in _OPTION_FLAGS.items() if getattr(args, key, None) is not None]
    if given:
        raise ConfigError(f"`{given[0]}` does not apply to --predictions: each file is a setup of its own (named by "
                          f"its stem), and only post-hoc methods run on it.")
    if not args.predictions:
        raise ConfigError("`--predictions` needs at least one file.")
    splits, fraction = args.splits, args.calibration_fraction
    if splits is not None and args.seeds:
        seeds = " ".join(map(str, args.seeds))
        raise ConfigError(f"`--splits` and `--seeds` both choose the splits (--splits R: 0..R-1; --seeds: these "
                          f"split indices): give one, got --splits {splits} and --seeds {seeds}.")
    if splits is not None and splits < 1:
        raise ConfigError(f"`--splits` must be an integer >= 1 (the calibration/test splits of each file), got "
                          f"--splits {splits}.")
    if fraction is not None and not 0 < fraction < 1:
        raise ConfigError(f"`--calibration-fraction` must be in (0, 1) (the share of each split's calibration "
                          f"part), got --calibration-fraction {fraction}.")
    fraction = DEFAULT_CALIBRATION_FRACTION if fraction is None else float(fraction)
    sources: dict[str, dict[str, Any]] = {}
    for file in args.predictions:
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(file.partition(",")[0]).stem).lstrip("-_.") or "predictions"
        if name in sources:
            raise ConfigError(f"`--predictions` names two files {name!r}: a setup is named by its file's stem, so "
                              f"give files of different names.")
        sources[name] = {**resolve_source("predictions", file), "calibration_fraction": fraction}
    seeds = tuple(range(DEFAULT_SPLITS if splits is None else splits))
    return dataclasses.replace(preset, datasets=tuple(sources), archs=(PREDICTIONS_ARCH,), seeds=seeds,
                               dataset_archs={}, source={}, dataset_sources=sources)


def _features_label(args: argparse.Namespace) -> str:
    label = args.features_name or re.sub(r"[^A-Za-z0-9_.-]", "-", Path(str(args.features)).stem).lstrip("-_.")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", label or ""):
        raise ConfigError(f"`--features-name` must start with a letter or digit and hold only letters, digits, '_', "
                          f"'-' and '.', got {label!r}.")
    return label


def _check_given_stage1(args: argparse.Namespace, preset: Preset, setups: list[tuple[str, str]]) -> None:
    """The checkpoint or features file loads and fits each setup, before any trial (``ConfigError`` otherwise)."""
    from calib.artifacts.sources import check_source
    from calib.config import parse_trial_config
    from calib.presets import base_config

    paths = study_paths(args)
    for dataset, arch in setups:
        config = base_config(preset, study="check", dataset=dataset, arch=arch, seed=0, method={"name": "vanilla"},
                             data_root=str(paths.data_root), artifact_root=paths.artifacts, download=args.download,
                             device="cpu")
        print(f"[{args.study or 'calib'}] Stage I from the {check_source(parse_trial_config(config))}", flush=True)


def study_setups(args: argparse.Namespace, preset: Preset) -> list[tuple[str, str]]:
    """The (dataset, architecture) pairs of a study run; unknown names and a ``--train-size`` outside
    [classes, training images) fail before anything runs, as does a ``--checkpoint`` or ``--features`` file
    that does not fit them."""
    if preset.dataset_sources:
        setups = preset.setups()
        _check_given_stage1(args, preset, setups)
        return setups
    if preset.source.get("kind") == "features":
        if args.datasets or args.archs:
            raise ConfigError("`--datasets` and `--archs` do not apply to --features: the file holds the data's "
                              "features; name them with --features-name.")
        setups = [(_features_label(args), FEATURES_ARCH)]
        _check_given_stage1(args, preset, setups)
        return setups
    if preset.source.get("kind") == "checkpoint" and not args.archs:
        raise ConfigError("`--checkpoint` needs --archs: the architecture of the checkpoint (calib's name, "
                          "torchvision:NAME or timm:NAME).")
    setups = preset.setups(args.datasets, args.archs)
    for dataset, arch in setups:
        info = DATASETS.get(dataset)
        check_arch(arch)
        train_size = preset.stage1_for(dataset).get("train_size")
        if train_size is not None and info.num_classes is not None and train_size < info.num_classes:
            raise ConfigError(f"`--train-size` must be at least the {info.num_classes} classes of {dataset} (Stage I "
                              f"trains on a stratified sample that holds every class), got --train-size={train_size}.")
        if train_size is not None and info.train_images is not None and train_size >= info.train_images:
            raise ConfigError(f"`--train-size` must be below the {info.train_images} images of {dataset}'s training "
                              f"split, got --train-size={train_size}. Leave it out to train on all of them.")
    if preset.source:
        _check_given_stage1(args, preset, setups)
    return setups


def _resource(args: argparse.Namespace, preset: Preset, name: str, fallback: float | None) -> float | None:
    value = getattr(args, name)
    value = getattr(preset, name) if value is None else value
    value = fallback if value is None else value
    flag = "--" + name.replace("_", "-")
    if value is not None and name.startswith("cpus") and value <= 0:
        raise ConfigError(f"`{flag}` must be > 0, got {value}.")
    if value is not None and name.startswith("gpus") and value < 0:
        raise ConfigError(f"`{flag}` must be >= 0, got {value}.")
    return value


_ROLE_TRIALS = {"stage1": "Stage-I trial", "cached": "trial on a trained Stage I"}
"""What a trial of each role of :meth:`ExecutionOptions.resources` is, in messages."""
_RESOURCE_FIELDS = {("stage1", "CPU"): "cpus_per_trial", ("stage1", "GPU"): "gpus_per_trial",
                    ("cached", "CPU"): "cpus_per_cached_trial", ("cached", "GPU"): "gpus_per_cached_trial"}


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _origin(args: argparse.Namespace, preset: Preset, field_name: str) -> str:
    """Where a resource amount comes from, for messages: the flag (""), the preset, or the Stage-I trial's."""
    if getattr(args, field_name) is not None:
        return ""
    if getattr(preset, field_name) is not None:
        return f" (the {preset.name} preset's)"
    return f" (as {_flag(field_name.replace('_cached', ''))})"


def _count(amount: float, unit: str) -> str:
    """``"1 GPU"``, ``"0.5 GPU"``, ``"64 CPUs"``."""
    return f"{amount:g} {unit}{'s' if amount > 1 or amount == 0 else ''}"


def machine_resources() -> dict[str, float]:
    """What Ray started on this machine has (:func:`calib.search.runtime.init_ray`): its CPUs, and the CUDA
    GPUs torch sees."""
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}


def _check_whole_gpus(options: ExecutionOptions, args: argparse.Namespace, preset: Preset) -> None:
    for role in _ROLE_TRIALS:
        gpus = options.resources(role)["GPU"]
        if gpus > 1 and not float(gpus).is_integer():
            name = _RESOURCE_FIELDS[role, "GPU"]
            raise ConfigError(
                f"`{_flag(name)}` must be at most 1 (a share of one GPU) or a whole number of GPUs, as Ray gives a "
                f"trial part of one GPU or whole GPUs, got {_flag(name)}={gpus:g}{_origin(args, preset, name)}. "
                f"Use {math.floor(gpus)} or {math.ceil(gpus)}.")


def _check_fits_this_machine(options: ExecutionOptions, args: argparse.Namespace, preset: Preset) -> None:
    """Each role's CPUs and GPUs within what local Ray starts with; else the trial would wait forever."""
    machine = machine_resources()
    for role, trial in _ROLE_TRIALS.items():
        for kind, amount in options.resources(role).items():
            if amount <= machine[kind]:
                continue
            name = _RESOURCE_FIELDS[role, kind]
            have = _count(machine[kind], kind) + (" (torch sees no CUDA device)" if kind == "GPU" and
                                                  not machine[kind] else "")
            raise ConfigError(
                f"`{_flag(name)}` asks for {_count(amount, kind)} per {trial}{_origin(args, preset, name)}, but this "
                f"machine has {have}, so Ray on it would keep the trial waiting forever: use at most "
                f"{machine[kind]:g} ({_flag(name)} {machine[kind]:g}), or --address of a Ray cluster whose nodes "
                f"have more.")


def _check_device(device: str, options: ExecutionOptions, args: argparse.Namespace, preset: Preset) -> None:
    """A CUDA ``device`` that the trials will see: torch sees one here (without ``--address``), a
    trial on a cluster asks Ray for a GPU, and ``cuda:N`` is among the GPUs a trial is given."""
    match = re.fullmatch(r"cuda(?::(\d+))?", device)
    if match is None:
        return
    index = int(match.group(1) or 0)
    if args.address is None:
        count = torch.cuda.device_count()
        if count == 0:
            raise ConfigError(f"`--device {device}` needs a CUDA GPU, but torch sees none on this machine: use "
                              f"--device cpu or auto, or --address of a Ray cluster with GPUs.")
        if index >= count:
            raise ConfigError(f"`--device {device}` names GPU {index}, but torch sees {count} CUDA device"
                              f"{'s' if count > 1 else ''} on this machine (cuda:0 to cuda:{count - 1}): use one "
                              f"of them, or cuda.")
    for role, trial in _ROLE_TRIALS.items():
        gpus = options.resources(role)["GPU"]
        name = _RESOURCE_FIELDS[role, "GPU"]
        if gpus == 0 and args.address is not None:
            raise ConfigError(
                f"`--device {device}` needs a GPU in every trial, but {_flag(name)} is 0"
                f"{_origin(args, preset, name)}: on a cluster a {trial} that asks Ray for no GPU may run on a node "
                f"without one. Set --gpus-per-trial and --gpus-per-cached-trial above 0 (fractions share a GPU), "
                f"or use --device auto.")
        if gpus > 0 and index >= math.ceil(gpus):
            raise ConfigError(
                f"`--device {device}` names GPU {index}, but a {trial} sees only the {_count(math.ceil(gpus), 'GPU')} "
                f"Ray gives it ({_flag(name)} {gpus:g}), numbered from cuda:0: use cuda or "
                + ("cuda:0." if math.ceil(gpus) == 1 else f"one of cuda:0 to cuda:{math.ceil(gpus) - 1}."))


def execution_options(args: argparse.Namespace, preset: Preset) -> ExecutionOptions:
    """Ray address, resources (flags over the preset), retries and storage of a study run.

    Resources Ray cannot grant are a ``ConfigError``: a GPU amount above 1 that is not whole, and
    without ``--address`` a trial larger than this machine (:func:`machine_resources`); so is a CUDA
    ``--device`` that the trials would not see.
    """
    if args.max_failures < 0:
        raise ConfigError(f"`--max-failures` must be >= 0 (retries of a failed trial), got {args.max_failures}.")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ConfigError(f"`--checkpoint-every` must be >= 1 (Stage-I epochs), got {args.checkpoint_every}.")
    if args.configs_per_trial is not None and args.configs_per_trial < 1:
        raise ConfigError(f"`--configs-per-trial` must be >= 1, got {args.configs_per_trial}.")
    if args.compact_every < 0:
        raise ConfigError(f"`--compact-every` must be >= 0 (finished trials; 0: compact only at the end), got "
                          f"{args.compact_every}.")
    if not args.checkpoint_min_seconds >= 0:
        raise ConfigError(f"`--checkpoint-min-seconds` must be >= 0, got {args.checkpoint_min_seconds}.")
    if preset.gpus_if_available and args.address is None and not torch.cuda.is_available():
        preset = dataclasses.replace(preset, gpus_per_trial=0.0, gpus_per_cached_trial=0.0)
    cpus = _resource(args, preset, "cpus_per_trial", None)
    gpus = _resource(args, preset, "gpus_per_trial", None)
    options = ExecutionOptions(
        address=args.address, cpus_per_trial=cpus, gpus_per_trial=gpus,
        cpus_per_cached_trial=_resource(args, preset, "cpus_per_cached_trial", cpus),
        gpus_per_cached_trial=_resource(args, preset, "gpus_per_cached_trial", gpus),
        max_concurrent=args.max_concurrent, storage=args.storage,
        max_failures=args.max_failures,
        checkpoint_every=preset.checkpoint_every if args.checkpoint_every is None else args.checkpoint_every,
        checkpoint_min_seconds=args.checkpoint_min_seconds,
        configs_per_trial=args.configs_per_trial, compact_every=args.compact_every,
        check_only=args.check_only,
        log_to=tuple(dict.fromkeys(getattr(args, "log_to", None) or ())),
    )
    check_trackers(options.log_to)
    _check_whole_gpus(options, args, preset)
    if not options.check_only:  # --check-only runs where the study is prepared, not on the nodes it will use
        _check_device(args.device or preset.device, options, args, preset)
        if args.address is None:
            _check_fits_this_machine(options, args, preset)
    return options


def require_datasets(names: Sequence[str], data_root: Path, download: bool) -> None:
    """Fail before any trial starts if ``data_root`` is (or lies under) something that is not a directory,
    or a dataset is missing and ``--download`` was not given. A name that is not a registered dataset (the
    data of ``--features``, which :func:`study_setups` named) has nothing on disk to find."""
    data_root = Path(data_root).resolve()
    existing = next(path for path in (data_root, *data_root.parents) if path.exists())
    if not existing.is_dir():
        where = "is a file" if existing == data_root else f"lies under the file {existing}"
        raise ConfigError(f"`--data-root` must be a directory (it holds the datasets), but {data_root} {where}: name "
                          f"a directory, or a path that does not exist yet (--download creates it).")
    for name in names:
        if name in DATASETS and not download:
            DATASETS.get(name).require(str(data_root))


def _numbers(values: Sequence[float]) -> str:
    return "/".join(f"{v:g}" for v in sorted(set(values)))


def _stage2_epochs(config: Mapping[str, Any]) -> int | None:
    """The Stage-II epochs of a trial config's method, None for a method without a Stage II."""
    from calib._config import field_types
    from calib.methods import METHODS

    method = config["method"]
    spec = METHODS.get(method["name"])
    if "epochs" not in field_types(spec.config):
        return None
    return method.get("epochs", spec.config.epochs)


def _device_used(device: str, options: ExecutionOptions) -> str:
    """``device`` as the trials use it: "auto" resolved where the trials run here."""
    if device != "auto":
        return device
    if options.address is not None:
        return "auto (cuda on a node with a GPU)"
    return f"auto ({'cuda' if torch.cuda.is_available() else 'cpu'})"


def settings_line(study: str, preset: Preset, configs: Sequence[Mapping[str, Any]], options: ExecutionOptions) -> str:
    """``[study] preset quick · Stage I 20 epochs · Stage II 40 epochs · seeds 1 2 · device cpu · per trial
    2 CPU (cached 1 CPU)``: what the run's trial configs and resources use, flags over the preset."""
    kinds = list(dict.fromkeys(config.get("source", {}).get("kind", "train") for config in configs))
    stage1: dict[str, list[int]] = {}
    for config in configs:
        stage1.setdefault(config["dataset"], []).append(config["stage1"].get("epochs", Stage1Config.epochs))
    if kinds != ["train"]:
        parts = [f"Stage I from the {' / '.join(kinds)} file (not trained)"]
    elif len({_numbers(e) for e in stage1.values()}) == 1:
        parts = [f"Stage I {_numbers(next(iter(stage1.values())))} epochs"]
    else:
        parts = ["Stage I " + ", ".join(f"{d} {_numbers(e)}" for d, e in stage1.items()) + " epochs"]
    stage2 = [e for e in map(_stage2_epochs, configs) if e is not None]
    if stage2:
        parts.append(f"Stage II {_numbers(stage2)} epochs")
    parts.append("seeds " + _words(list(dict.fromkeys(config["seed"] for config in configs))))
    train_sizes = [c["stage1"]["train_size"] for c in configs if c["stage1"].get("train_size") is not None]
    if train_sizes:
        parts.append(f"train size {_numbers(train_sizes)}")
    parts.append("device " + ", ".join(_device_used(d, options) for d in dict.fromkeys(c["device"] for c in configs)))

    def amounts(role: str) -> str:
        return " + ".join(f"{v:g} {k}" for k, v in options.resources(role).items() if v > 0)

    parts.append(f"per trial {amounts('stage1')} (cached {amounts('cached')})")
    return f"[{study}] preset {preset.name} · " + " · ".join(parts)


def guarded_main(main: Callable[[list[str] | None], Any]) -> Callable[[list[str] | None], int]:
    """Turn the errors a user can fix (bad config, unknown name, missing data) into one message and exit 2;
    a run stopped by SIGTERM into its last line and exit 3; a :class:`~calib.search.CheckedOnly` that ``main``
    returns (``--check-only``) into its line and exit 0; otherwise ``main``'s exit code."""
    from calib.search.stopping import StudyInterrupted
    from calib.search.tuner import CheckedOnly

    def wrapper(argv: list[str] | None = None) -> int:
        try:
            result = main(argv)
        except (ConfigError, UnknownNameError, DatasetNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return ExitCode.BAD_INPUT
        except StudyInterrupted as stopped:
            print(stopped, flush=True)
            return ExitCode.INTERRUPTED
        if isinstance(result, CheckedOnly):
            print(result, flush=True)
            return ExitCode.OK
        return result

    wrapper.__doc__ = main.__doc__
    return wrapper





def study_exit_code(study: str, store: str, failed: int, finished: int) -> int:
    """A study's exit code: 0 when every trial of the run is in the store as ok, 1 when ``failed`` > 0
    or none finished (bad input exits 2 earlier). Prints how to read the failed rows."""
    if failed:
        print(f"[{study}] {failed} trial{'s' if failed > 1 else ''} failed; their errors: python -c \"import pandas "
              f"as pd; t = pd.read_parquet('{store}/trials', filters=[('status', '==', 'failed')]); "
              f"print(t[['study', 'trial_id', 'failed_stage', 'failed_epoch', 'error']])\"", flush=True)
        return ExitCode.FAILED
    if not finished:
        print(f"[{study}] no finished trial in the store", flush=True)
        return ExitCode.FAILED
    return ExitCode.OK
