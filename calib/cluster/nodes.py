"""The nodes of a running cluster, from its head: wait for them to join; stop Ray on on-prem workers.

``python -m calib.cluster wait --nodes N`` connects to the cluster (``--address``, default ``auto``: the
Ray started on this node) and returns once N nodes are alive, printing one line per node; after
``--timeout`` seconds it exits 1 naming the nodes it saw. An on-prem cluster's workers join a minute
or so after ``ray up`` returns, started by the head's autoscaler. When the autoscaler gives up on a
node (its ``ray start`` failed: the status ``ray status`` lists under "Recent failures"), ``wait`` exits
1 at once, naming the node and the log with its output, instead of waiting out ``--timeout``.

``python -m calib.cluster stop-workers`` runs ``ray stop`` on each worker of an on-prem cluster, over
SSH from the head with the launcher's key, as the autoscaler reached them. ``ray down`` stops Ray on an
on-prem head only: a worker's raylet exits a minute after losing the head, its log monitor does not.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from calib._config import ConfigError
from calib.cluster.launcher import Launcher
from calib.exit_codes import ExitCode

__all__ = ["BOOTSTRAP_CONFIG", "STOP_WORKERS", "WAIT", "NodeStartError", "alive_nodes", "autoscaler_status",
           "failed_nodes", "stop_workers", "wait_for_nodes"]

BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"  # where `ray up` puts the cluster file on the head


def alive_nodes() -> list[dict[str, Any]]:
    """The cluster's alive nodes as ``ray.nodes()`` gives them, head first."""
    # lazy: ray takes seconds to import; the launcher commands that never talk to Ray (slurm, onprem) skip it
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: not n.get("Resources", {}).get("node:__internal_head__", 0))


class NodeStartError(RuntimeError):
    """The autoscaler reported that a node it was starting failed."""


def autoscaler_status() -> dict[str, Any] | None:
    """The status the head's autoscaler last published (every few seconds) in the cluster's key-value store,
    what ``ray status`` prints; None before its first report or when the autoscaler does not publish it."""
    # lazy: ray takes seconds to import; the launcher commands that never talk to Ray (slurm, onprem) skip it
    from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)
    return json.loads(raw) if raw else None


