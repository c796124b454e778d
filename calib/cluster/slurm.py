"""Slurm: one generated sbatch script runs any study on the nodes of one job, through time limits and preemption.

``python -m calib.cluster slurm [settings] -- python studies/<study>.py ...`` writes
``<run dir>/slurm/<job name>.sbatch`` (``--submit`` also submits it). The script, on the job's nodes:

1. runs the setup lines (``module load``, a virtual environment), checks that calib imports on every node
   (a node whose Python cannot import it ends the job at once, naming the node and the Python), then starts
   Ray: the head on the first node and a worker on every other node, each through ``srun --overlap``, at
   the node's address from Slurm (``scontrol show node``: ``hostname -i`` gives 127.0.0.1 on many nodes),
   with ports and a temporary folder derived from the job id (two jobs on one node never share them;
   socket paths stay under Ray's 107 bytes), and token authentication set explicitly for every node and the driver (a
   token in a shared ``~/.ray`` would otherwise switch it on for the head only);
2. waits for every node (``python -m calib.cluster wait``, as on the other launchers), then runs the
   study with ``--address`` of the head;
3. on Slurm's warning signal before the time limit (``--signal=B:USR1@<seconds>``) or on SIGTERM
   (preemption, ``scontrol requeue``, ``scancel``), stops the study cleanly (SIGTERM to the driver: Ray
   Tune ends the running trials; a Stage I being trained keeps its handover state); after the warning
   it requeues the job itself (``scontrol requeue``), at most ``max_requeues`` times; a preempted job is
   requeued by Slurm. The next start runs the same command: finished trials are skipped, a Stage I
   continues from its handover state, and each ``stage1_id`` is still trained once;
4. stops this job's Ray only (its processes name its temporary folder; a bare ``ray stop`` would stop
   every Ray on the node, other users' too) and ends with one line saying how the study ended: exit 0
   when it finished, 3 when it was interrupted (never 0), the study's own code otherwise.

The script is the template ``slurm_job.sh`` of this package (:data:`JOB_TEMPLATE`) with the settings filled in
(:func:`render_script`). Logs: ``<run dir>/slurm/<job name>-<job id>.out`` (every start appended) and one Ray log
per node. Before writing (:mod:`calib.cluster.slurm_checks`), the settings, the places every node must see (this
Python, calib, the run directory, the store: refused under /tmp, /var/tmp, /dev/shm or on a memory file system),
the study command (run with ``--check-only``), the partition and account (``sbatch --test-only``) and GPUs on
the partition (``sinfo``) are checked: bad input exits 2 with one ``error:`` line and nothing is submitted. A run
directory, store or artifact folder on a disk's file system the site may not export is a warning.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import string
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from calib._config import ConfigError
from calib.cluster.launcher import Launcher
from calib.exit_codes import ExitCode

__all__ = ["JOB_TEMPLATE", "LAUNCHER", "SlurmSettings", "parse_time", "render_script"]

PORTS_PER_JOB = 200
FIRST_PORT = 20_000
JOB_TEMPLATE = "slurm_job.sh"
"""The job script's template, package data of :mod:`calib.cluster` (its ``@name@`` placeholders are filled by
:func:`render_script`; shellcheck reads the template and every script rendered from it)."""
_MEM = re.compile(r"[1-9][0-9]*[KMGT]?")
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


@dataclass(frozen=True)
class SlurmSettings:
    """What the job asks Slurm for, and how it runs (docs/how-to/slurm.md)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_node: int | None = None
    mem_per_node: str | None = None
    time: str = "24:00:00"
    signal_seconds: int = 300
    """Slurm's warning this long before the time limit (it may come up to a minute early)."""
    max_requeues: int = 3
    """Starts after the first that the job may have (requeued by itself at the time limit, or preempted)."""
    handover_seconds: int = 120
    """How often a Stage I being trained saves the state a requeued job continues from."""
    setup: tuple[str, ...] = ()
    run_dir: str = "."
    job_name: str | None = None
    sbatch_options: tuple[str, ...] = ()
    """Further ``#SBATCH`` options, as given (``--constraint=a100``, ``--exclusive``)."""
    ray_tmp: str = "/tmp"
    """Where each node keeps Ray's files, ``<ray_tmp>/calib-<job id>``: short and node-local."""
    mps: bool = True
    """NVIDIA MPS on each node of a GPU job, for its Ray (:mod:`calib.cluster.mps`); no effect without GPUs."""
    shared_paths: tuple[str, ...] = ()
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
        for key in ("setup", "sbatch_options", "shared_paths"):
            if key in values:
                values[key] = tuple(values[key] if isinstance(values[key], list) else [values[key]])
        return cls(**values)

    def check(self) -> None:
        """Raise ``ConfigError`` naming the first value out of range."""
        def whole(name: str, value: Any, low: int) -> None:
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}.")

        whole("nodes", self.nodes, 1)
        whole("gpus_per_node", self.gpus_per_node, 0)
        whole("signal_seconds", self.signal_seconds, 1)
        whole("max_requeues", self.max_requeues, 0)
        whole("handover_seconds", self.handover_seconds, 0)
        if not isinstance(self.mps, bool):
            raise ConfigError(f"--mps must be true or false (on or off in a settings file), got {self.mps!r}.")
        if self.cpus_per_node is not None:
            whole("cpus_per_node", self.cpus_per_node, 1)
        if self.mem_per_node is not None and not _MEM.fullmatch(str(self.mem_per_node)):
            raise ConfigError(f"--mem-per-node must be a size such as 64G or 500M (K, M, G, T), got "
                              f"{self.mem_per_node!r}.")
        limit = parse_time(self.time)
        if limit <= self.signal_seconds + 60:
            raise ConfigError(f"--time {self.time} ({limit} s) must be longer than the warning before it "
                              f"(--signal-seconds {self.signal_seconds}) plus a minute (Slurm may send it up to 60 s "
                              f"early): the study would be stopped before it could start.")
        for folder in self.shared_paths:
            if not Path(str(folder)).expanduser().is_absolute():
                raise ConfigError(f"--shared-path must be an absolute path (a folder every node sees there), got "
                                  f"{folder!r}.")
        for name in ("partition", "account", "qos", "job_name"):
            value = getattr(self, name)
            if value is not None and not re.fullmatch(r"[A-Za-z0-9_.+-]+", str(value)):
                raise ConfigError(f"--{name.replace('_', '-')} {value!r} has characters Slurm names do not use.")



