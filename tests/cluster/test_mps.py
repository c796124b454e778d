"""NVIDIA MPS on a node (calib.cluster.mps) and in the Slurm job's node step, without a GPU: a fake
``nvidia-cuda-mps-control`` and ``nvidia-smi`` on the PATH record how they are called."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calib.cluster import mps
from calib.cluster.slurm import render_script

sys.path.insert(0, str(Path(__file__).parent))
from test_slurm_script import GPU_COMMAND, GPU_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
# The daemon's state changes before its call is logged, so a test that sees the line sees the state (a `quit`
# logged before its control pipe is gone let the next start find "a daemon" and quit it a second time).
FAKE_CONTROL = """#!/bin/sh
if [ "$1" = "-d" ]; then
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"
  echo "start pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY visible=${CUDA_VISIBLE_DEVICES-unset}" \\
    >> "$FAKE_MPS_LOG"
else
  read -r command; rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
  echo "$command pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$FAKE_MPS_LOG"
fi
"""


def _node(tmp_path: Path, *, control: bool = True, modes: str = "Default Default") -> dict[str, str]:
    """The environment of a node: this Python, and (``control``) a fake MPS daemon and GPUs in ``modes``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    if control:
        (bin_dir / mps.MPS_CONTROL).write_text(FAKE_CONTROL)
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s\\n' {modes}\n")
        for name in (mps.MPS_CONTROL, "nvidia-smi"):
            (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")}
    return {**env, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(ROOT), "FAKE_MPS_LOG": str(tmp_path / "calls"),
            "CUDA_VISIBLE_DEVICES": "2,3"}


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls"
    return log.read_text().splitlines() if log.exists() else []


def _mps_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "calib.cluster.mps", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT)


SHOW_PIPES = ["sh", "-c", 'echo "pipe=${CUDA_MPS_PIPE_DIRECTORY-unset}"; exit 7']


def test_mps_run_starts_the_daemon_before_the_command_and_stops_it_after(tmp_path: Path):
    env, where = _node(tmp_path), tmp_path / "job"
    proc = _mps_cli(env, "run", "--dir", str(where), "--", *SHOW_PIPES)
    assert proc.returncode == 7 and proc.stdout == f"pipe={where}/pipe\n", proc.stderr
    # Started with its own pipes and logs and without CUDA_VISIBLE_DEVICES (MPS would renumber the GPUs), stopped.
    assert _calls(tmp_path) == [f"start pipe={where}/pipe log={where}/log visible=unset", f"quit pipe={where}/pipe"]
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and lines[0].endswith(f"MPS control daemon started (pipes {where}/pipe, logs {where}/log)")
    assert lines[1].endswith("MPS control daemon stopped")


@pytest.mark.parametrize(("node", "reason"), [
    ({"control": False}, "no nvidia-cuda-mps-control on the PATH"),
    ({"modes": "''"}, "no GPU (nvidia-smi lists none)"),
    ({"modes": "Default Prohibited"}, "a GPU is in the Prohibited compute mode"),
    ({"site": True}, "CUDA_MPS_PIPE_DIRECTORY is already set (/run/site-mps): the site's MPS"),
    ({"off": True}, "--mps off"),
], ids=["no binary", "no GPU", "prohibited", "site MPS", "off"])
def test_a_node_that_cannot_run_mps_says_so_in_one_line_and_runs_the_command(tmp_path: Path, node: dict, reason: str):
    env = _node(tmp_path, control=node.get("control", True), modes=node.get("modes", "Default"))
    if node.get("site"):
        env["CUDA_MPS_PIPE_DIRECTORY"] = "/run/site-mps"
    flags = ["--mps", "off"] if node.get("off") else []
    proc = _mps_cli(env, "run", *flags, "--dir", str(tmp_path / "job"), "--", *SHOW_PIPES)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == ("pipe=/run/site-mps\n" if node.get("site") else "pipe=unset\n")
    [line] = proc.stderr.splitlines()
    assert line.startswith("[calib-mps ") and f"] MPS not started: {reason}" in line, line
    assert _calls(tmp_path) == []


