"""NVIDIA MPS (Multi-Process Service) on a cluster node, so the trials that share a GPU run at once.

Without MPS the processes of trials that share a GPU (a fractional ``--gpus-per-trial``) take turns on it;
under one MPS control daemon their kernels run together (docs/how-to/ray-cluster.md, "NVIDIA MPS"). calib's
launchers run these commands on every node, before Ray starts there, so Ray's workers inherit
``CUDA_MPS_PIPE_DIRECTORY``:

- ``python -m calib.cluster.mps run --dir DIR -- ray start --block ...`` (the Slurm job's node step): MPS for
  as long as the command runs, stopped when it ends, on SIGTERM too;
- ``python -m calib.cluster.mps start -- ray start ...`` (``ray up``'s start commands): MPS left running
  after the command, and stopped by a watcher once this node's Ray (its ``raylet``) is gone (``ray stop``,
  ``ray down``, ``stop-workers``);
- ``python -m calib.cluster.mps stop`` stops the daemon of ``--dir`` if one runs there.

The daemon is not started, in one logged line and without failing, where ``--mps off`` says so, the node has
no ``nvidia-cuda-mps-control`` or no GPU, a GPU is in the Prohibited compute mode, or the site runs its own
MPS (``CUDA_MPS_PIPE_DIRECTORY`` already set, or a daemon at NVIDIA's default ``/tmp/nvidia-mps``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from calib._config import ConfigError
from calib._help import CommandParser
from calib.exit_codes import ExitCode

__all__ = ["MPS_CONTROL", "default_dir", "main", "parse_switch", "run", "start", "start_for_ray", "stop", "watch",
           "why_not"]

MPS_CONTROL = "nvidia-cuda-mps-control"
SITE_PIPE_DIRECTORY = Path("/tmp/nvidia-mps")  # NVIDIA's default: a daemon there is the site's own
_SWITCH = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


def parse_switch(value: object, flag: str = "--mps") -> bool:
    """``value`` as on (True) or off (False): a bool, or on/off, true/false, yes/no, 1/0; else ConfigError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _SWITCH:
        return _SWITCH[value.strip().lower()]
    raise ConfigError(f"{flag} {value!r} is neither on nor off; allowed: on, off (or true/false, yes/no).")


def default_dir() -> Path:
    """This user's MPS folder on a ``ray up`` node, node-local: ``$TMPDIR/calib-mps-<uid>``."""
    return Path(tempfile.gettempdir()) / f"calib-mps-{os.getuid()}"


def _say(message: str) -> None:
    print(f"[calib-mps {socket.gethostname()}] {message}", file=sys.stderr, flush=True)


