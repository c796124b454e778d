"""Multi-node Ray on one machine: a head and a second node, a network namespace apart, run a study with --address auto.

The head runs in this network namespace on one end of a veth pair (10.231.N.1), the second node inside a
namespace the test creates (10.231.N.2); traffic stays on that pair. The driver is the study command a user types
on the head host: ``--address auto`` finds the cluster in ``$RAY_TMPDIR/ray/ray_current_cluster`` and connects to
the head's raylet, whose IP it takes as its own. (With the head inside the namespace instead, the driver would take
the namespace's IP and the second node could not reach it.) Both nodes share this machine's filesystem, so the
store and its Stage-I artifacts are a storage both reach. ``RAY_TMPDIR`` keeps the cluster out of ``/tmp/ray``, and
a per-run ``RAY_AUTH_TOKEN`` keeps ``~/.ray/auth_token`` out of it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
IP = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.access(p, os.X_OK)), None)
_RAY_NEXT_TO_PYTHON = Path(sys.executable).with_name("ray")  # the `ray` CLI of the interpreter running the tests
RAY = str(_RAY_NEXT_TO_PYTHON) if _RAY_NEXT_TO_PYTHON.exists() else shutil.which("ray") or "ray"
SEEDS = [1, 2, 3]
# 3 seeds × (vanilla + one γ): 6 trials, 3 Stage-I trainings. Trial actors (one per node) take ~15 s to start and
# are reused; 10 Stage-I epochs (~5-9 s a training here) keep the first node to start from running the whole grid
# before the other is ready (with 2 epochs one node did, in 1 run of 6).
STUDY_ARGS = ["--seeds", *map(str, SEEDS), "--gammas", "0.9", "--epochs", "10", "--stage2-epochs", "2",
              "--cpus-per-trial", "1"]
# One CPU per node: each node runs one trial at a time, so neither can take the whole grid alone.
NODE_ARGS = ["--num-cpus=1", "--num-gpus=0", "--object-store-memory=100000000", "--disable-usage-stats"]

# Waits until `count` nodes are alive and prints {node_id: ip} of the alive ones.
LIST_NODES = """
import json, sys, time, ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + float(sys.argv[2])
while True:
    alive = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    if len(alive) >= int(sys.argv[1]) or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(json.dumps(alive))