def test_a_bad_mps_value_exits_2_naming_it(tmp_path: Path):
    proc = _mps_cli(_node(tmp_path), "run", "--mps", "sometimes", "--", "true")
    assert proc.returncode == 2
    assert proc.stderr == "error: --mps 'sometimes' is neither on nor off; allowed: on, off (or true/false, yes/no).\n"
    proc = _mps_cli(_node(tmp_path), "start", "--")
    assert proc.returncode == 2 and proc.stderr.startswith("error: mps start needs the command to run after --")


def test_mps_start_leaves_the_daemon_to_this_nodes_ray_and_stops_it_when_ray_stops(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch):
    """`ray up`'s start command: the daemon outlives `ray start`, and a watcher stops it once no raylet runs."""
    env = _node(tmp_path)
    for name in ("PATH", "FAKE_MPS_LOG", "PYTHONPATH"):
        monkeypatch.setenv(name, env[name])
    raylet = tmp_path / "raylet"  # `ray start`: starts a process named raylet, as Ray's, and returns
    shutil.copy("/bin/sleep", raylet)
    # ... and returns once it runs, as Ray's does (before its exec the child is still named sh)
    (tmp_path / "ray-start").write_text(
        f"#!/bin/sh\n{raylet} 60 > /dev/null 2>&1 &\necho $! > {tmp_path}/raylet.pid\n"
        'while [ "$(cat /proc/$!/comm 2>/dev/null)" != raylet ]; do sleep 0.01; done\n')
    (tmp_path / "ray-start").chmod(0o755)
    where = tmp_path / "node"
    try:
        assert mps.start_for_ray([str(tmp_path / "ray-start")], enabled=True, directory=where, poll=0.1) == 0
        time.sleep(1.0)  # ten polls with a raylet running
        assert _calls(tmp_path) == [f"start pipe={where}/pipe log={where}/log visible=unset"]
    finally:
        os.kill(int((tmp_path / "raylet.pid").read_text()), signal.SIGKILL)
    for _ in range(100):
        if len(_calls(tmp_path)) == 2:
            break
        time.sleep(0.1)
    assert _calls(tmp_path)[1:] == [f"quit pipe={where}/pipe"]
    # A failed `ray start` stops it at once.
    assert mps.start_for_ray(["false"], enabled=True, directory=where, poll=0.1) == 1
    assert _calls(tmp_path)[2:] == [f"start pipe={where}/pipe log={where}/log visible=unset",
                                    f"quit pipe={where}/pipe"]