def failed_nodes(status: dict[str, Any] | None, alive: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(address, node type) of each node the autoscaler's ``status`` reports as failed (its update, i.e.
    the setup and ``ray start`` run over SSH, failed, or it stopped sending heartbeats) and that is not
    alive now."""
    report = (status or {}).get("autoscaler_report") or {}
    addresses = {node.get("NodeManagerAddress") for node in alive}
    return [(str(ip), str(kind)) for ip, kind in report.get("failed_nodes") or [] if ip not in addresses]


def _autoscaler_log() -> str:
    """Where the head's autoscaler writes each node's setup output (the ``NodeUpdater: <node>`` lines)."""
    try:
        # lazy: ray takes seconds to import
        from ray._private import worker

        session = worker._global_node.get_session_dir_path()
    except Exception:  # connected without a local node: Ray's default place on the head
        session = "/tmp/ray/session_latest"
    return f"{session}/logs/monitor.out"


def _describe(node: dict[str, Any]) -> str:
    resources = node.get("Resources", {})
    role = "head" if resources.get("node:__internal_head__") else "worker"
    shown = ", ".join(f"{k} {v:g}" for k, v in resources.items() if k in ("CPU", "GPU"))
    return f"{role} {node.get('NodeManagerHostname', '?')} ({node.get('NodeManagerAddress', '?')}): {shown}"


def _end_at_once(signum: int, frame: object) -> None:
    """SIGTERM (a Slurm job cancelled while it waits): exit 143 now. The wait holds nothing to save, and Ray's own
    handler (``sys.exit`` inside Ray's ``atexit`` shutdown) printed a traceback or aborted the process."""
    os._exit(128 + signum)


def wait_for_nodes(count: int, *, address: str = "auto", timeout: float = 600.0, poll: float = 1.0) -> list[str]:
    """Block until ``count`` nodes are alive; their descriptions. NodeStartError as soon as the autoscaler
    reports a node it could not start, naming it and its log; TimeoutError names what joined by then."""
    # lazy: ray takes seconds to import; the launcher commands that never talk to Ray (slurm, onprem) skip it
    import ray

    if count < 1:
        raise ValueError(f"--nodes must be at least 1 (the head), got {count}")
    main_thread = threading.current_thread() is threading.main_thread()  # signal handlers: the main thread only
    if main_thread:
        signal.signal(signal.SIGTERM, _end_at_once)
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except ConnectionError as err:  # Ray's head did not come up (its own log says why): one line, not Ray's traceback
        raise NodeStartError(f"no Ray cluster answers at {address}: {str(err).splitlines()[0]}") from None
    if main_thread:
        signal.signal(signal.SIGTERM, _end_at_once)  # Ray's driver puts its own (sys.exit) in place
    try:
        deadline = time.monotonic() + timeout
        while True:
            nodes = alive_nodes()
            if len(nodes) >= count:
                return [_describe(n) for n in nodes]
            failed = failed_nodes(autoscaler_status(), nodes)
            if failed:
                seen = "; ".join(_describe(n) for n in nodes) or "none"
                names = ", ".join(f"{ip} ({kind})" for ip, kind in failed)
                raise NodeStartError(
                    f"the autoscaler could not start {names}: its setup or `ray start` failed. Its output is in "
                    f"{_autoscaler_log()} on the head, the lines `NodeUpdater: <node>` (from your machine: "
                    f"`ray exec <cluster file> 'tail -n 200 /tmp/ray/session_latest/logs/monitor.out'`). "
                    f"{len(nodes)} of {count} nodes alive: {seen}.")
            if time.monotonic() > deadline:
                seen = "; ".join(_describe(n) for n in nodes) or "none"
                raise TimeoutError(f"{len(nodes)} of {count} nodes alive after {timeout:g} s: {seen}. "
                                   "See the autoscaler's log on the head: `ray exec <cluster file> "
                                   "'tail -n 100 /tmp/ray/session_latest/logs/monitor.*'`.")
            time.sleep(poll)
    finally:
        ray.shutdown()
        if main_thread:  # Ray's handler is back after its shutdown: a SIGTERM while the process exits ends it too
            signal.signal(signal.SIGTERM, _end_at_once)


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


def _add_wait_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, required=True, help="nodes to wait for, the head included")
    parser.add_argument("--address", default="auto", help="Ray cluster to ask")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up (exit 1)")


def _wait(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        lines = wait_for_nodes(args.nodes, address=args.address, timeout=args.timeout)
    except SystemExit as exiting:  # Ray's own SIGTERM handler, in place for a moment inside ray.init
        if exiting.code == signal.SIGTERM:
            _end_at_once(signal.SIGTERM, None)
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from None
    except (TimeoutError, NodeStartError) as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.FAILED
    print(f"{len(lines)} nodes up:")
    for line in lines:
        print(f"  {line}")
    return ExitCode.OK


WAIT = Launcher("wait", "on the head node: wait until the cluster has N nodes alive (exit 1 at once when the "
                        "autoscaler reports a node it could not start)", _add_wait_arguments, _wait)
"""``python -m calib.cluster wait --nodes N``."""


def _add_stop_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=BOOTSTRAP_CONFIG, help="the cluster file `ray up` put on the head")


def _stop_workers(args: argparse.Namespace, argv: list[str]) -> int:
    results = stop_workers(args.config)
    for address, stopped, output in results:
        last = output.splitlines()[-1] if output else ""
        print(f"stopped Ray on {address}" if stopped else f"error: could not stop Ray on {address}: {last}")
    if not results:
        print("no workers in the cluster file")
    return ExitCode.OK if all(stopped for _, stopped, _ in results) else ExitCode.FAILED


STOP_WORKERS = Launcher("stop-workers", "on an on-prem head: `ray stop` on every worker (before `ray down`, which "
                                        "stops the head only)", _add_stop_arguments, _stop_workers)
"""``python -m calib.cluster stop-workers``."""
