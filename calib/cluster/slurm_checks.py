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
from pathlib import Path

from calib import storage
from calib._config import ConfigError
from calib.cluster.slurm import SlurmSettings

__all__ = ["NODE_LOCAL_FILE_SYSTEMS", "check_command", "check_with_slurm", "local_storage_warnings", "submit"]

# File systems a node keeps to itself: the job's other nodes (and a requeued job's) would not see files there.
NODE_LOCAL_FILE_SYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "ramfs", "f2fs", "vfat"}


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


def local_storage_warnings(run_dir: Path, command: list[str]) -> list[str]:
    """Warnings for the run directory and the command's --store, --artifacts and --storage when they are on
    a node-local file system (the job's nodes, and a requeued job's, would each see their own)."""
    places = {"the run directory": str(run_dir)}
    for flag in ("--store", "--artifacts", "--storage"):
        for i, token in enumerate(command):
            if token == flag and i + 1 < len(command):
                places[flag] = command[i + 1]
            elif token.startswith(flag + "="):
                places[flag] = token.split("=", 1)[1]
    if "--store" not in places:
        places["--store (default results)"] = "results"
    warnings = []
    for what, where in places.items():
        if storage.is_remote(where):
            continue
        path = Path(where) if Path(where).is_absolute() else run_dir / where
        kind = _file_system(path)
        if kind in NODE_LOCAL_FILE_SYSTEMS:
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
