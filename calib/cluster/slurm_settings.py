"""What a Slurm job of ``python -m calib.cluster slurm`` asks for and how it runs: :class:`SlurmSettings`, whose
fields are named once, with their flag, help and check (:func:`add_setting_flags`, :func:`given_settings`,
:meth:`SlurmSettings.check`), read by :mod:`calib.cluster.slurm` and :mod:`calib.cluster.slurm_checks`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from calib._config import ConfigError, Rule, checked_field, field_rules, integer

__all__ = ["SlurmSettings", "add_setting_flags", "given_settings", "parse_time"]

_MEM = re.compile(r"[1-9][0-9]*[KMGT]?")
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")
_TIME_FORMATS = ("MINUTES", "MINUTES:SECONDS", "HOURS:MINUTES:SECONDS", "DAYS-HOURS", "DAYS-HOURS:MINUTES",
                 "DAYS-HOURS:MINUTES:SECONDS")


def parse_time(text: str) -> int:
    """Seconds of a Slurm time limit (``--time``): minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(text).strip())
    if not match:
        raise ConfigError(f"--time {text!r} is not a Slurm time limit; allowed: {', '.join(_TIME_FORMATS)}.")
    days, first, second, third = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)
    if third is not None:  # HH:MM:SS
        return int(first) * 3600 + int(second) * 60 + int(third)
    return int(first) * 60 + int(second or 0)  # MM[:SS]


_SLURM_NAME = Rule("a Slurm name (letters, digits, underscores, dots, dashes and plus signs)",
                   lambda value: bool(_NAME.fullmatch(str(value))))
_SIZE = Rule("a size such as 64G or 500M (K, M, G, T)", lambda value: bool(_MEM.fullmatch(str(value))))
_ON_OFF = Rule("true or false (on or off in a settings file)", lambda value: isinstance(value, bool))


def _setting(default: Any, help: str | None, rule: Rule | None = None, *, flag: str | None = None,
             metavar: str | None = None, repeat: bool = False) -> Any:
    """A :func:`~calib._config.checked_field` of :class:`SlurmSettings` with its flag: ``help`` (None: no flag),
    ``rule`` (what its value must be; a None default is always allowed), ``flag`` (the flag when it is not the
    field's name with dashes), ``repeat`` (a tuple given by repeating the flag)."""
    return checked_field(default, rule, help=help, flag=flag, metavar=metavar, repeat=repeat)


