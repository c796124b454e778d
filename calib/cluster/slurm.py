"""Slurm: one generated sbatch script runs any study on the nodes of one job, through time limits and preemption.

``python -m calib.cluster slurm [settings] -- python studies/<study>.py ...`` writes
``<run dir>/slurm/<job name>.sbatch`` (``--submit`` also submits it). The script, on the job's nodes:

1. runs the setup lines (``module load``, a virtual environment), then starts Ray: the head on the first
   node and a worker on every other node, each through ``srun --overlap``, at the node's address from
   Slurm (``scontrol show node``: ``hostname -i`` gives 127.0.0.1 on many nodes), with ports and a
   temporary folder derived from the job id (two jobs on one node never share them; socket paths stay
   under Ray's 107 bytes), and token authentication set explicitly for every node and the driver (a
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

Logs: ``<run dir>/slurm/<job name>-<job id>.out`` (every start appended) and one Ray log per node.
Before writing, the settings, the study command (run with ``--check-only``), the partition and account
(``sbatch --test-only``) and GPUs on the partition (``sinfo``) are checked: bad input exits 2 with one
``error:`` line and nothing is submitted. A run directory, store or artifact folder on a node-local
file system is a warning.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from calib import storage
from calib._config import ConfigError

__all__ = ["INTERRUPTED_EXIT_CODE", "SlurmSettings", "check_command", "check_with_slurm", "local_storage_warnings",
           "parse_time", "render_script", "submit"]

INTERRUPTED_EXIT_CODE = 3  # calib.search.tuner.INTERRUPTED_EXIT_CODE, without importing Ray's side here
PORTS_PER_JOB = 200
FIRST_PORT = 20_000
_MEM = re.compile(r"[1-9][0-9]*[KMGT]?")
_TIME_FORMATS = ("MINUTES", "MINUTES:SECONDS", "HOURS:MINUTES:SECONDS", "DAYS-HOURS", "DAYS-HOURS:MINUTES",
                 "DAYS-HOURS:MINUTES:SECONDS")
# File systems a node keeps to itself: the job's other nodes (and a requeued job's) would not see files there.
NODE_LOCAL_FILE_SYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "ramfs", "f2fs", "vfat"}


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
        for key in ("setup", "sbatch_options"):
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


def render_script(settings: SlurmSettings, command: list[str], *, name: str | None = None) -> str:
    """The sbatch script that runs ``command`` (a study command line, run from the run directory)."""
    run_dir = Path(settings.run_dir).expanduser().resolve()
    name = name or settings.job_name or "calib"
    study = " ".join(shlex.quote(token) for token in command)
    return "\n".join([
        "#!/bin/bash", *_sbatch_lines(settings, name, run_dir / "slurm"),
        _header(settings, name, run_dir, study),
        _signal_traps(),
        _setup_lines(settings, run_dir),
        _ray_settings(settings),
        _ray_stop(settings),
        _ray_start(settings),
        _run_study(study),
        _last_line(),
    ])


def _header(settings: SlurmSettings, name: str, run_dir: Path, study: str) -> str:
    """What wrote the script and how to submit, follow and cancel it; the job's start line, and no start
    beyond ``max_requeues``."""
    log_dir = run_dir / "slurm"
    return f"""#
# Written by `python -m calib.cluster slurm` for the study command:
#   {study}
# Submit: sbatch {log_dir / (name + ".sbatch")}    Follow: tail -f {log_dir}/{name}-<job id>.out
# Cancel: scancel <job id>    What it does: docs/how-to/slurm.md.
set -uo pipefail

RUN_DIR={shlex.quote(str(run_dir))}
LOG_DIR="$RUN_DIR/slurm"
MAX_REQUEUES={settings.max_requeues}
INTERRUPTED={INTERRUPTED_EXIT_CODE}
RESTARTS=${{SLURM_RESTART_COUNT:-0}}
say() {{ echo "[calib-slurm $(date +%H:%M:%S)] $*"; }}
say "job $SLURM_JOB_ID, start $((RESTARTS + 1)) of at most $((MAX_REQUEUES + 1)), nodes $SLURM_JOB_NODELIST"
if (( RESTARTS > MAX_REQUEUES )); then
  say "not run: started more often than the $MAX_REQUEUES requeues allowed; the study is not finished:" \\
    "submit this script again to continue it"
  exit $INTERRUPTED
