"""Whether a Ray cluster has a node for each kind of trial, and a bounded wait for one.

A trial's CPUs and GPUs must fit on one node. On a cluster that lacks such a node Ray keeps the trial
pending forever (an autoscaling cluster adds a node when a request asks for one), so after connecting
the driver calls :func:`wait_for_resources`: one line saying what is requested and what the nodes
offer, then polling until a node fits or the timeout (``CALIB_RESOURCE_WAIT_SECONDS``) passes, which
raises a :class:`~calib._config.ConfigError` naming the request, the nodes and the flags to change.
Ray is imported only where the nodes are read.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from calib._config import ConfigError

if TYPE_CHECKING:
    from calib.run.execution import ExecutionOptions

__all__ = [
    "DEFAULT_RESOURCE_WAIT_SECONDS",
    "RESOURCE_WAIT_ENV",
    "alive_node_resources",
    "ask_autoscaler",
    "describe_nodes",
    "resource_wait_seconds",
    "unplaceable_roles",
    "wait_for_resources",
]

RESOURCE_WAIT_ENV = "CALIB_RESOURCE_WAIT_SECONDS"
DEFAULT_RESOURCE_WAIT_SECONDS = 300.0

NodeResources = Mapping[str, float]
"""One node's total resources, as ``ray.nodes()`` reports them (``{"CPU": 4.0, "GPU": 1.0, ...}``)."""

ROLE_NAMES = {"stage1": "a Stage-I trial", "cached": "a trial on a trained Stage I"}
ROLE_FLAGS = {"stage1": {"CPU": "--cpus-per-trial", "GPU": "--gpus-per-trial"},
              "cached": {"CPU": "--cpus-per-cached-trial", "GPU": "--gpus-per-cached-trial"}}


def resource_wait_seconds() -> float:
    """Seconds to wait for a node that fits a trial: ``$CALIB_RESOURCE_WAIT_SECONDS``, default 300."""
    text = os.environ.get(RESOURCE_WAIT_ENV, "").strip()
    if not text:
        return DEFAULT_RESOURCE_WAIT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"`{RESOURCE_WAIT_ENV}` must be a number of seconds >= 0 (how long a study waits for a "
                          f"node that fits a trial), got {RESOURCE_WAIT_ENV}={text!r}.")
    return seconds


def alive_node_resources() -> list[dict[str, float]]:
    """The total resources of every alive node of the cluster Ray is connected to."""
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    import ray

    return [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]


def _amount(value: float) -> str:
    return f"{value:g}"


def _request_text(request: Mapping[str, float]) -> str:
    return " and ".join(f"{_amount(v)} {k}" for k, v in request.items() if v > 0) or "no resources"


def _fits(request: Mapping[str, float], node: NodeResources) -> bool:
    return all(node.get(name, 0.0) >= amount for name, amount in request.items() if amount > 0)


def unplaceable_roles(options: ExecutionOptions, nodes: Sequence[NodeResources]) -> dict[str, dict[str, float]]:
    """Role (``"stage1"``, ``"cached"``) → its request, for each role no single node of ``nodes`` fits."""
    requests = {role: {k: float(v) for k, v in options.resources(role).items()} for role in ROLE_NAMES}
    return {role: request for role, request in requests.items() if not any(_fits(request, n) for n in nodes)}


def describe_nodes(nodes: Sequence[NodeResources]) -> str:
    """``"the cluster's 3 nodes offer 2 × (8 CPU, 0 GPU), 1 × (4 CPU, 1 GPU)"``: each node shape and its count."""
    if not nodes:
        return "the cluster has no alive node"
    shapes = Counter((node.get("CPU", 0.0), node.get("GPU", 0.0)) for node in nodes)
    listed = ", ".join(f"{count} × ({_amount(cpu)} CPU, {_amount(gpu)} GPU)" for (cpu, gpu), count in shapes.items())
    return f"the cluster's {len(nodes)} node{'s' if len(nodes) > 1 else ''} offer {listed}"


def _wanted(unmet: Mapping[str, Mapping[str, float]]) -> str:
    """``"1 CPU and 1 GPU for a Stage-I trial"``; one request for both roles when they ask for the same."""
    if len(unmet) == 2 and len({tuple(sorted(r.items())) for r in unmet.values()}) == 1:
        return f"{_request_text(next(iter(unmet.values())))} for a trial"
    return " and ".join(f"{_request_text(request)} for {ROLE_NAMES[role]}" for role, request in unmet.items())


def _flags(unmet: Mapping[str, Mapping[str, float]], nodes: Sequence[NodeResources]) -> str:
    """The flags of the resources that ask for more than any node has (all of a role's when each fits alone)."""
    flags = []
    for role, request in unmet.items():
        short = [name for name, amount in request.items()
                 if amount > 0 and amount > max((n.get(name, 0.0) for n in nodes), default=0.0)]
        flags += [ROLE_FLAGS[role][name] for name in (short or [k for k, v in request.items() if v > 0])]
    return ", ".join(dict.fromkeys(flags))


def ask_autoscaler(requests: Sequence[NodeResources]) -> None:
    """Ask the cluster's autoscaler for nodes that fit ``requests`` (one bundle each; [] withdraws the
    request). No trial is pending yet, so without this an autoscaler would see no demand."""
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[{k: v for k, v in r.items() if v > 0} for r in requests])


def wait_for_resources(options: ExecutionOptions, timeout_s: float | None = None, poll_s: float = 5.0,
                       say: Callable[[str], object] = print,
                       nodes: Callable[[], Sequence[NodeResources]] = alive_node_resources,
                       ask: Callable[[Sequence[NodeResources]], None] | None = None) -> None:
    """Return once some node of the cluster fits each role's request (CPUs and GPUs of one trial on
    one node); until then, after one line saying what is missing, ask the autoscaler for such nodes
    (``ask``, default :func:`ask_autoscaler`) and poll ``nodes`` every ``poll_s`` seconds. After ``timeout_s`` (default
    :func:`resource_wait_seconds`) raise ``ConfigError``. The request is withdrawn either way."""
    timeout_s = resource_wait_seconds() if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    current = list(nodes())
    unmet = unplaceable_roles(options, current)
    if not unmet:
        return
    say(f"waiting up to {_amount(timeout_s)} s for a node with {_wanted(unmet)}: {describe_nodes(current)} "
        f"(asked the autoscaler, if the cluster has one, for one)")
    ask = ask or ask_autoscaler
    ask(list(unmet.values()))
    try:
        while time.monotonic() < deadline:
            time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
            current = list(nodes())
            unmet = unplaceable_roles(options, current)
            if not unmet:
                return
    finally:
        ask([])
    raise ConfigError(
        f"No node of the cluster offers {_wanted(unmet)} after {_amount(timeout_s)} s: {describe_nodes(current)}. "
        f"Ask for what one node has ({_flags(unmet, current)}), add a node that has it, or wait longer "
        f"({RESOURCE_WAIT_ENV}, now {_amount(timeout_s)})."
    )
