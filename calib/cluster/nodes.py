"""The nodes of a running cluster, from its head: wait for them to join; stop Ray on on-prem workers.

``python -m calib.cluster wait --nodes N`` connects to the cluster (``--address``, default ``auto``: the
Ray started on this node) and returns once N nodes are alive, printing one line per node; after
``--timeout`` seconds it exits 1 naming the nodes it saw. An on-prem cluster's workers join a minute
or so after ``ray up`` returns, started by the head's autoscaler.

``python -m calib.cluster stop-workers`` runs ``ray stop`` on each worker of an on-prem cluster, over
SSH from the head with the launcher's key, as the autoscaler reached them. ``ray down`` stops Ray on an
on-prem head only: a worker's raylet exits a minute after losing the head, its log monitor does not.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from calib._config import ConfigError

__all__ = ["BOOTSTRAP_CONFIG", "alive_nodes", "stop_workers", "wait_for_nodes"]

BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"  # where `ray up` puts the cluster file on the head


def alive_nodes() -> list[dict[str, Any]]:
    """The cluster's alive nodes as ``ray.nodes()`` gives them, head first."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: not n.get("Resources", {}).get("node:__internal_head__", 0))


def _describe(node: dict[str, Any]) -> str:
    resources = node.get("Resources", {})
    role = "head" if resources.get("node:__internal_head__") else "worker"
    shown = ", ".join(f"{k} {v:g}" for k, v in resources.items() if k in ("CPU", "GPU"))
    return f"{role} {node.get('NodeManagerHostname', '?')} ({node.get('NodeManagerAddress', '?')}): {shown}"


def wait_for_nodes(count: int, *, address: str = "auto", timeout: float = 600.0, poll: float = 1.0) -> list[str]:
    """Block until ``count`` nodes are alive; their descriptions. TimeoutError names what joined by then."""
    import ray

    if count < 1:
        raise ValueError(f"--nodes must be at least 1 (the head), got {count}")
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        deadline = time.monotonic() + timeout
        while True:
            nodes = alive_nodes()
            if len(nodes) >= count:
                return [_describe(n) for n in nodes]
            if time.monotonic() > deadline:
                seen = "; ".join(_describe(n) for n in nodes) or "none"
                raise TimeoutError(f"{len(nodes)} of {count} nodes alive after {timeout:g} s: {seen}. "
                                   "See the autoscaler's log on the head: `ray exec <cluster file> "
                                   "'tail -n 100 /tmp/ray/session_latest/logs/monitor.*'`.")
            time.sleep(poll)
    finally:
        ray.shutdown()


def stop_workers(config_path: str = BOOTSTRAP_CONFIG, *, timeout: float = 60.0) -> list[tuple[str, bool, str]]:
    """``ray stop`` on every worker of the on-prem cluster file ``config_path``: (address, stopped, output) each."""
    path = Path(config_path).expanduser()
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"{config_path}: cannot be read ({err.strerror or err}): run this on the head of a cluster "
                          "started with `ray up`, e.g. `ray exec cluster-onprem.yaml \"python -m calib.cluster "
                          "stop-workers\"`.") from None
    provider, auth = config.get("provider") or {}, config.get("auth") or {}
    if provider.get("type") != "local":
        raise ConfigError(f"{config_path}: provider {provider.get('type')!r} is not an on-prem (`local`) cluster; "
                          "`ray down` terminates a cloud cluster's workers itself.")
    key = str(Path(auth.get("ssh_private_key", "~/ray_bootstrap_key.pem")).expanduser())
    options = ["-tt", "-i", key, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10"]
    # As Ray's command runner: an interactive login shell, so ~/.bashrc (and a venv it activates) applies.
    remote = "bash --login -c -i " + shlex.quote("source ~/.bashrc; ray stop")
    results = []
    for address in provider.get("worker_ips", []):
        try:
            proc = subprocess.run(["ssh", *options, f"{auth.get('ssh_user')}@{address}", remote],
                                  capture_output=True, text=True, timeout=timeout)
            results.append((address, proc.returncode == 0, (proc.stdout + proc.stderr).strip()))
        except subprocess.TimeoutExpired:
            results.append((address, False, f"no answer within {timeout:g} s"))
    return results