def why_not() -> str | None:
    """Why this node runs no MPS daemon of calib's (one phrase), or None when it can."""
    if shutil.which(MPS_CONTROL) is None:
        return f"no {MPS_CONTROL} on the PATH"
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        return f"CUDA_MPS_PIPE_DIRECTORY is already set ({os.environ['CUDA_MPS_PIPE_DIRECTORY']}): the site's MPS"
    if (SITE_PIPE_DIRECTORY / "control").exists():
        return f"an MPS daemon runs at {SITE_PIPE_DIRECTORY} (the site's own)"
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on the PATH to list the GPUs"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"], env=env,
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "nvidia-smi did not answer within 30 s"
    modes = [line.strip() for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []
    if not modes:
        return "no GPU (nvidia-smi lists none)"
    if any(mode.lower() == "prohibited" for mode in modes):
        return "a GPU is in the Prohibited compute mode"
    return None


def _pipes(directory: Path) -> dict[str, str]:
    return {"CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}


def start(directory: Path) -> dict[str, str] | None:
    """Start a control daemon with its pipes and logs under ``directory``; the variables its clients need, or
    None (with the one line saying why) when it is not started."""
    reason = why_not()
    if reason is None:
        stop(directory, quiet=True)  # one left by an earlier start: a second daemon there would not start
        variables = _pipes(directory)
        for path in variables.values():
            Path(path).mkdir(parents=True, exist_ok=True, mode=0o700)
        # Without CUDA_VISIBLE_DEVICES: MPS would renumber the GPUs its clients name (Ray's workers keep theirs).
        env = {**{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}, **variables}
        try:
            proc = subprocess.run([MPS_CONTROL, "-d"], env=env, capture_output=True, text=True, timeout=30)
            output = (proc.stderr or proc.stdout).strip()
            failure = None if proc.returncode == 0 else f"exit {proc.returncode}: {output}"
        except (OSError, subprocess.TimeoutExpired) as err:
            failure = str(err)
        if failure is None:
            _say(f"MPS control daemon started (pipes {variables['CUDA_MPS_PIPE_DIRECTORY']}, logs "
                 f"{variables['CUDA_MPS_LOG_DIRECTORY']})")
            return variables
        reason = f"{MPS_CONTROL} -d failed ({failure})"
    _say(f"MPS not started: {reason}; GPU trials that share a GPU take turns on it")
    return None


def _start_if(enabled: bool, directory: Path) -> dict[str, str] | None:
    """:func:`start` where ``--mps`` is on; else the one line saying it is off."""
    if enabled:
        return start(directory)
    _say("MPS not started: --mps off")
    return None


def stop(directory: Path, *, quiet: bool = False) -> bool:
    """Stop the control daemon of ``directory`` (``quit``), if one runs there; whether one was stopped."""
    variables = _pipes(directory)
    if not (Path(variables["CUDA_MPS_PIPE_DIRECTORY"]) / "control").exists() or shutil.which(MPS_CONTROL) is None:
        return False
    try:  # `quit` returns once the daemon has exited; its clients (Ray's workers) are gone by now
        proc = subprocess.run([MPS_CONTROL], input="quit\n", env={**os.environ, **variables}, capture_output=True,
                              text=True, timeout=30)
        stopped = proc.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        stopped = False
    if not quiet or not stopped:
        _say("MPS control daemon stopped" if stopped else
             f"MPS control daemon of {directory} did not answer `quit` within 30 s (it may be gone already)")
    return stopped


def run(command: list[str], *, enabled: bool, directory: Path) -> int:
    """``command`` under MPS for as long as it runs (a SIGTERM or SIGINT is passed on to it); its exit code."""
    variables = _start_if(enabled, directory)
    child = subprocess.Popen(command, env={**os.environ, **(variables or {})})
    passed_on = {sig: signal.signal(sig, lambda s, _f: child.send_signal(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = child.wait()
    finally:
        for sig, handler in passed_on.items():
            signal.signal(sig, handler)
        if variables:
            stop(directory)
    return code


def start_for_ray(command: list[str], *, enabled: bool, directory: Path, poll: float = 2.0) -> int:
    """MPS, then ``command`` (``ray start``) with its variables; MPS stays for the node's Ray it starts and is
    stopped by a detached watcher once that Ray's ``raylet`` is gone (or at once if ``command`` fails)."""
    variables = _start_if(enabled, directory)
    before = set(_raylets())
    code = subprocess.run(command, env={**os.environ, **(variables or {})}).returncode
    started = sorted(set(_raylets()) - before)
    if variables and (code != 0 or not started):
        stop(directory)
    elif variables:
        with open(directory / "log" / "calib-watch.log", "ab") as log:
            subprocess.Popen([sys.executable, "-m", "calib.cluster.mps", "watch", "--dir", str(directory),
                              "--poll", str(poll), "--raylets", ",".join(map(str, started))],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    return code


def _raylets() -> list[int]:
    """This user's ``raylet`` processes on this node."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == os.getuid() and (
                    (entry / "comm").read_text().strip() == "raylet"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def watch(directory: Path, raylets: list[int], *, poll: float = 2.0) -> None:
    """Stop the daemon of ``directory`` once none of ``raylets`` (the node's Ray it serves) runs, or return
    once the daemon is gone."""
    control = Path(_pipes(directory)["CUDA_MPS_PIPE_DIRECTORY"]) / "control"
    while control.exists() and set(raylets) & set(_raylets()):
        time.sleep(poll)
    stop(directory)


def main(argv: list[str] | None = None) -> int:
    """The node's CLI, kept apart from ``python -m calib.cluster``'s launchers (it runs on every node, in 0.2 s).
    The command's exit code; 2 with one ``error:`` line for bad input."""
    parser = CommandParser(prog="python -m calib.cluster.mps", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "run", "stop", "watch"],
                        help="start: MPS, then COMMAND (ray start), MPS kept while this node's Ray runs; run: MPS "
                             "while COMMAND runs; stop: stop it (watch: what start leaves running)")
    parser.add_argument("--mps", default="on", help="on, or off to only run COMMAND (default on)")
    parser.add_argument("--dir", default=None, help="the daemon's node-local folder: pipes in DIR/pipe, logs in "
                                                    "DIR/log (default $TMPDIR/calib-mps-<uid>)")
    parser.add_argument("--poll", type=float, default=2.0, help=argparse.SUPPRESS)  # watch: seconds between looks
    parser.add_argument("--raylets", default="", help=argparse.SUPPRESS)  # watch: the raylet ids, comma-separated
    parser.epilog = "After --: the command to run with CUDA_MPS_PIPE_DIRECTORY set, e.g. -- ray start ..."
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    directory = Path(args.dir).expanduser().resolve() if args.dir else default_dir()
    try:
        enabled = parse_switch(args.mps)
        if args.action in ("start", "run") and not command:
            raise ConfigError(f"mps {args.action} needs the command to run after --, e.g. -- ray start --head")
        if args.action in ("stop", "watch") and command:
            raise ConfigError(f"mps {args.action} takes no command, got {' '.join(command)!r}.")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if args.action == "run":
        return run(command, enabled=enabled, directory=directory)
    if args.action == "start":
        return start_for_ray(command, enabled=enabled, directory=directory)
    if args.action == "watch":
        watch(directory, [int(pid) for pid in args.raylets.split(",") if pid], poll=args.poll)
    else:
        stop(directory)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
