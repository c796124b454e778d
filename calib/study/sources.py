"""What a study runs on: the preset with the flags applied, the Stage I it starts from (trained, a model's
checkpoint, a features file, files of predictions: docs/how-to/own-model.md), its (dataset, architecture)
setups. Every value a user can get wrong is a ``ConfigError`` here, before anything runs."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calib._config import ConfigError
from calib.artifacts.predictions_file import split_pair
from calib.artifacts.sources import check_source, resolve_source
from calib.config import Stage1Config, check_seed, parse_trial_config
from calib.datasets import DATASETS
from calib.datasets.subsets import check_train_size
from calib.models import check_arch
from calib.study.paths import study_paths
from calib.study.presets import PRESETS, Preset, base_config

__all__ = ["DEFAULT_CALIBRATION_FRACTION", "DEFAULT_SPLITS", "FEATURES_ARCH", "PREDICTIONS_ARCH", "preset_of",
           "require_datasets", "study_seeds", "study_setups", "trial_config"]

FEATURES_ARCH = "features"
"""The architecture name of a features Stage I in configs and tables (it has no model)."""

PREDICTIONS_ARCH = "predictions"
"""The architecture name of a predictions-file Stage I in configs and tables (it has no model)."""

DEFAULT_SPLITS = 10
"""Calibration/test splits of a predictions file (the benchmarks' 10)."""

DEFAULT_CALIBRATION_FRACTION = 0.5
"""The share of a predictions file in each split's calibration part (the benchmarks' 50/50)."""


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
        check_seed(seed, "--seeds", many=True)
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
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(split_pair(file)[0]).stem).lstrip("-_.") or "predictions"
        if name in sources:
            raise ConfigError(f"`--predictions` names two files {name!r}: a setup is named by its file's stem, so "
                              f"give files of different names.")
        sources[name] = {**resolve_source("predictions", file), "calibration_fraction": fraction}
    seeds = tuple(range(DEFAULT_SPLITS if splits is None else splits))
    return dataclasses.replace(preset, datasets=tuple(sources), archs=(PREDICTIONS_ARCH,), seeds=seeds,
                               dataset_archs={}, source={}, dataset_sources=sources)


def study_seeds(args: argparse.Namespace, preset: Preset) -> list[int]:
    """The run's seeds: ``--seeds``, or those ``preset`` gives the study its script declares
    (:meth:`~calib.study.presets.Preset.seeds_of`)."""
    return list(args.seeds or preset.seeds_of(getattr(args, "script_study", None)))


def trial_config(args: argparse.Namespace, preset: Preset, *, dataset: str, arch: str, seed: int,
                 method: dict[str, Any], loss: dict[str, Any] | None = None, study: str | None = None,
                 device: str | None = None) -> dict[str, Any]:
    """The trial config of one (dataset, architecture, seed) running ``method`` on the Stage I of ``loss``
    (default: cross-entropy) under ``preset`` (:func:`calib.study.presets.base_config`), with the study's store,
    data and flags: ``--study`` (or ``study``), ``--data-root``, ``--artifacts``, ``--download``, ``--device`` (or
    ``device``). Every study builds its trials' configs here."""
    paths = study_paths(args)
    return base_config(preset, study=study or args.study, dataset=dataset, arch=arch, seed=seed, method=method,
                       loss=loss, data_root=str(paths.data_root), artifact_root=paths.artifacts,
                       download=args.download, device=args.device if device is None else device)


def _features_label(args: argparse.Namespace) -> str:
    label = args.features_name or re.sub(r"[^A-Za-z0-9_.-]", "-", Path(str(args.features)).stem).lstrip("-_.")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", label or ""):
        raise ConfigError(f"`--features-name` must start with a letter or digit and hold only letters, digits, '_', "
                          f"'-' and '.', got {label!r}.")
    return label


def _check_source_files_load(args: argparse.Namespace, preset: Preset, setups: list[tuple[str, str]]) -> None:
    """The checkpoint or features file loads and fits each setup, before any trial (``ConfigError`` otherwise)."""
    for dataset, arch in setups:
        config = trial_config(args, preset, dataset=dataset, arch=arch, seed=0, method={"name": "vanilla"},
                              study="check", device="cpu")
        print(f"[{args.study or 'calib'}] Stage I from the {check_source(parse_trial_config(config))}", flush=True)


def study_setups(args: argparse.Namespace, preset: Preset) -> list[tuple[str, str]]:
    """The (dataset, architecture) pairs of a study run; unknown names and a ``--train-size`` outside
    [classes, training images) fail before anything runs, as does a ``--checkpoint`` or ``--features`` file
    that does not fit them."""
    if preset.dataset_sources:
        setups = preset.setups()
        _check_source_files_load(args, preset, setups)
        return setups
    if preset.source.get("kind") == "features":
        if args.datasets or args.archs:
            raise ConfigError("`--datasets` and `--archs` do not apply to --features: the file holds the data's "
                              "features; name them with --features-name.")
        setups = [(_features_label(args), FEATURES_ARCH)]
        _check_source_files_load(args, preset, setups)
        return setups
    if preset.source.get("kind") == "checkpoint" and not args.archs:
        raise ConfigError("`--checkpoint` needs --archs: the architecture of the checkpoint (calib's name, "
                          "torchvision:NAME or timm:NAME).")
    setups = preset.setups(args.datasets, args.archs)
    for dataset, arch in setups:
        info = DATASETS.get(dataset)
        check_arch(arch)
        train_size = preset.stage1_for(dataset).get("train_size")
        if train_size is not None:
            check_train_size(train_size, info.num_classes, info.train_images, dataset, key="--train-size")
    if preset.source:
        _check_source_files_load(args, preset, setups)
    return setups


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