fi"""


def _signal_traps() -> str:
    """Slurm's warning (USR1) and SIGTERM remembered, passed on to the study once it runs, and why Slurm
    sent SIGTERM, from its record of the job."""
    return """# Slurm's warning before the time limit (USR1): the study stops cleanly, the job requeues itself.
# SIGTERM (scontrol requeue, a preemption, scancel, the time limit): Slurm is ending the job and kills whatever
# is left KillWait seconds later. Until the study starts, only remembered.
SIGNALLED=""
ENDING=""
DRIVER=""
# Why Slurm sent SIGTERM, from its record of the job: a requeue counts one more restart, the time limit is the
# reason; a job still running was only signalled (scancel --signal=TERM); any other was cancelled.
why_sigterm() {
  local record
  record=$(timeout 2 scontrol show job "$SLURM_JOB_ID" 2>/dev/null) || { echo unknown; return; }
  if [[ $record =~ Restarts=([0-9]+) ]] && (( BASH_REMATCH[1] > RESTARTS )); then echo requeued
  elif [[ $record == *Reason=TimeLimit* ]]; then echo time-limit
  elif [[ $record == *JobState=RUNNING* ]]; then echo signalled
  else echo cancelled; fi
}
on_signal() {
  SIGNALLED=$1
  [[ -n $DRIVER ]] && kill -TERM "$DRIVER" 2>/dev/null
  if [[ $1 == USR1 ]]; then
    say "USR1: stopping the study cleanly"
    return
  fi
  ENDING=$(why_sigterm)
  case $ENDING in
    requeued) say "SIGTERM: Slurm requeued the job (scontrol requeue or a preemption); stopping the study" ;;
    time-limit) say "SIGTERM: the job reached its time limit; stopping the study" ;;
    cancelled) say "SIGTERM: Slurm cancelled the job (scancel, or a preemption that cancels); stopping the study" ;;
    *) say "SIGTERM: stopping the study" ;;
  esac
}
trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM
"""


def _setup_lines(settings: SlurmSettings, run_dir: Path) -> str:
    """The user's setup lines (``module load``, a virtual environment), then into the run directory."""
    setup = "\n".join(settings.setup) if settings.setup else "# (no setup lines: python and ray from the PATH)"
    return f"""{setup}
cd "$RUN_DIR" || {{ say "the run directory $RUN_DIR is not reachable on $(hostname)"; exit 1; }}
"""


def _ray_settings(settings: SlurmSettings) -> str:
    """Each node's address from Slurm, Ray's ports and folder from the job id, token authentication, the
    handover period, and the CPUs and GPUs Slurm gave each node."""
    return f"""# Node addresses from Slurm: `hostname --ip-address` gives 127.0.0.1 on many nodes.
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
node_addr() {{ scontrol show node "$1" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p'; }}
HEAD_IP=$(node_addr "${{NODES[0]}}")

# Ray's ports and folder from the job id: two jobs on one node never share them, and its socket paths stay
# under 107 bytes whatever $TMPDIR is.
BASE=$(( {FIRST_PORT} + SLURM_JOB_ID % {(65_000 - FIRST_PORT) // PORTS_PER_JOB} * {PORTS_PER_JOB} ))
RAY_TMP={shlex.quote(settings.ray_tmp.rstrip("/") or "/")}/calib-$SLURM_JOB_ID
PORTS="--node-manager-port=$((BASE + 1)) --object-manager-port=$((BASE + 2))
  --dashboard-agent-grpc-port=$((BASE + 4)) --dashboard-agent-listen-port=$((BASE + 5))
  --metrics-export-port=$((BASE + 6)) --runtime-env-agent-port=$((BASE + 7))
  --min-worker-port=$((BASE + 20)) --max-worker-port=$((BASE + {PORTS_PER_JOB - 1}))"
# Ray's client server (10001 by default) runs when its dependency is installed: on the job's port then.
CLIENT=""
python -c 'import grpc' 2>/dev/null && CLIENT="--ray-client-server-port=$((BASE + 3))"

# Token authentication, explicit and the same on every node and the driver.
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$LOG_DIR/.ray-token-$SLURM_JOB_ID" RAY_USAGE_STATS_ENABLED=0
# Ray stops at once on SIGTERM: its drain (up to 30 s, for Ray Serve) would outlast a short KillWait.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0
(umask 077 && python -c 'import secrets; print(secrets.token_hex(32))' > "$RAY_AUTH_TOKEN_PATH")
export CALIB_STAGE1_HANDOVER_SECONDS=${{CALIB_STAGE1_HANDOVER_SECONDS:-{settings.handover_seconds}}}
CPUS=${{SLURM_CPUS_PER_TASK:-${{SLURM_CPUS_ON_NODE:-1}}}}
GPUS=${{SLURM_GPUS_ON_NODE:-0}}
"""