# ---------------------------------------------------------------------------------------------------
# The script


def _sbatch_lines(settings: SlurmSettings, name: str, log_dir: Path) -> list[str]:
    options = [f"--job-name={name}"]
    options += [f"--{key}={value}" for key, value in (("partition", settings.partition),
                                                      ("account", settings.account),
                                                      ("qos", settings.qos)) if value]
    options += [f"--nodes={settings.nodes}", "--ntasks-per-node=1"]
    if settings.cpus_per_node:
        options.append(f"--cpus-per-task={settings.cpus_per_node}")
    if settings.mem_per_node:
        options.append(f"--mem={settings.mem_per_node}")
    if settings.gpus_per_node:
        options.append(f"--gpus-per-node={settings.gpus_per_node}")
    options += [f"--time={settings.time}", f"--signal=B:USR1@{settings.signal_seconds}", "--requeue",
                "--open-mode=append", f"--output={log_dir}/%x-%j.out", *settings.sbatch_options]
    return [f"#SBATCH {option}" for option in options]


def _object_store_bytes(mem: str | None) -> int | None:
    """30 % of ``--mem`` (Ray's default share of a node's memory, which it would take of the whole node's)."""
    if not mem:
        return None
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    number, unit = (mem[:-1], mem[-1]) if mem[-1] in units else (mem, "M")  # Slurm's default unit: MB
    return int(int(number) * units[unit] * 0.3)



class _JobTemplate(string.Template):
    """``@name@`` placeholders, which the shell's own ``$`` and ``@`` (``"$@"``, ``${NODES[@]}``) never form."""

    flags = 0
    pattern = r"@(?:(?P<named>[a-z_]+)@|(?P<braced>(?!))|(?P<escaped>(?!))|(?P<invalid>(?!)))"


_WHOLE_LINE = re.compile(r"@([a-z_]+)@")


def _job_template() -> str:
    return resources.files("calib.cluster").joinpath(JOB_TEMPLATE).read_text()


