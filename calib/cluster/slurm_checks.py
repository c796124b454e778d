"""The checks ``python -m calib.cluster slurm`` makes before it writes or submits a job script: the study
command (its own ``--check-only``), the places the job's nodes must share, and Slurm's own view of the job
(``sbatch --test-only``, ``sinfo``); then the submission. Bad input is a ``ConfigError`` (exit 2, one
``error:`` line), and nothing is submitted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import calib
from calib import storage
from calib._config import ConfigError
from calib.cluster.slurm_settings import SlurmSettings

__all__ = ["MEMORY_FILE_SYSTEMS", "NODE_LOCAL_FILE_SYSTEMS", "NODE_LOCAL_PATHS", "check_command", "check_shared_places",
           "check_with_slurm", "local_storage_warnings", "node_local_places", "submit"]

NODE_LOCAL_PATHS = ("/tmp", "/var/tmp", "/dev/shm")
"""Folders each node of a cluster has to itself: a job's other nodes, and a requeued job's, see their own. The job's
Python, calib, run directory and store are refused there (:func:`check_shared_places`)."""
MEMORY_FILE_SYSTEMS = frozenset({"tmpfs", "ramfs"})
"""File systems in a node's memory, node-local wherever they are mounted: refused as :data:`NODE_LOCAL_PATHS` are."""
NODE_LOCAL_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "overlay", "f2fs", "vfat"})
"""A disk's file systems: node-local unless the site exports them (the login node's may be the cluster's shared
one), so the run directory or a store there is a warning (:func:`local_storage_warnings`), not an error."""


