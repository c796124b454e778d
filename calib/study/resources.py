"""Where and with what a study's trials run: the execution options from the flags over the preset, the
resources Ray can grant checked before anything starts, and the settings line a run begins with."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from calib._config import ConfigError, field_types
from calib.config import Stage1Config
from calib.methods import METHODS
from calib.run.execution import ExecutionOptions
from calib.store.predictions import kept_predictions_note
from calib.study.presets import Preset
from calib.tracking import check_trackers

__all__ = ["execution_options", "machine_resources", "settings_line"]


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
    """What Ray started on this machine has (:func:`calib.run.runtime.init_ray`): its CPUs, and the CUDA
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
        keep_predictions=getattr(args, "keep_predictions", None) or preset.keep_predictions,
    )
    check_trackers(options.log_to)
    _check_whole_gpus(options, args, preset)
    if not options.check_only:  # --check-only runs where the study is prepared, not on the nodes it will use
        _check_device(args.device or preset.device, options, args, preset)
        if args.address is None:
            _check_fits_this_machine(options, args, preset)
    return options


def _numbers(values: Sequence[float]) -> str:
    return "/".join(f"{v:g}" for v in sorted(set(values)))


def _stage2_epochs(config: Mapping[str, Any]) -> int | None:
    """The Stage-II epochs of a trial config's method, None for a method without a Stage II."""
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
    parts.append("seeds " + " ".join(str(seed) for seed in dict.fromkeys(config["seed"] for config in configs)))
    stage2_seeds = dict.fromkeys(c["stage2_seed"] for c in configs if c.get("stage2_seed") is not None)
    if stage2_seeds:
        parts.append("Stage-II seeds " + " ".join(map(str, stage2_seeds)))
    train_sizes = [c["stage1"]["train_size"] for c in configs if c["stage1"].get("train_size") is not None]
    if train_sizes:
        parts.append(f"train size {_numbers(train_sizes)}")
    parts.append("device " + ", ".join(_device_used(d, options) for d in dict.fromkeys(c["device"] for c in configs)))

    def amounts(role: str) -> str:
        return " + ".join(f"{v:g} {k}" for k, v in options.resources(role).items() if v > 0)

    parts.append(f"per trial {amounts('stage1')} (cached {amounts('cached')})")
    parts.append(kept_predictions_note(configs, options.keep_predictions))
    return f"[{study}] preset {preset.name} · " + " · ".join(parts)