def render_script(settings: SlurmSettings, command: list[str], *, name: str | None = None) -> str:
    """The sbatch script that runs ``command`` (a study command line, run from the run directory): the template
    :data:`JOB_TEMPLATE` with the settings filled in. A placeholder alone on its line whose value is empty
    leaves no line."""
    run_dir = Path(settings.run_dir).expanduser().resolve()
    name = name or settings.job_name or "calib"
    log_dir = run_dir / "slurm"
    mps = settings.mps and settings.gpus_per_node > 0
    store = _object_store_bytes(settings.mem_per_node)
    values = {
        "sbatch_lines": "\n".join(_sbatch_lines(settings, name, log_dir)),
        "study": " ".join(shlex.quote(token) for token in command),
        "script_path": str(log_dir / (name + ".sbatch")),
        "log_dir": str(log_dir),
        "name": name,
        "run_dir": shlex.quote(str(run_dir)),
        "max_requeues": str(settings.max_requeues),
        "interrupted": str(int(ExitCode.INTERRUPTED)),
        "failed": str(int(ExitCode.FAILED)),
        "setup": "\n".join(settings.setup) if settings.setup else "# (no setup lines: python and ray from the PATH)",
        # Ray's ports from the job id: PORTS_PER_JOB of them from BASE, in one of the blocks below 65,000.
        "port_base": f"$(( {FIRST_PORT} + SLURM_JOB_ID % {(65_000 - FIRST_PORT) // PORTS_PER_JOB} * {PORTS_PER_JOB} ))",
        "max_worker_port": f"$((BASE + {PORTS_PER_JOB - 1}))",
        "ray_tmp": shlex.quote(settings.ray_tmp.rstrip("/") or "/"),
        "handover_seconds": str(settings.handover_seconds),
        # A GPU job's Ray runs under NVIDIA MPS (calib.cluster.mps), stopped with it; --no-mps writes none of it.
        "mps_note": _MPS_NOTE if mps else "",
        "run_ray": 'python -m calib.cluster.mps run --dir "$RAY_TMP/mps" -- "$@"' if mps else '"$@"',
        "stop_mps": 'python -m calib.cluster.mps stop --dir "$RAY_TMP/mps"; ' if mps else "",
        "object_store": f" --object-store-memory={store}" if store else "",
    }
    lines = [line for line in _job_template().split("\n")
             if not ((whole := _WHOLE_LINE.fullmatch(line)) and values[whole.group(1)] == "")]
    return _JobTemplate("\n".join(lines)).substitute(values)


_MPS_NOTE = """\
# NVIDIA MPS on each node, so trials sharing a GPU run at once: `mps run` starts its daemon, then the node's Ray
# (whose workers inherit CUDA_MPS_PIPE_DIRECTORY), and stops it when Ray ends, SIGTERM too; STOP_NODE stops one a
# killed step left. Pipes and logs in this job's $RAY_TMP/mps. A node without nvidia-cuda-mps-control or a GPU
# says so in its Ray log and runs Ray alone. Written without it by --no-mps."""


# ---------------------------------------------------------------------------------------------------
# The command


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--settings", default=None, metavar="FILE",
                        help="a YAML file of these settings (keys as below, dashes or underscores); flags override it")
    parser.add_argument("--partition", default=None, help="Slurm partition (default: the cluster's default)")
    parser.add_argument("--account", default=None, help="account to charge")
    parser.add_argument("--qos", default=None, help="quality of service")
    parser.add_argument("--nodes", type=int, default=None, help="nodes of the job (default 1): Ray's head and workers")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="GPUs on each node (default 0)")
    parser.add_argument("--cpus-per-node", type=int, default=None,
                        help="CPUs on each node (default: Slurm's default for one task)")
    parser.add_argument("--mem-per-node", default=None, help="memory on each node, e.g. 64G")
    parser.add_argument("--time", default=None, help="time limit of each start of the job (default 24:00:00)")
    parser.add_argument("--signal-seconds", type=int, default=None,
                        help="Slurm's warning this long before the time limit: the study stops cleanly and the job "
                             "requeues itself (default 300)")
    parser.add_argument("--max-requeues", type=int, default=None,
                        help="starts after the first the job may have, time limits and preemptions together "
                             "(default 3)")
    parser.add_argument("--handover-seconds", type=int, default=None,
                        help="how often a Stage I being trained saves the state a requeued job continues from "
                             "(default 120)")
    parser.add_argument("--setup", action="append", default=None, metavar="LINE",
                        help="a shell line run before anything else on the job (repeatable), e.g. "
                             "'module load cuda/12.4' and 'source ~/venv/bin/activate'")
    parser.add_argument("--run-dir", default=None,
                        help="the folder the job runs the command from, on the cluster's shared file system; logs "
                             "go to <run dir>/slurm/ (default: this folder)")
    parser.add_argument("--job-name", default=None, help="job name (default calib-<study>)")
    parser.add_argument("--sbatch-option", action="append", default=None, dest="sbatch_options", metavar="OPTION",
                        help="another #SBATCH option, as given (repeatable), e.g. --sbatch-option=--constraint=a100")
    parser.add_argument("--mps", action=argparse.BooleanOptionalAction, default=None,
                        help="start NVIDIA MPS on every node of a GPU job before Ray, so trials sharing a GPU run at "
                             "once (default: on); --no-mps where the site runs MPS itself or must not share GPUs")
    parser.add_argument("--shared-path", action="append", default=None, dest="shared_paths", metavar="PATH",
                        help="a folder every node of the job sees at this path although calib takes it for "
                             "node-local (under /tmp, /var/tmp or /dev/shm, or on a memory file system), where the "
                             "Python, calib, the run directory and the store are refused (repeatable)")
    parser.add_argument("-o", "--output", default=None,
                        help="the script to write (default <run dir>/slurm/<job name>.sbatch)")
    parser.add_argument("--submit", action="store_true", help="also submit it with sbatch and say how to follow it")
    parser.add_argument("study_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="after --: the study command, e.g. -- python studies/sensitivity_gamma.py --preset "
                             "paper")