def _ray_stop(settings: SlurmSettings) -> str:
    """How this job's Ray stops: each node's Ray step removes its folder when Ray ends, and ``stop_ray``
    stops it on every node, unless Slurm's SIGTERM (the job is ending) already did. A GPU job's Ray runs
    under NVIDIA MPS (:func:`_mps_lines`), stopped with it."""
    mps = settings.mps and settings.gpus_per_node > 0
    run_ray = 'python -m calib.cluster.mps run --dir "$RAY_TMP/mps" -- "$@"' if mps else '"$@"'
    stop_mps = 'python -m calib.cluster.mps stop --dir "$RAY_TMP/mps"; ' if mps else ""
    return """STEPS=()
# This job's Ray only: its processes name $RAY_TMP ("[/]": the pattern does not match a command line holding it).
# The steps that run them take it from the environment: stopping Ray never kills srun (bash would log it).
export RAY_TMP RAY_PATTERN="[${RAY_TMP:0:1}]${RAY_TMP:1}"
# Ray's folder goes after its processes; a worker process still writing its last log can outlast them a moment.
REMOVE_TMP='for _ in $(seq 10); do rm -rf -- "$RAY_TMP" 2>/dev/null; [[ -e $RAY_TMP ]] || break; sleep 0.5; done'
""" + (_mps_lines() if mps else "") + """\
STOP_NODE='pkill -TERM -f -- "$RAY_PATTERN"; for _ in $(seq 20); do pgrep -f -- "$RAY_PATTERN" >/dev/null || break
  sleep 0.5; done; pkill -KILL -f -- "$RAY_PATTERN"; """ + stop_mps + """'"$REMOVE_TMP"
# Each node's Ray runs in a step that removes the folder when Ray ends, also when Slurm ends the step (preemption,
# requeue: the batch script can start no step then, so only the node itself can clean up).
export NODE_RAY='trap : TERM; """ + run_ray + """ --temp-dir="$RAY_TMP"; rc=$?; '"$REMOVE_TMP"'; exit $rc'
stop_ray() {
  # After Slurm's SIGTERM every Ray process of the job has it too and stops at once (no drain), and Slurm
  # ends the steps: nothing to wait for. Otherwise SIGTERM to the steps (srun passes it to every process of
  # its step, Ray's agents included, which would outlive a raylet stopped alone), then Ray stopped and its
  # folder removed on every node.
  if [[ $SIGNALLED != TERM || $ENDING == signalled ]]; then
    kill "${STEPS[@]}" 2>/dev/null
    srun --overlap --nodes=${#NODES[@]} --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c "$STOP_NODE" >/dev/null 2>&1
    wait "${STEPS[@]}" 2>/dev/null
  fi
  rm -f -- "$RAY_AUTH_TOKEN_PATH"
}
"""


def _mps_lines() -> str:
    """Why each node's Ray runs under ``mps run``, and ``STOP_NODE`` stops MPS too."""
    return """\
# NVIDIA MPS on each node, so trials sharing a GPU run at once: `mps run` starts its daemon, then the node's Ray
# (whose workers inherit CUDA_MPS_PIPE_DIRECTORY), and stops it when Ray ends, SIGTERM too; STOP_NODE stops one a
# killed step left. Pipes and logs in this job's $RAY_TMP/mps. A node without nvidia-cuda-mps-control or a GPU
# says so in its Ray log and runs Ray alone. Written without it by --no-mps.
"""