def check_command(command: list[str], run_dir: Path) -> str:
    """Check the study command as calib does before it runs (``--check-only``, from ``run_dir``); its
    summary line. ``ConfigError`` with the study's own error for bad input."""
    if len(command) < 2 or not command[1].endswith(".py") or (Path(command[0]).name not in (
            "python", "python3", Path(sys.executable).name) and not command[0].startswith("python")):
        raise ConfigError(f"The command to run must be a study, `python studies/<study>.py ...`, got "
                          f"{' '.join(command) or 'nothing'!r} (put it after `--`).")
    if any(token == "--address" or token.startswith("--address=") for token in command):
        raise ConfigError("The study command must not have --address: the job script passes the address of the "
                          "Ray it starts on the job's nodes.")
    script = run_dir / command[1]
    if not script.is_file():
        raise ConfigError(f"{command[1]} is not a file in the run directory {run_dir}: the job runs the command "
                          f"from there (--run-dir).")
    proc = subprocess.run([sys.executable, str(script), *command[2:], "--check-only"], cwd=run_dir,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [line.removeprefix("error: ") for line in proc.stderr.splitlines() if line.startswith("error:")]
        usage = [line for line in proc.stderr.splitlines() if ": error: " in line]  # argparse's
        reason = " ".join(errors or [u.split(": error: ", 1)[1] for u in usage]) or proc.stderr.strip()[-500:]
        raise ConfigError(f"The study command fails calib's checks: {reason}")
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "checked"


def _file_system(path: Path) -> str | None:
    """The type of the file system holding ``path`` (its nearest existing parent), from /proc/mounts."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    best, kind = "", None
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3:
            mount = fields[1].replace("\\040", " ")
            if (str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                best, kind = mount, fields[2]
    return kind


def _study_places(run_dir: Path, command: list[str]) -> dict[str, Path]:
    """The run directory and the command's --store, --artifacts and --storage (the store by default ``results``
    in the run directory) that are paths, not URIs: what every node of the job writes or reads."""
    places = {"the run directory": str(run_dir)}
    for flag in ("--store", "--artifacts", "--storage"):
        for i, token in enumerate(command):  # the last one counts, as for argparse
            if token == flag and i + 1 < len(command):
                places[flag] = command[i + 1]
            elif token.startswith(flag + "="):
                places[flag] = token.split("=", 1)[1]
    if "--store" not in places:
        places["--store (default results)"] = "results"
    return {what: Path(where) if Path(where).is_absolute() else run_dir / where
            for what, where in places.items() if not storage.is_remote(where)}


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _is_shared(path: Path, shared: Sequence[str]) -> bool:
    return any(_under(path.resolve(), Path(folder).expanduser().resolve()) for folder in shared)


def node_local_places(run_dir: Path, command: list[str], shared: Sequence[str] = ()) -> list[str]:
    """What the job needs on every node but lies where each node has its own: under :data:`NODE_LOCAL_PATHS`
    or on a :data:`MEMORY_FILE_SYSTEMS` mount (``/proc/mounts``, what ``findmnt`` shows): the Python running
    this command (the job's, unless its setup lines put another on the PATH), the calib it imports, the run
    directory, the study script and the command's store, artifacts and Ray storage. Each as
    ``"<what> <path> (under /tmp)"``; nothing under a folder of ``shared`` (``--shared-path``)."""
    python = Path(sys.executable)
    places = {"the Python": python.parent.resolve() / python.name, "calib": Path(calib.__file__).resolve().parent,
              **_study_places(run_dir, command)}
    if len(command) > 1 and not _under(run_dir / command[1], run_dir):  # else: the run directory's line says it
        places["the study script"] = run_dir / command[1]
    found = []
    for what, path in places.items():
        if _is_shared(path, shared):
            continue
        resolved = path.resolve()
        folder = next((f for f in NODE_LOCAL_PATHS if _under(resolved, Path(f))), None)
        kind = None if folder else _file_system(resolved)
        if folder or kind in MEMORY_FILE_SYSTEMS:
            why = f"under {folder}" if folder else f"on {kind}, in the node's memory"
            found.append(f"{what} {path} ({why})")
    return found


def check_shared_places(run_dir: Path, command: list[str], shared: Sequence[str] = ()) -> None:
    """``ConfigError`` in one line naming every :func:`node_local_places` of the job, before anything is
    written or submitted: its nodes would not see them (the job would fail on a node that cannot import calib,
    or write each node's own store)."""
    places = node_local_places(run_dir, command, shared)
    if places:
        one = len(places) == 1
        raise ConfigError(
            f"node-local path{'' if one else 's'}: {', '.join(places)}. Each node of a Slurm job has its own there: "
            f"the job's other nodes, and a requeued job's, would not see {'it' if one else 'them'}. Put the Python "
            f"(a virtual environment), calib, the run directory and the store on the cluster's shared file system "
            f"(a store may also be s3://), or name a folder every node does see at the same path with "
            f"--shared-path.")


def local_storage_warnings(run_dir: Path, command: list[str], shared: Sequence[str] = ()) -> list[str]:
    """Warnings for the run directory and the command's --store, --artifacts and --storage when they are on
    a disk's file system (:data:`NODE_LOCAL_FILE_SYSTEMS`): node-local unless the site exports it to the nodes
    (the job's nodes, and a requeued job's, would then each see their own). Nothing under ``shared``."""
    warnings = []
    for what, path in _study_places(run_dir, command).items():
        kind = _file_system(path)
        if kind in NODE_LOCAL_FILE_SYSTEMS and not _is_shared(path, shared):
            warnings.append(f"warning: {what} {path} is on a node-local file system ({kind}): each node of the job, "
                            f"and a requeued job's, would see its own copy. Put it on the cluster's shared file "
                            f"system, or use an s3:// store.")
    return warnings


def check_with_slurm(settings: SlurmSettings, script: str) -> None:
    """Ask Slurm whether it would accept the job (``sbatch --test-only``: partition, account, QOS, time,
    resources) and whether the partition has GPUs when the job asks for them; ``ConfigError`` with
    Slurm's own message if not. Nothing is submitted."""
    if settings.gpus_per_node and shutil.which("sinfo"):
        query = ["sinfo", "--noheader", "--format=%P %G"] + (["--partition", settings.partition]
                                                             if settings.partition else [])
        rows = subprocess.run(query, capture_output=True, text=True).stdout.split("\n")
        rows = [r.split(None, 1) for r in rows if r.strip()]
        if settings.partition is None:
            rows = [r for r in rows if r[0].endswith("*")] or rows
        if rows and not any("gpu" in (r[1] if len(r) > 1 else "") for r in rows):
            partition = rows[0][0].rstrip("*")
            raise ConfigError(f"--gpus-per-node {settings.gpus_per_node}: partition {partition} has no GPUs (its "
                              f"nodes' GRES: {', '.join(sorted({r[1] if len(r) > 1 else '(null)' for r in rows}))}). "
                              f"Choose a GPU partition (`sinfo -o '%P %G'` lists them) or drop --gpus-per-node.")
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", delete=False) as out:
        out.write(script)
    try:
        proc = subprocess.run(["sbatch", "--test-only", out.name], capture_output=True, text=True)
    finally:
        os.unlink(out.name)
    if proc.returncode != 0:
        message = " ".join(line.removeprefix("sbatch: error: ").strip() for line in proc.stderr.splitlines()
                           if "error" in line) or proc.stderr.strip()
        raise ConfigError(f"Slurm would not accept the job: {message}")


def submit(path: Path) -> str:
    """Submit the script at ``path``; its job id."""
    proc = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"sbatch refused the job: {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]