def _settings(args: argparse.Namespace) -> SlurmSettings:
    """The settings file's values, overridden by the flags given."""
    base = SlurmSettings.from_file(args.settings) if args.settings else SlurmSettings()
    given = {name: getattr(args, name) for name in ("partition", "account", "qos", "nodes", "gpus_per_node",
                                                    "cpus_per_node", "mem_per_node", "time", "signal_seconds",
                                                    "max_requeues", "handover_seconds", "run_dir", "job_name", "mps")}
    given.update({name: tuple(getattr(args, name)) for name in ("setup", "sbatch_options", "shared_paths")
                  if getattr(args, name)})
    settings = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    settings.check()
    return settings


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    from calib.cluster.slurm_checks import (
        check_command,
        check_shared_places,
        check_with_slurm,
        local_storage_warnings,
        submit,
    )

    settings = _settings(args)
    command = args.study_command[1:] if args.study_command[:1] == ["--"] else args.study_command
    run_dir = Path(settings.run_dir).expanduser().resolve()
    if not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is not a folder.")
    check_shared_places(run_dir, command, settings.shared_paths)
    name = settings.job_name or f"calib-{study_name(command)}"
    script = render_script(settings, command, name=name)
    if shutil.which("sbatch"):
        check_with_slurm(settings, script)
    elif args.submit:
        raise ConfigError("sbatch is not on this machine's PATH: run this on a login node of the cluster, or write "
                          "the script here (without --submit) and submit it there with sbatch.")
    checked = check_command(command, run_dir)
    for warning in local_storage_warnings(run_dir, command, settings.shared_paths):
        print(warning, file=sys.stderr)
    path = Path(args.output).resolve() if args.output else run_dir / "slurm" / f"{name}.sbatch"
    (run_dir / "slurm").mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    print(checked)
    if not args.submit:
        print(f"wrote {path}: submit it with `sbatch {path}`")
        return ExitCode.OK
    job = submit(path)
    log = run_dir / "slurm" / f"{name}-{job}.out"
    print(f"submitted job {job} ({path})\n  log:    {log}\n  follow: squeue -j {job}; tail -f {log}\n"
          f"  cancel: scancel {job}")
    return ExitCode.OK


def _flag_value(command: list[str], flag: str) -> str | None:
    """The value of ``flag`` in a command line (``--flag VALUE`` or ``--flag=VALUE``), None without it."""
    for i, token in enumerate(command):
        if token == flag and i + 1 < len(command):
            return command[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def study_name(command: list[str]) -> str:
    """The study a command runs: its --study, else the script's default (its file name; search_<space>)."""
    script = Path(command[1]).stem if len(command) > 1 else "study"
    space = _flag_value(command, "--space")
    return _flag_value(command, "--study") or (f"search_{Path(space).stem}" if script == "search" and space
                                              else script)


LAUNCHER = Launcher("slurm", "write (and with --submit, submit) an sbatch script that runs a study on a Slurm job's "
                             "nodes: python -m calib.cluster slurm [settings] -- python studies/<study>.py ...",
                    _add_arguments, _run)
"""``python -m calib.cluster slurm [settings] -- python studies/<study>.py ...``."""