def _ray_start(settings: SlurmSettings) -> str:
    """Ray's head on the first node, a worker on every other, each in an ``srun --overlap`` step with its
    log; then wait until every node has joined."""
    store = _object_store_bytes(settings.mem_per_node)
    head_options = f" --object-store-memory={store}" if store else ""
    return f"""RAY_LOGS="$LOG_DIR/$SLURM_JOB_ID-start$((RESTARTS + 1))-ray"  # one log per node and start
say "Ray head on ${{NODES[0]}} ($HEAD_IP:$BASE), $((${{#NODES[@]}} - 1)) worker node(s); logs $RAY_LOGS-*.log"
srun --overlap --nodes=1 --ntasks=1 -w "${{NODES[0]}}" bash -c "$NODE_RAY" ray \\
  ray start --head --block --node-ip-address="$HEAD_IP" --port=$BASE $PORTS $CLIENT \\
  --num-cpus="$CPUS" --num-gpus="$GPUS" --include-dashboard=false \\
  --disable-usage-stats{head_options} >"$RAY_LOGS-${{NODES[0]}}.log" 2>&1 &
STEPS+=($!)
for _ in $(seq 120); do (exec 3<>"/dev/tcp/$HEAD_IP/$BASE") 2>/dev/null && break; sleep 1; done
for node in "${{NODES[@]:1}}"; do
  srun --overlap --nodes=1 --ntasks=1 -w "$node" bash -c "$NODE_RAY" ray ray start --block --address="$HEAD_IP:$BASE" \\
    --node-ip-address="$(node_addr "$node")" $PORTS --num-cpus="$CPUS" --num-gpus="$GPUS" \\
    --disable-usage-stats{head_options} >"$RAY_LOGS-$node.log" 2>&1 &
  STEPS+=($!)
done
if ! python -m calib.cluster wait --nodes ${{#NODES[@]}} --address "$HEAD_IP:$BASE" --timeout 300; then
  say "Ray did not start on every node: see $RAY_LOGS-*.log"
  stop_ray
  exit 1
fi
"""


def _run_study(study: str) -> str:
    """The study with ``--address`` of the head, unless a signal came first; its exit code in ``RC``."""
    return f"""RC=$INTERRUPTED
if [[ -z $SIGNALLED ]]; then
  say "study: {study} --address $HEAD_IP:$BASE"
  {study} --address "$HEAD_IP:$BASE" &
  DRIVER=$!
  while true; do
    wait "$DRIVER"
    RC=$?
    kill -0 "$DRIVER" 2>/dev/null || break  # wait returned for a signal: the driver is still stopping
  done
fi
trap '' USR1
stop_ray
"""


def _last_line() -> str:
    """The log's last line and the exit code: how the study ended, and what continues it."""
    return """if (( RC == 0 )); then
  say "the study finished"
  exit 0
elif (( RC == INTERRUPTED )) && [[ $SIGNALLED == USR1 ]]; then
  if (( RESTARTS < MAX_REQUEUES )); then
    say "interrupted before the time limit: the study is not finished; requeued, start $((RESTARTS + 2)) continues it"
    trap 'exit $INTERRUPTED' TERM  # the requeue's own SIGTERM ends this script, with the same exit code
    scontrol requeue "$SLURM_JOB_ID"
  else
    say "interrupted before the time limit, after $((RESTARTS + 1)) starts (no requeue left): the study is not" \\
      "finished; submit this script again to continue it"
  fi
  exit $INTERRUPTED
elif [[ $SIGNALLED == TERM ]]; then
  case $ENDING in
    requeued) say "the study stopped after SIGTERM: the job was requeued; start $((RESTARTS + 2)) continues it" ;;
    time-limit) say "the study stopped at the time limit, before Slurm's warning could stop it: the job is not" \\
      "requeued; submit this script again, or run the same study command, to continue it" ;;
    cancelled) say "the study stopped after SIGTERM: the job was cancelled; submit this script again, or run the" \\
      "same study command, to continue it" ;;
    signalled) say "the study stopped after a SIGTERM sent to the job (not a requeue): submit this script again," \\
      "or run the same study command, to continue it" ;;
    *) say "the study stopped after SIGTERM (Slurm did not say why): a requeued job continues it; otherwise submit" \\
      "this script again, or run the same study command" ;;
  esac
  exit $INTERRUPTED
fi
say "the study exited with $RC"
exit $RC
"""


# ---------------------------------------------------------------------------------------------------
# Checks before submission


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
