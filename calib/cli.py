"""Command-line plumbing shared by the study scripts: common flags, paths, and clean error exits."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from calib import storage
from calib._config import ConfigError
from calib._registry import UnknownNameError
from calib.config import Stage1Config
from calib.datasets import DATASETS, DatasetNotFoundError
from calib.models import MODELS
from calib.presets import PRESETS, Preset
from calib.search.tune import DEFAULT_CONFIGS_PER_TRIAL, ExecutionOptions

__all__ = [
    "HelpFormatter",
    "StudyPaths",
    "add_common_args",
    "execution_options",
    "guarded_main",
    "preset_of",
    "require_datasets",
    "study_exit_code",
    "study_parser",
    "study_paths",
    "study_setups",
]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` that shows each flag's default once: the module docstring as written, and
    ``(default: X)`` after every flag whose help does not state its default already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("(default" in text or action.default in (None, argparse.SUPPRESS) or action.nargs == 0
                or action.option_strings == []):
            return text
        default = " ".join(map(str, action.default)) if isinstance(action.default, list) else "%(default)s"
        return f"{text} (default: {default})"


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
    parser.add_argument("--archs", nargs="+", default=None,
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
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"Stage-I epochs, every dataset (default: {_per_preset(_epochs_of)})")
    parser.add_argument("--train-size", type=int, default=None,
                        help="Stage I trains on a stratified sample of this many training images, the same for "
                             "every seed (default: the whole training split)")
    parser.add_argument("--stage2-epochs", type=int, default=None,
                        help=f"Stage-II epochs of two-stage methods (default: {_per_preset(_stage2_epochs_of)})")


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
    ``ConfigError`` (also in a study none of whose methods has a Stage II)."""
    train_size = getattr(args, "train_size", None)
    for flag, value, what in (("--epochs", args.epochs, "Stage-I training epochs"),
                              ("--train-size", train_size, "training images Stage I trains on"),
                              ("--stage2-epochs", args.stage2_epochs, "Stage-II epochs of two-stage methods")):
        if value is not None and value < 1:
            raise ConfigError(f"`{flag}` must be an integer >= 1 (the {what}), got {flag}={value}.")
    preset = PRESETS.get(args.preset)
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


def study_setups(args: argparse.Namespace, preset: Preset) -> list[tuple[str, str]]:
    """The (dataset, architecture) pairs of a study run; unknown names fail before anything runs."""
    setups = preset.setups(args.datasets, args.archs)
    for dataset, arch in setups:
        info = DATASETS.get(dataset)
        MODELS.get(arch)
        train_size = preset.stage1_for(dataset).get("train_size")
        if train_size is not None and info.train_images is not None and train_size >= info.train_images:
            raise ConfigError(f"`--train-size` must be below the {info.train_images} images of {dataset}'s training "
                              f"split, got --train-size={train_size}. Leave it out to train on all of them.")
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


def execution_options(args: argparse.Namespace, preset: Preset) -> ExecutionOptions:
    """Ray address, resources (flags over the preset), retries and storage of a study run."""
    if args.max_failures < 0:
        raise ConfigError(f"`--max-failures` must be >= 0 (retries of a failed trial), got {args.max_failures}.")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ConfigError(f"`--checkpoint-every` must be >= 1 (Stage-I epochs), got {args.checkpoint_every}.")
    if args.configs_per_trial is not None and args.configs_per_trial < 1:
        raise ConfigError(f"`--configs-per-trial` must be >= 1, got {args.configs_per_trial}.")
    if not args.checkpoint_min_seconds >= 0:
        raise ConfigError(f"`--checkpoint-min-seconds` must be >= 0, got {args.checkpoint_min_seconds}.")
    if preset.gpus_if_available and args.address is None and not torch.cuda.is_available():
        preset = dataclasses.replace(preset, gpus_per_trial=0.0, gpus_per_cached_trial=0.0)
    cpus = _resource(args, preset, "cpus_per_trial", None)
    gpus = _resource(args, preset, "gpus_per_trial", None)
    return ExecutionOptions(
        address=args.address, cpus_per_trial=cpus, gpus_per_trial=gpus,
        cpus_per_cached_trial=_resource(args, preset, "cpus_per_cached_trial", cpus),
        gpus_per_cached_trial=_resource(args, preset, "gpus_per_cached_trial", gpus),
        max_concurrent=args.max_concurrent, storage=args.storage,
        max_failures=args.max_failures,
        checkpoint_every=preset.checkpoint_every if args.checkpoint_every is None else args.checkpoint_every,
        checkpoint_min_seconds=args.checkpoint_min_seconds,
        configs_per_trial=args.configs_per_trial,
    )


def require_datasets(names: Sequence[str], data_root: Path, download: bool) -> None:
    """Fail before any trial starts if a dataset is missing and ``--download`` was not given."""
    for name in names:
        info = DATASETS.get(name)
        if not download:
            info.require(str(data_root))


def guarded_main(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Turn the errors a user can fix (bad config, unknown name, missing data) into one message and exit 2."""

    def wrapper(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except (ConfigError, UnknownNameError, DatasetNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2

    wrapper.__doc__ = main.__doc__
    return wrapper





def study_exit_code(study: str, store: str, failed: int, finished: int) -> int:
    """A study's exit code: 0 when every trial of the run is in the store as ok, 1 when ``failed`` > 0
    or none finished (bad input exits 2 earlier). Prints how to read the failed rows."""
    if failed:
        print(f"[{study}] {failed} trial{'s' if failed > 1 else ''} failed; their errors: python -c \"import pandas "
              f"as pd; t = pd.read_parquet('{store}/trials', filters=[('status', '==', 'failed')]); "
              f"print(t[['study', 'trial_id', 'failed_stage', 'failed_epoch', 'error']])\"", flush=True)
        return 1
    if not finished:
        print(f"[{study}] no finished trial in the store", flush=True)
        return 1
    return 0