"""

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a network namespace and a veth pair"),
    pytest.mark.skipif(IP is None, reason="needs iproute2's `ip` to create a network namespace"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


class TwoNodeCluster:
    """A Ray head here and a second Ray node in a fresh network namespace, each started by `ray start`.

    Every process is started in a new session, and teardown kills exactly those sessions, then deletes the
    namespace, the veth pair and the Ray temp dir.
    """

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.netns, self.veth, self.peer = f"calib-mn-{tag}", f"cmn{tag}", f"cmn{tag}p"  # link names: <= 15 chars
        subnet = self._free_subnet()
        self.head_ip, self.node_ip = f"{subnet}.1", f"{subnet}.2"
        self.tmp = Path(tempfile.mkdtemp(prefix="calib-mn-"))  # short: Ray's socket paths live under it
        self.sessions: list[int] = []
        self.made_netns = self.made_veth = False
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
        self.env.update(RAY_TMPDIR=str(self.tmp), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
                        RAY_USAGE_STATS_ENABLED="0")
        self.node_ids: dict[str, str] = {}

    @staticmethod
    def _free_subnet() -> str:
        used = subprocess.run([IP, "-4", "addr"], capture_output=True, text=True, check=True).stdout
        used += subprocess.run([IP, "-4", "route"], capture_output=True, text=True, check=True).stdout
        for i in range(200):
            subnet = f"10.231.{(os.getpid() + i) % 200 + 20}"
            if f"{subnet}." not in used:
                return subnet
        raise RuntimeError("no free 10.231.N.0/24 subnet for the test's veth pair")

    def _ip(self, *args: str) -> None:
        out = subprocess.run([IP, *args], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"`ip {' '.join(args)}` failed: {out.stderr.strip()}")

    def spawn(self, cmd: list[str], log: str, cwd: Path | None = None) -> subprocess.Popen:
        """Start ``cmd`` in a new session (recorded for teardown), its output into ``<tmp>/<log>``."""
        with open(self.tmp / log, "w") as out:
            proc = subprocess.Popen(cmd, env=self.env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.sessions.append(proc.pid)
        return proc

    def run(self, cmd: list[str], log: str, timeout: float, cwd: Path | None = None) -> tuple[int, str]:
        proc = self.spawn(cmd, log, cwd)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -9
        return code, (self.tmp / log).read_text(errors="replace")

    def start(self) -> None:
        self._ip("netns", "add", self.netns)
        self.made_netns = True
        self._ip("link", "add", self.veth, "type", "veth", "peer", "name", self.peer)
        self.made_veth = True
        self._ip("link", "set", self.peer, "netns", self.netns)
        self._ip("addr", "add", f"{self.head_ip}/24", "dev", self.veth)
        self._ip("link", "set", self.veth, "up")
        self._ip("-n", self.netns, "addr", "add", f"{self.node_ip}/24", "dev", self.peer)
        self._ip("-n", self.netns, "link", "set", self.peer, "up")
        self._ip("-n", self.netns, "link", "set", "lo", "up")

        port = free_port()
        head = [RAY, "start", "--head", f"--node-ip-address={self.head_ip}", f"--port={port}",
                "--include-dashboard=false", f"--dashboard-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}", *NODE_ARGS]
        self._ray_start(head, "head.log")
        node = [IP, "netns", "exec", self.netns, RAY, "start", f"--address={self.head_ip}:{port}",
                f"--node-ip-address={self.node_ip}", *NODE_ARGS]
        self._ray_start(node, "node.log")

        code, out = self.run([sys.executable, "-c", LIST_NODES, "2", "60"], "nodes.log", timeout=120)
        if code == 0:
            self.node_ids = json.loads(out.strip().splitlines()[-1])
        if sorted(self.node_ids.values()) != [self.head_ip, self.node_ip]:
            raise RuntimeError(f"the second node did not join within 60 s: alive {self.node_ids}\n{tail(out)}\n"
                               f"{self.logs_tail()}")

    def _ray_start(self, cmd: list[str], log: str) -> None:
        code, out = self.run(cmd, log, timeout=120)
        if code != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` exited {code}:\n{tail(out)}\n{self.logs_tail()}")

    def logs_tail(self, lines: int = 15, limit: int = 12000) -> str:
        """The last lines of the Ray logs that explain most failures (GCS, raylets, worker stderr)."""
        logs = self.tmp / "ray" / "session_latest" / "logs"
        files = [*logs.glob("gcs_server.*"), *logs.glob("raylet*.out"), *logs.glob("raylet*.err"),
                 *logs.glob("worker-*.err")]
        parts = [f"--- {f.name}\n{tail(f.read_text(errors='replace'), lines)}" for f in sorted(files)
                 if f.stat().st_size]
        return ("Ray logs:\n" + "\n".join(parts))[-limit:] if parts else f"(no Ray logs under {logs})"

    def processes(self) -> list[str]:
        """Live (non-zombie) processes in the sessions the test started, or naming its Ray temp dir."""
        out = subprocess.run(["ps", "-ww", "-e", "-o", "sid=,pid=,stat=,args="], capture_output=True, text=True).stdout
        sids = {str(s) for s in self.sessions}
        found = []
        for line in out.splitlines():
            fields = line.split(None, 3)
            if len(fields) < 3 or fields[2].startswith("Z"):  # a zombie is dead, only not yet reaped by init
                continue
            if fields[0] in sids or str(self.tmp) in line:
                found.append(line.strip())
        return found

    def links(self) -> list[str]:
        netns = subprocess.run([IP, "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run([IP, "-o", "link"], capture_output=True, text=True).stdout
        return [name for name in (self.netns, self.veth) if re.search(rf"(^|\s){re.escape(name)}[\s:@]",
                                                                          netns + "\n" + links, re.M)]

    def teardown(self) -> None:
        """Kill every process of the test's sessions (SIGTERM, then SIGKILL), then delete netns, veth, temp dir."""
        deadline = time.monotonic() + 30
        grace = time.monotonic() + 3
        while (procs := self.processes()) and time.monotonic() < deadline:
            sig = signal.SIGTERM if time.monotonic() < grace else signal.SIGKILL
            for line in procs:
                try:
                    os.kill(int(line.split()[1]), sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        if self.made_netns:
            subprocess.run([IP, "netns", "del", self.netns], capture_output=True)
        if self.made_veth:
            subprocess.run([IP, "link", "del", self.veth], capture_output=True)  # usually gone with the netns
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def cluster():
    """A running two-node cluster; torn down even when the test fails."""
    nodes = TwoNodeCluster()
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.teardown()


def test_study_runs_on_two_nodes_with_address_auto(cluster, tmp_path):
    store = tmp_path / "results"
    cmd = [sys.executable, "studies/sensitivity_gamma.py", "--address", "auto", "--store", str(store),
           "--data-root", str(tmp_path / "data"), *STUDY_ARGS]
    code, out = cluster.run(cmd, "driver.log", timeout=300, cwd=ROOT)
    assert code == 0, f"the study exited {code}:\n{tail(out, 40)}\n{cluster.logs_tail()}"

    df = pd.read_parquet(store / "trials")
    assert len(df) == 2 * len(SEEDS) and df["trial_id"].is_unique, df[["trial_id", "seed", "method"]]
    assert (df["status"] == "ok").all(), df.loc[df["status"] != "ok", ["trial_id", "error"]]
    ran_on = df["node_id"].astype(str).value_counts().to_dict()
    assert set(ran_on) == set(cluster.node_ids), f"trials per node {ran_on}, nodes started {cluster.node_ids}"
    assert sorted(df.loc[~df["stage1_cache_hit"], "seed"]) == SEEDS, "Stage I must be trained exactly once per seed"
    artifacts = store / "artifacts" / "stage1"
    assert {p.name for p in artifacts.iterdir() if p.is_dir()} == set(df["stage1_id"])

    cluster.teardown()
    assert cluster.processes() == [], "processes the test started are still alive"
    assert cluster.links() == [], "the test's network namespace or veth pair is still there"
    assert not cluster.tmp.exists()
