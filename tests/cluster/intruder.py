"""What a machine on the cluster's network with no credential tries, run there by ``python - HEAD_IP`` (the
launcher test sends this file on standard input to a lab host that is not in the cluster).

Three doors, each asked to write a marker file ``~/intruder-<door>-<host>`` on the hosts it reaches:

* ``join``: ``ray start --address HEAD:6379`` as a node of the cluster, then a driver on this host running one
  task on every node of the cluster;
* ``client``: Ray Client at ``ray://HEAD:10001``, one task;
* ``jobs``: the Jobs API at ``http://HEAD:8265``, a job whose entrypoint writes the marker.

Prints one JSON line per door: ``{"door": ..., "refused": bool, "said": "<the end of what it got>"}`` (joining as a
node is not refused when ``ray start`` succeeds, whatever the driver then does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

HEAD = sys.argv[1]
RAY = str(Path(sys.executable).parent / "ray")
MARK = ("import os, pathlib, socket; pathlib.Path(os.path.expanduser('~'), "
        "f'intruder-{door}-{socket.gethostname()}').write_text('ran')")


CLIENT_WAITS = {"RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "2", "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "2"}
"""Ray Client's wait for the door in each of its 3 tries (5, 10, 15 s by default: 30 s to be refused): 2 s each.
The head is on the same bridge, so a door that lets in answers well within it; refused takes 6 s, not 30."""


def python(code: str, timeout: float, **settings: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}, **settings}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)


def tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-600:]


def report(door: str, refused: bool, said: str) -> None:
    print(json.dumps({"door": door, "refused": refused, "said": said}), flush=True)


def join() -> None:
    try:
        started = subprocess.run([RAY, "start", f"--address={HEAD}:6379", "--num-cpus=1", "--disable-usage-stats"],
                                 capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as err:
        report("join", True, f"ray start timed out: {tail(str(err.stdout or ''))}")
        return
    if started.returncode != 0:
        report("join", True, f"ray start exited {started.returncode}: {tail(started.stdout + started.stderr)}")
        return
    driver = f"""
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address="{HEAD}:6379", log_to_driver=False)
@ray.remote(num_cpus=0)
def mark(door):
    {MARK}
    return socket.gethostname()
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
print(ray.get([mark.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote("join")
               for n in nodes], timeout=60))
"""
    try:
        ran = python(driver, 120)
        report("join", False, f"joined; driver exited {ran.returncode}: {tail(ran.stdout + ran.stderr)}")
    except subprocess.TimeoutExpired:
        report("join", False, "joined; the driver timed out")


def client() -> None:
    code = f"""
import ray
ray.init("ray://{HEAD}:10001")
@ray.remote
def mark(door):
    {MARK}
    return socket.gethostname()
print(ray.get(mark.remote("client"), timeout=60))
"""
    try:
        ran = python(code, 90, **CLIENT_WAITS)
        report("client", ran.returncode != 0, f"exit {ran.returncode}: {tail(ran.stdout + ran.stderr)}")
    except subprocess.TimeoutExpired:
        report("client", True, "timed out")


def jobs() -> None:
    entrypoint = ("python -c \"import os, pathlib, socket; pathlib.Path(os.path.expanduser('~'), 'intruder-jobs-' + "
                  "socket.gethostname()).write_text('ran')\"")
    body = json.dumps({"entrypoint": entrypoint}).encode()
    request = urllib.request.Request(f"http://{HEAD}:8265/api/jobs/", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            report("jobs", False, f"HTTP {answer.status}: {answer.read()[:300]!r}")
    except urllib.error.HTTPError as err:
        report("jobs", True, f"HTTP {err.code}: {err.read()[:300]!r}")
    except OSError as err:
        report("jobs", True, f"{type(err).__name__}: {err}")


if __name__ == "__main__":
    join()
    client()
    jobs()
    subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=60)