def _node_step(script: str) -> str:
    """The script's lines that define the node's Ray step and its cleanup, to run outside Slurm."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("RAY_LOGS="))
    node_ray = next(i for i, line in enumerate(lines) if line.startswith("export NODE_RAY="))
    end = next(i for i in range(node_ray, len(lines)) if lines[i].endswith("exit $rc'"))
    return "\n".join(lines[start:end + 1])


FAKE_RAY = """#!/bin/bash
echo "ray $* pipe=${CUDA_MPS_PIPE_DIRECTORY-unset}" >> "$FAKE_MPS_LOG"
sleep 60 & wait
"""


@pytest.mark.parametrize("control", [True, False], ids=["MPS", "no nvidia-cuda-mps-control"])
def test_the_slurm_node_step_runs_ray_under_mps_and_stops_it_on_sigterm(tmp_path: Path, control: bool):
    """The node step as srun runs it (``bash -c "$NODE_RAY" ray <ray start ...>``), ended as Slurm ends a step:
    SIGTERM to each of its processes."""
    env = {**_node(tmp_path, control=control), "SLURM_JOB_ID": "77"}
    (tmp_path / "bin" / "ray").write_text(FAKE_RAY)
    (tmp_path / "bin" / "ray").chmod(0o755)
    ray_tmp = tmp_path / "calib-77"  # the step makes its own folder, calib-77.<8 random characters>, mode 0700
    step = (f"RAY_TMP={ray_tmp} LOG_DIR={tmp_path} RESTARTS=0\n" + _node_step(render_script(GPU_SETTINGS, GPU_COMMAND))
            + '\nexec bash -c "$NODE_RAY" ray ray start --block\n')
    proc = subprocess.Popen(["bash", "-c", step], env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for _ in range(200):
        if any(call.startswith("ray ") for call in _calls(tmp_path)):
            break
        time.sleep(0.05)
    made = list(tmp_path.glob("calib-77.*"))
    assert len(made) == 1 and re.fullmatch(r"calib-77\.[A-Za-z0-9]{8}", made[0].name), made
    assert made[0].stat().st_mode & 0o777 == 0o700 and made[0].stat().st_uid == os.getuid()
    os.killpg(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    ray_tmp = made[0]
    pipes = f"{ray_tmp}/mps/pipe"
    ray = f"ray start --block --temp-dir={ray_tmp}/ray pipe={pipes if control else 'unset'}"
    expected = [f"start pipe={pipes} log={ray_tmp}/mps/log visible=unset", ray, f"quit pipe={pipes}"]
    assert _calls(tmp_path) == (expected if control else [ray]), output
    assert not ray_tmp.exists()  # the step's own cleanup, as before
    said = [line for line in output.splitlines() if "[calib-mps " in line]
    assert len(said) == (2 if control else 1), output
    assert control or "MPS not started: no nvidia-cuda-mps-control on the PATH" in said[0]


FAILING_RAY = """#!/bin/bash
dir=${3#--temp-dir=}
mkdir -p "$dir/session_1/logs" && ln -s session_1 "$dir/session_latest"
echo "raylet: Timed out waiting for file" > "$dir/session_1/logs/raylet.out"
exit 1
"""


def test_a_ray_start_that_fails_by_itself_keeps_its_logs_in_the_run_directory(tmp_path: Path):
    """The node step of a CPU job (``bash -c "$NODE_RAY" ray ray start --block``) whose ``ray start`` fails on its
    own, as a worker that cannot join does: Ray's logs of the node are copied to
    ``<run dir>/slurm/<id>-start<N>-ray-<node>-logs/`` and said, then the folder is removed."""
    env = {**_node(tmp_path, control=False), "SLURM_JOB_ID": "78", "SLURMD_NODENAME": "n7"}
    (tmp_path / "bin" / "ray").write_text(FAILING_RAY)
    (tmp_path / "bin" / "ray").chmod(0o755)
    (tmp_path / "slurm").mkdir()
    step = (f"RAY_TMP={tmp_path}/calib-78 LOG_DIR={tmp_path}/slurm RESTARTS=1\n"
            + _node_step(render_script(dataclasses.replace(GPU_SETTINGS, gpus_per_node=0), GPU_COMMAND))
            + '\nexec bash -c "$NODE_RAY" ray ray start --block\n')
    proc = subprocess.run(["bash", "-c", step], env=env, capture_output=True, text=True, timeout=60)
    kept = tmp_path / "slurm" / "78-start2-ray-n7-logs"
    assert proc.returncode == 1, proc.stderr
    assert (kept / "raylet.out").read_text() == "raylet: Timed out waiting for file\n"
    assert proc.stdout.splitlines()[-1] == f"Ray exited with 1: its logs in {kept}", proc.stdout
    assert not list(tmp_path.glob("calib-78*"))  # the folder, removed after its logs were kept


def test_the_script_has_mps_for_a_gpu_job_unless_turned_off():
    on = render_script(GPU_SETTINGS, GPU_COMMAND)
    node_ray = next(line for line in on.splitlines() if line.startswith("export NODE_RAY="))
    node_ray = on[on.index("export NODE_RAY="):on.index("exit $rc'", on.index("export NODE_RAY="))]
    assert 'python -m calib.cluster.mps run --dir "$RAY_DIR/mps" -- "$@" --temp-dir="$RAY_DIR/ray"' in node_ray
    assert ('pkill -KILL -f -- "$RAY_PATTERN"; \'"$EACH_DIR"\'python -m calib.cluster.mps stop --dir "$RAY_DIR/mps"; '
            'done; ' in on)
    for settings in (dataclasses.replace(GPU_SETTINGS, mps=False), dataclasses.replace(GPU_SETTINGS, gpus_per_node=0)):
        assert "mps" not in render_script(settings, GPU_COMMAND).lower()


def test_a_bad_mps_setting_in_a_settings_file_exits_2_with_one_error_line(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]):
    from calib.cluster import main

    settings = tmp_path / "slurm.yaml"
    settings.write_text("gpus-per-node: 1\nmps: sometimes\n")
    assert main(["slurm", "--settings", str(settings), "--run-dir", str(tmp_path), "--", "python",
                 "studies/sensitivity_gamma.py"]) == 2
    assert capsys.readouterr().err == ("error: --mps must be true or false (on or off in a settings file), got "
                                       "'sometimes'.\n")
    assert not (tmp_path / "slurm").exists()