@dataclass(frozen=True)
class SlurmSettings:
    """What the job asks Slurm for, and how it runs (docs/how-to/slurm.md)."""

    partition: str | None = _setting(None, "Slurm partition (default: the cluster's default)", _SLURM_NAME)
    account: str | None = _setting(None, "account to charge", _SLURM_NAME)
    qos: str | None = _setting(None, "quality of service", _SLURM_NAME)
    nodes: int = _setting(1, "nodes of the job (default 1): Ray's head and workers", integer(at_least=1))
    gpus_per_node: int = _setting(0, "GPUs on each node (default 0)", integer(at_least=0))
    cpus_per_node: int | None = _setting(None, "CPUs on each node (default: Slurm's default for one task)",
                                         integer(at_least=1))
    mem_per_node: str | None = _setting(None, "memory on each node, e.g. 64G", _SIZE)
    time: str = _setting("24:00:00", "time limit of each start of the job (default 24:00:00)")
    signal_seconds: int = _setting(300, "Slurm's warning this long before the time limit: the study stops cleanly "
                                        "and the job requeues itself (default 300)", integer(at_least=1))
    """Slurm's warning this long before the time limit (it may come up to a minute early)."""
    max_requeues: int = _setting(3, "starts after the first the job may have, time limits and preemptions together "
                                    "(default 3)", integer(at_least=0))
    """Starts after the first that the job may have (requeued by itself at the time limit, or preempted)."""
    handover_seconds: int = _setting(120, "how often a Stage I being trained saves the state a requeued job "
                                          "continues from (default 120)", integer(at_least=0))
    """How often a Stage I being trained saves the state a requeued job continues from."""
    setup: tuple[str, ...] = _setting((), "a shell line run before anything else on the job (repeatable), e.g. "
                                          "'module load cuda/12.4' and 'source ~/venv/bin/activate'",
                                      metavar="LINE", repeat=True)
    run_dir: str = _setting(".", "the folder the job runs the command from, on the cluster's shared file system "
                                 "(created if missing); logs go to <run dir>/slurm/ (default: this folder)")
    job_name: str | None = _setting(None, "job name (default calib-<study>)", _SLURM_NAME)
    sbatch_options: tuple[str, ...] = _setting((), "another #SBATCH option, as given (repeatable), e.g. "
                                                   "--sbatch-option=--constraint=a100",
                                               flag="--sbatch-option", metavar="OPTION", repeat=True)
    """Further ``#SBATCH`` options, as given (``--constraint=a100``, ``--exclusive``)."""
    ray_tmp: str = _setting("/tmp", None)
    """Where each node keeps Ray's files, ``<ray_tmp>/calib-<job id>.XXXXXXXX`` (made by the job, mode 0700): short
    and node-local."""
    mps: bool = _setting(True, "start NVIDIA MPS on every node of a GPU job before Ray, so trials sharing a GPU run at "
                               "once (default: on); --no-mps where the site runs MPS itself or must not share GPUs",
                         _ON_OFF)
    """NVIDIA MPS on each node of a GPU job, for its Ray (:mod:`calib.cluster.mps`); no effect without GPUs."""
    shared_paths: tuple[str, ...] = _setting(
        (), "a folder every node of the job sees at this path although calib takes it for node-local (under /tmp, "
            "/var/tmp or /dev/shm, or on a memory file system), where the Python, calib, the run directory and the "
            "store are refused (repeatable)", flag="--shared-path", metavar="PATH", repeat=True)
    """Folders every node of the job sees at the same path although they lie where calib takes a folder for
    node-local (under /tmp, /var/tmp or /dev/shm, or on a memory file system): not refused
    (:func:`calib.cluster.slurm_checks.check_shared_places`)."""

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> SlurmSettings:
        """Settings from a YAML file whose keys are the field names (dashes or underscores)."""
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as err:
            raise ConfigError(f"--settings {path}: cannot be read ({err.strerror or err}).") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"--settings {path}: not valid YAML ({err}).") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--settings {path}: must be a mapping of settings, got {type(data).__name__}.")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {str(k).replace("-", "_"): v for k, v in data.items()}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"--settings {path}: unknown setting(s) {', '.join(unknown)}; allowed: "
                              f"{', '.join(sorted(names))}.")
        for f in dataclasses.fields(cls):
            if f.metadata["repeat"] and f.name in values:
                values[f.name] = tuple(values[f.name] if isinstance(values[f.name], list) else [values[f.name]])
        return cls(**values)

    def check(self) -> None:
        """Raise ``ConfigError`` naming the first value out of range."""
        rules = field_rules(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in rules and not (value is None and f.default is None) and not rules[f.name].holds(value):
                raise ConfigError(f"{_flag(f)} must be {rules[f.name].what}, got {value!r}.")
        limit = parse_time(self.time)
        if limit <= self.signal_seconds + 60:
            raise ConfigError(f"--time {self.time} ({limit} s) must be longer than the warning before it "
                              f"(--signal-seconds {self.signal_seconds}) plus a minute (Slurm may send it up to 60 s "
                              f"early): the study would be stopped before it could start.")
        for folder in self.shared_paths:
            if not Path(str(folder)).expanduser().is_absolute():
                raise ConfigError(f"--shared-path must be an absolute path (a folder every node sees there), got "
                                  f"{folder!r}.")


def _flag(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per field of :class:`SlurmSettings` that has a help text; each defaults to None (not given)."""
    for f in dataclasses.fields(SlurmSettings):
        if f.metadata["help"] is None:
            continue
        options: dict[str, Any] = {"default": None, "help": f.metadata["help"]}
        if f.metadata["repeat"]:
            options.update(action="append", dest=f.name, metavar=f.metadata["metavar"])
        elif f.type == "bool":
            options.update(action=argparse.BooleanOptionalAction)
        elif f.type in ("int", "int | None"):
            options.update(type=int)
        parser.add_argument(_flag(f), **options)


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gave (:func:`add_setting_flags`), as :class:`SlurmSettings` field values."""
    given = {}
    for f in dataclasses.fields(SlurmSettings):
        value = getattr(args, f.name, None)
        if value is not None and value != []:
            given[f.name] = tuple(value) if f.metadata["repeat"] else value
    return given
