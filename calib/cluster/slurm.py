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
import re
import shlex
import shutil
import string
import sys
from importlib import resources
from pathlib import Path

from calib._config import ConfigError
from calib.cluster.launcher import Launcher
from calib.cluster.slurm_checks import (
    check_command,
    check_shared_places,
    check_with_slurm,
    local_storage_warnings,
    submit,
)
from calib.cluster.slurm_settings import SlurmSettings, add_setting_flags, given_settings, parse_time
from calib.exit_codes import ExitCode

__all__ = ["JOB_TEMPLATE", "LAUNCHER", "PATH_FLAGS", "SlurmSettings", "parse_time", "render_script", "typed_paths"]

PORTS_PER_JOB = 200
FIRST_PORT = 20_000
JOB_TEMPLATE = "slurm_job.sh"
"""The job script's template, package data of :mod:`calib.cluster` (its ``@name@`` placeholders are filled by
:func:`render_script`; shellcheck reads the template and every script rendered from it)."""

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
        "run_ray": 'python -m calib.cluster.mps run --dir "$RAY_DIR/mps" -- "$@"' if mps else '"$@"',
        "stop_mps": f"{_EACH_DIR}python -m calib.cluster.mps stop --dir \"$RAY_DIR/mps\"; done; " if mps else "",
        "object_store": f" --object-store-memory={store}" if store else "",
    }
    lines = [line for line in _job_template().split("\n")
             if not ((whole := _WHOLE_LINE.fullmatch(line)) and values[whole.group(1)] == "")]
    return _JobTemplate("\n".join(lines)).substitute(values)


_EACH_DIR = "'\"$EACH_DIR\"'"
"""The template's loop over the job's own Ray folders on a node, as the STOP_NODE string (single-quoted) splices it."""

_MPS_NOTE = """\
# NVIDIA MPS on each node, so trials sharing a GPU run at once: `mps run` starts its daemon, then the node's Ray
# (whose workers inherit CUDA_MPS_PIPE_DIRECTORY), and stops it when Ray ends, SIGTERM too; STOP_NODE stops one a
# killed step left. Pipes and logs in the job's Ray folder on the node ($RAY_DIR/mps). A node without
# nvidia-cuda-mps-control or a GPU says so in its Ray log and runs Ray alone. Written without it by --no-mps."""


# ---------------------------------------------------------------------------------------------------
# The command


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--settings", default=None, metavar="FILE",
                        help="a YAML file of these settings (keys as below, dashes or underscores); flags override it")
    add_setting_flags(parser)
    parser.add_argument("-o", "--output", default=None,
                        help="the script to write (default <run dir>/slurm/<job name>.sbatch)")
    parser.add_argument("--submit", action="store_true", help="also submit it with sbatch and say how to follow it")
    parser.add_argument("study_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="after --: the study command, e.g. -- python studies/sensitivity_gamma.py --preset "
                             "paper")


def _settings(args: argparse.Namespace) -> SlurmSettings:
    """The settings file's values, overridden by the flags given."""
    base = SlurmSettings.from_file(args.settings) if args.settings else SlurmSettings()
    settings = dataclasses.replace(base, **given_settings(args))
    settings.check()
    return settings


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    settings = _settings(args)
    run_dir = Path(settings.run_dir).expanduser().resolve()
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is a file: give the folder the job runs the command from.")
    command = typed_paths(args.study_command[1:] if args.study_command[:1] == ["--"] else args.study_command,
                          Path.cwd(), run_dir)
    check_shared_places(run_dir, command, settings.shared_paths)
    name = settings.job_name or f"calib-{study_name(command)}"
    script = render_script(settings, command, name=name)
    if shutil.which("sbatch"):
        check_with_slurm(settings, script)
    elif args.submit:
        raise ConfigError("sbatch is not on this machine's PATH: run this on a login node of the cluster, or write "
                          "the script here (without --submit) and submit it there with sbatch.")
    created = next((p for p in reversed([run_dir, *run_dir.parents]) if not p.exists()), None)
    run_dir.mkdir(parents=True, exist_ok=True)  # the study's check runs there, as the job will
    try:
        checked = check_command(command, run_dir)
    except ConfigError:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    for warning in local_storage_warnings(run_dir, command, settings.shared_paths):
        print(warning, file=sys.stderr)
    path = Path(args.output).resolve() if args.output else run_dir / "slurm" / f"{name}.sbatch"
    (run_dir / "slurm").mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    if created is not None:
        print(f"created the run directory {run_dir}")
    print(checked)
    if not args.submit:
        print(f"wrote {path}: submit it with `sbatch {path}`")
        return ExitCode.OK
    job = submit(path)
    log = run_dir / "slurm" / f"{name}-{job}.out"
    print(f"submitted job {job} ({path})\n  log:    {log}\n  follow: squeue -j {job}; tail -f {log}\n"
          f"  cancel: scancel {job}")
    return ExitCode.OK


PATH_FLAGS = ("--store", "--artifacts", "--data-root", "--storage", "--space", "--ladder", "--checkpoint",
              "--features", "--predictions")
"""The study flags whose values are paths (``--predictions`` takes several)."""


def typed_paths(command: list[str], typed_in: Path, run_dir: Path) -> list[str]:
    """``command`` with its study script and the relative paths given to :data:`PATH_FLAGS` made absolute from
    ``typed_in`` (where the command was typed), for a job that runs it from ``run_dir``; unchanged when the two
    are one folder. A study script that is not a file there is refused, with its absolute path suggested if the
    run directory has it."""
    if typed_in.resolve() == run_dir or len(command) < 2:
        return list(command)

    def absolute(token: str) -> str:
        return token if "://" in token or Path(token).expanduser().is_absolute() else str(typed_in / token)

    out = [command[0], absolute(command[1])]
    if not Path(out[1]).is_file():
        there = run_dir / command[1]
        hint = f" (the run directory has {there}: give that absolute path)" if there.is_file() else ""
        raise ConfigError(f"{command[1]} is not a file in {typed_in}, where this command was typed: give the study "
                          f"script's path from here, or its absolute path{hint}.")
    flag = None
    for token in command[2:]:
        name, eq, value = token.partition("=")
        if token.startswith("--"):
            flag = token if token in PATH_FLAGS else None
            out.append(f"{name}={absolute(value)}" if eq and name in PATH_FLAGS and value else token)
            continue
        out.append(absolute(token) if flag else token)
        if flag != "--predictions":
            flag = None
    return out


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
