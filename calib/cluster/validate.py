"""Check a Ray cluster launcher YAML offline before ``ray up``: Ray's own schema plus calib's rules.

``python -m calib.cluster validate cluster.yaml [--store URI] [--gpus-per-trial G]`` runs the config
preparation and JSON-schema validation that ``ray up`` runs (``ray.autoscaler._private.util.prepare_config``
and ``validate_config`` against the ``ray-schema.json`` shipped in the installed ray), without the
provider steps that call the cloud (``fillout_available_node_types_resources``, ``bootstrap_config``),
so it needs neither network nor credentials nor boto3. It then adds what Ray does not check but a
calib study needs:

* some node type that can start offers the GPUs a trial requests (``resources.GPU``);
* a cluster that can grow past the head node writes its store to shared storage (``s3://``, ``gs://``
  or a path under a mount listed in ``metadata.calib.shared_paths``);
* every node's setup commands pin the Ray version the driver runs (``ray.__version__``);
* ``head_node_type`` names an entry of ``available_node_types``;
* an on-prem file (Ray's ``local`` provider, see :mod:`calib.cluster.onprem`) names its head, distinct
  workers, an SSH user and a private key that exists here; its hosts report their GPUs only when Ray
  starts, so the GPU rule is not applied to it;
* every ``ray start`` of the head and worker start commands (Ray's defaults where the file sets none) requires
  Ray's token (``RAY_AUTH_MODE=token``) and ``file_mounts`` ships the token to the nodes from a file that exists
  (:mod:`calib.cluster.token`), unless ``metadata.calib.trusted_network`` is true.

calib's own settings live under the top-level ``metadata`` key, which Ray's schema keeps free-form::

    metadata:
      calib:
        store: s3://my-calib-bucket/calib   # --store default
        gpus_per_trial: 1                   # --gpus-per-trial default
        shared_paths: [/mnt/efs]            # optional shared mounts a store path may live under
        trusted_network: false              # true: no one else reaches the nodes, no token required

Every problem is reported, one ``error: <file>: <key>: <message>`` line each, and the exit code is 2.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calib.cluster.cluster_file import (
    CALIB_SECTION,
    ClusterConfigError,
    Problem,
    count,
    load_cluster_yaml,
    node_types,
    worker_cap,
)
from calib.cluster.cluster_rules import (
    calib_settings,
    drop_followups,
    gpu_problems,
    head_problems,
    local_problems,
    store_problems,
    version_problems,
)
from calib.cluster.launcher import Launcher
from calib.cluster.ray_checks import ray_checks
from calib.cluster.token import token_problems
from calib.exit_codes import ExitCode

__all__ = ["LAUNCHER", "Checked", "ClusterConfigError", "Problem", "check_cluster", "load_cluster_yaml",
           "validate_cluster"]


@dataclass(frozen=True)
class Checked:
    """What :func:`check_cluster` found: the config as Ray prepared it, the settings in force, every problem."""

    config: dict[str, Any]
    store: str | None
    gpus_per_trial: float
    problems: list[Problem]


def check_cluster(config: dict[str, Any], *, store: str | None = None, gpus_per_trial: float | None = None,
                  file: str | None = None) -> Checked:
    """Ray's checks and calib's rules on a loaded cluster config; ``store``/``gpus_per_trial`` override metadata;
    ``file``: the file it came from, named in the fixes."""
    # lazy: ray takes seconds to import, calib.study.presets (torch) two more; only `validate` needs them
    import ray

    from calib.study.presets import PRESETS

    provider = config.get("provider") if isinstance(config.get("provider"), dict) else {}
    local = provider.get("type") == "local"
    on_prem = local_problems(config) if local else []
    if on_prem:  # Ray's preparation of a local file aborts on these, with less to go on
        return Checked(config, store, float(gpus_per_trial or 0), drop_followups(on_prem))
    prepared, problems = ray_checks(config)
    view = prepared if prepared is not None else config
    head = head_problems(view, config)
    if head:  # one message for the key, whether or not Ray's validate_config got to raise its own
        problems = [p for p in problems if p.key != "head_node_type"] + head

    calib, calib_problems = calib_settings(config)
    problems += calib_problems
    gpus: Any
    if gpus_per_trial is not None:
        gpus, source = gpus_per_trial, "--gpus-per-trial"
    elif "gpus_per_trial" in calib:
        gpus, source = calib["gpus_per_trial"], f"{CALIB_SECTION}.gpus_per_trial"
    else:
        gpus, source = PRESETS.get("paper").gpus_per_trial, "the paper preset's default"
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus < 0:
        problems.append(Problem(source, f"must be a number >= 0 (GPUs each trial requests), got {gpus!r}."))
        gpus = 0.0
    if not local:
        problems += gpu_problems(view, float(gpus), source)

    store_key = "--store" if store is not None else f"{CALIB_SECTION}.store"
    if store is None:
        store = calib.get("store")
        if store is not None and not isinstance(store, str):
            problems.append(Problem(store_key, f"must be a string (s3://<bucket>/calib or a path), got {store!r}."))
            store = None
    problems += store_problems(view, calib, store, store_key)
    problems += version_problems(view, config, prepared is not None, ray.__version__)
    problems += token_problems(view, calib, file)
    return Checked(view, store, float(gpus), drop_followups(problems))


# ------------------------------------------------------------------------------------------------- CLI


def _describe(checked: Checked) -> str:
    """``valid (ray X schema; head: ...; workers: ...; store ...; G GPU per trial)``."""
    import ray  # lazy: ray takes seconds to import; only `validate` needs its version

    config = checked.config
    head, global_max = config.get("head_node_type"), count(config.get("max_workers"))

    def resources(node: dict[str, Any]) -> str:
        res = node.get("resources") if isinstance(node.get("resources"), dict) else {}
        return ", ".join(f"{k} {v}" for k, v in res.items()) or "no resources"

    nodes = node_types(config)
    workers = [f"{name} ({resources(n)} × {n.get('min_workers', 0)}-{worker_cap(name, n, head, global_max)})"
               for name, n in nodes.items() if name != head]
    head_text = f"{head} ({resources(nodes[head])})" if head in nodes else str(head)
    provider = config.get("provider") if isinstance(config.get("provider"), dict) else {}
    if provider.get("type") == "local":
        head_text = f"{provider.get('head_ip')} (resources as Ray detects them)"
        workers = [", ".join(map(str, provider.get("worker_ips", [])))] if provider.get("worker_ips") else []
    return (f"valid (ray {ray.__version__} schema; head: {head_text}; workers: {', '.join(workers) or 'none'}; "
            f"store {checked.store or 'not set'}; {checked.gpus_per_trial:g} GPU per trial)")


def validate_cluster(path: str | Path, *, store: str | None = None, gpus_per_trial: float | None = None) -> str:
    """Check a cluster YAML file; returns the one-line summary, raises ClusterConfigError listing every problem."""
    checked = check_cluster(load_cluster_yaml(path), store=store, gpus_per_trial=gpus_per_trial, file=str(path))
    if checked.problems:
        raise ClusterConfigError(str(path), checked.problems)
    return f"{path}: {_describe(checked)}"


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the cluster YAML, e.g. cluster.yaml or cluster-onprem.yaml")
    parser.add_argument("--store", default=None,
                        help="the store URI the studies will use (default: metadata.calib.store)")
    parser.add_argument("--gpus-per-trial", type=float, default=None,
                        help="GPUs each trial requests (default: metadata.calib.gpus_per_trial, else 1 as in "
                             "--preset paper)")


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    print(validate_cluster(args.file, store=args.store, gpus_per_trial=args.gpus_per_trial))
    return ExitCode.OK


LAUNCHER = Launcher("validate", "check a Ray cluster YAML offline: Ray's schema and calib's rules", _add_arguments,
                    _run)
"""``python -m calib.cluster validate FILE [--store URI] [--gpus-per-trial G]``."""
