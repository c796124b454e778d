"""A study's ``--set KEY=VALUE`` and ``--stage2-seeds``: trial-config fields from the command line, applied to every
trial config the study built (:mod:`calib.overrides` types and checks them)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from calib._config import ConfigError
from calib.config import check_seed
from calib.overrides import ABSENT, ConfigSetting, apply_settings, current_value, parse_setting
from calib.registries import METHODS

__all__ = ["STUDY_KEYS", "study_settings", "with_settings"]

_SOURCE_FLAGS = "--checkpoint, --features or --predictions"
STUDY_KEYS: dict[str, str] = {
    "study": "--study", "seed": "--seeds", "dataset": "--datasets", "arch": "--archs", "data_root": "--data-root",
    "artifact_root": "--artifacts", "download": "--download", "device": "--device",
    "label": "the study (a row's name in its table)", "label_rank": "the study (a row's place in its table)",
    "method.name": "the study's rows (--methods where it has them)", "loss.name": "the study's rows",
    "ood_datasets": "ood.py (its OOD sets)", "corruptions": "corruption.py (its corruptions)",
    "dataset_options": "--image-size, --resize, --mean, --std and --val-fraction",
    "source.kind": _SOURCE_FLAGS, "source.path": _SOURCE_FLAGS, "source.sha256": f"the study (from {_SOURCE_FLAGS})",
    "source.head": "--head", "source.labels_path": "--predictions (PREDICTIONS.npy,LABELS.npy)",
    "source.labels_sha256": "the study (from --predictions)", "source.calibration_fraction": "--calibration-fraction",
}
"""Trial-config keys that a study's own flags (or the study itself) set: ``--set`` of one names that flag."""


def study_settings(args: argparse.Namespace) -> list[ConfigSetting]:
    """The ``--set`` values of the command line, each key and (where the field's type is known before the configs
    are) value checked; a bad one is a :class:`ConfigError` naming it and what is allowed."""
    settings = [parse_setting(text, STUDY_KEYS) for text in getattr(args, "set", None) or ()]
    stage2_seeds = getattr(args, "stage2_seeds", None)
    if stage2_seeds and any(s.key == "stage2_seed" for s in settings):
        raise ConfigError(f"`--stage2-seeds` and `--set stage2_seed=...` both choose Stage II's seed: give one, got "
                          f"--stage2-seeds {' '.join(map(str, stage2_seeds))} and "
                          f"--set {next(s for s in settings if s.key == 'stage2_seed')}.")
    for seed in stage2_seeds or ():
        check_seed(seed, "--stage2-seeds", many=True)
    for one in settings:
        if one.only and any(s.key == one.key and not s.only for s in settings):
            raise ConfigError(f"`--set {one}` and `--set {one.key}=...` both set {one.only}'s {one.field}: give one "
                              f"(--set method.FIELD sets it for every method that has it, --set {one.only}.FIELD for "
                              f"{one.only} alone).")
    return settings


def with_settings(args: argparse.Namespace, configs: Sequence[dict[str, Any]], *, say: bool = True,
                  settings: Sequence[ConfigSetting] | None = None) -> list[dict[str, Any]]:
    """``configs`` with the ``--set`` values applied to each (a ``method.``/``loss.`` one to those whose method
    (loss) has the field), then one copy per ``--stage2-seeds`` value (Stage II's seed; without the flag each
    trial's Stage II uses its ``seed``; a method that draws nothing in Stage II runs once). A key whose value the
    study varies between the rows of one setup and seed
    (γ of sensitivity_gamma, the sizes of posthoc, Mixup's α in compare_methods; a method's or loss's field between
    rows of that method or loss) is a :class:`ConfigError`: one value would make those rows one. ``say``: print one
    line of what each setting applied to. ``settings``: :func:`study_settings` of ``args`` when the caller has
    them (a table study applies them to its run and its whole table), else read here."""
    settings = study_settings(args) if settings is None else settings
    for setting in settings:
        _check_not_varied(setting, configs)
    out = apply_settings(configs, settings)
    stage2_seeds = list(dict.fromkeys(getattr(args, "stage2_seeds", None) or ()))
    if stage2_seeds:
        out = [copy for config in out for copy in _per_stage2_seed(config, stage2_seeds)]
    if settings and say:
        print(f"[{getattr(args, 'study', None) or 'calib'}] " + "; ".join(_applied(s, out) for s in settings),
              flush=True)
    return out


def _per_stage2_seed(config: dict[str, Any], stage2_seeds: list[int]) -> list[dict[str, Any]]:
    """One copy of ``config`` per Stage-II seed; one copy, its Stage II seeded by its seed, for a method that draws
    nothing in Stage II (the uncalibrated model: ``MethodSpec.draws``), whose copies would be the same trial."""
    method = config.get("method") or {}
    name = method if isinstance(method, str) else method.get("name")
    if name in METHODS and not METHODS.get(name).draws:
        return [config]
    return [{**config, "stage2_seed": seed} for seed in stage2_seeds]


def _check_not_varied(setting: ConfigSetting, configs: Sequence[dict[str, Any]]) -> None:
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for config in configs:
        value = current_value(config, setting)
        if value is not ABSENT:  # a method's (loss's) field compared among the rows of that method (loss)
            component = config.get(setting.section) if setting.section in ("method", "loss") else None
            name = component if isinstance(component, str) or component is None else component.get("name")
            key = (config["dataset"], config["arch"], config["seed"], name)
            rows.setdefault(key, {})[config.get("label", "")] = value
    for values in rows.values():
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            shown = "; ".join(f"{label or '(no label)'}: {json.dumps(v)}" for label, v in list(values.items())[:6])
            raise ConfigError(f"`--set {setting}`: this study varies {setting.key} between its rows ({shown}"
                              f"{'; ...' if len(values) > 6 else ''}), and one value would make them one; choose "
                              f"the rows with the study's own flags, or run the variant as its own study.")


def _applied(setting: ConfigSetting, configs: Sequence[dict[str, Any]]) -> str:
    """``--set KEY=VALUE: N of M trials (their methods)`` for the settings line."""
    having = [c for c in configs if current_value(c, setting) is not ABSENT]
    if len(having) == len(configs):
        return f"--set {setting}: every trial"
    sections = [c.get(setting.section) or {} for c in having]
    names = dict.fromkeys(s if isinstance(s, str) else str(s.get("name")) for s in sections)
    return f"--set {setting}: {len(having)} of {len(configs)} trials ({', '.join(names)})"
