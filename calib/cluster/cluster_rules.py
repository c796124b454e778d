"""calib's rules for a cluster file, beyond Ray's schema: GPUs for a trial, a shared store, the driver's Ray on
every node, a head node type that exists, an on-prem file's hosts and key (:func:`calib.cluster.validate.check_cluster`
applies them)."""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from calib._config import did_you_mean
from calib.cluster.cluster_file import (
    CALIB_KEYS,
    CALIB_SECTION,
    SHARED_SCHEMES,
    Problem,
    can_start,
    count,
    node_types,
    worker_cap,
)

__all__ = ["calib_settings", "drop_followups", "gpu_problems", "head_problems", "local_problems", "store_problems",
           "version_problems"]

# Ray pins: `ray==2.60.0`, `"ray[default,tune] == 2.60.0"`, a wheel URL `.../ray-2.60.0-cp311-...whl`;
# a Docker image `rayproject/ray:2.60.0-gpu` fixes the Ray its nodes run too.
_PIN_RES = (
    re.compile(r"(?<![\w.-])ray(?:\[[^\]]*\])?\s*==\s*([0-9][0-9A-Za-z.+!]*)"),
    re.compile(r"/ray-([0-9][0-9A-Za-z.+!]*)-cp\d"),
)
_IMAGE_RE = re.compile(r"rayproject/ray(?:-ml)?:([0-9]+(?:\.[0-9]+)+)")


def _gpus_of(node: dict[str, Any]) -> int | None:
    """The node type's ``resources.GPU`` (0 when not declared); None when resources are missing or invalid."""
    resources = node.get("resources")
    if not isinstance(resources, dict):
        return None
    gpus = count(resources.get("GPU", 0))
    return gpus if gpus is not None and gpus >= 0 else None


def calib_settings(config: dict[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """``metadata.calib`` as a dict, with unknown keys reported."""
    metadata = config.get("metadata")
    calib = metadata.get("calib") if isinstance(metadata, dict) else None
    if calib is None:
        return {}, []
    if not isinstance(calib, dict):
        return {}, [Problem(CALIB_SECTION, f"must be a mapping with keys {', '.join(CALIB_KEYS)}, got {calib!r}")]
    problems = []
    for name in calib:
        if name not in CALIB_KEYS:
            hint = (did_you_mean(str(name), CALIB_KEYS, show=lambda c: f"`{c}`", form="; did you mean {}?")
                    or f"; known: {', '.join(CALIB_KEYS)}")
            problems.append(Problem(f"{CALIB_SECTION}.{name}", f"unknown calib setting{hint}"))
    return calib, problems


def gpu_problems(config: dict[str, Any], gpus: float, source: str) -> list[Problem]:
    """Rule (a): some node type that can start declares at least ceil(gpus) GPUs."""
    if gpus <= 0:
        return []
    need = math.ceil(gpus)
    head, global_max = config.get("head_node_type"), count(config.get("max_workers"))
    nodes = {name: (node, _gpus_of(node)) for name, node in node_types(config).items()}
    # A node type whose resources are missing or invalid may well be the GPU one: the schema problem covers it.
    if any((n_gpus is None or n_gpus >= need) and can_start(name, node, head, global_max)
           for name, (node, n_gpus) in nodes.items()):
        return []
    found = [f"{name} (GPU {n_gpus}, " + ("head)" if name == head else
                                         f"max_workers {worker_cap(name, node, head, global_max)})")
             for name, (node, n_gpus) in nodes.items() if n_gpus]
    seen = f"; GPU node types here: {', '.join(found)}" if found else "; no node type declares resources.GPU"
    example = ("e.g. g5.xlarge with `resources: {CPU: 4, GPU: 1}`" if need == 1 else
               f"an instance type with {need} GPUs and `resources: {{GPU: {need}, ...}}`")
    return [Problem("available_node_types", (
        f"a trial asks for {gpus:g} GPU{'' if gpus == 1 else 's'} ({source}) but no node type that can start "
        f"(the head, or max_workers > 0) declares resources.GPU >= {need}{seen}. Add a GPU worker type, {example} "
        f"and `max_workers: 8`, or for CPU-only trials set `{CALIB_SECTION}.gpus_per_trial: 0` (--gpus-per-trial 0)."))]


def _under(path: str, root: str) -> bool:
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def store_problems(config: dict[str, Any], calib: dict[str, Any], store: str | None, key: str) -> list[Problem]:
    """Rule (b): a cluster that can start workers keeps its store on shared storage."""
    shared_raw = calib.get("shared_paths", [])
    problems: list[Problem] = []
    shared: list[str] = []
    if not isinstance(shared_raw, list):
        problems.append(Problem(f"{CALIB_SECTION}.shared_paths",
                                f"must be a list of absolute paths, got {shared_raw!r}"))
        shared_raw = []
    for i, entry in enumerate(shared_raw):
        if isinstance(entry, str) and entry.startswith("/"):
            shared.append(entry)
        else:
            problems.append(Problem(f"{CALIB_SECTION}.shared_paths[{i}]", (
                f"must be an absolute path of a directory every node mounts (e.g. /mnt/efs), got {entry!r}")))

    head, global_max = config.get("head_node_type"), count(config.get("max_workers"))
    growing = []
    for name, node in node_types(config).items():
        cap = worker_cap(name, node, head, global_max)
        if cap is None or cap > 0:
            growing.append(f"{name}: up to {cap if cap is not None else '?'} workers")
    if not growing:
        return problems
    why = (f"this cluster can start nodes besides the head ({'; '.join(growing)}), and trials on every node "
           "write results, Stage-I artifacts and Ray Tune state to the store")
    fix = (f"set `{CALIB_SECTION}.store` (or --store) to s3://<bucket>/calib (or gs://...), or to a path under a "
           f"shared mount listed in `{CALIB_SECTION}.shared_paths` (e.g. /mnt/efs/calib with shared_paths: [/mnt/efs])")
    if store is None:
        return [*problems, Problem(key, f"missing: {why}, so it must be shared storage; {fix}.")]
    scheme = next((s for s in SHARED_SCHEMES if store.startswith(s)), None)
    if scheme is not None:
        if not store[len(scheme):].split("/")[0]:
            problems.append(Problem(key, f"`{store}` names no bucket; write {scheme}<bucket>/calib."))
        return problems
    if "://" in store:
        problems.append(Problem(key, f"`{store}` is not shared storage calib writes to: {why}; {fix}."))
    elif not any(_under(store, root) for root in shared):
        listed = f" (shared_paths: {', '.join(shared)})" if shared else ""
        problems.append(Problem(key, (
            f"`{store}` is a local path{listed}: {why}, so each node would write its own disk and the "
            f"driver's store would miss the trials run on workers; {fix}.")))
    return problems


def _pins(text: str) -> Iterator[str]:
    for pattern in _PIN_RES:
        for match in pattern.finditer(text):
            yield match.group(1).rstrip(".")


def _same_version(a: str, b: str) -> bool:
    # lazy: packaging comes with Ray and pip, not as calib's own dependency; only this comparison needs it
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _commands(config: dict[str, Any], key: str) -> list[tuple[str, str]]:
    value = config.get(key)
    return [(f"{key}[{i}]", c) for i, c in enumerate(value) if isinstance(c, str)] if isinstance(value, list) else []


def version_problems(config: dict[str, Any], raw: dict[str, Any], merged: bool, installed: str) -> list[Problem]:
    """Rule (c): each node that can start installs exactly the driver's Ray."""
    common = _commands(config, "setup_commands")
    # prepare_config prepends setup_commands to head_/worker_setup_commands; split them apart again.
    skip = len(common) if merged else 0
    head_own, worker_own = (
        [(f"{key}[{i}]", c) for i, (_, c) in enumerate(_commands(config, key)[skip:])]
        for key in ("head_setup_commands", "worker_setup_commands")
    )
    docker = config.get("docker") if isinstance(config.get("docker"), dict) else {}

    def image(*candidates: tuple[str, dict[str, Any], str]) -> list[tuple[str, str]]:
        """The first Docker image set among (key prefix, docker section, field): nodes run inside it."""
        for where, section, name in candidates:
            if isinstance(section.get(name), str) and section[name]:
                return [(f"{where}.{name}", section[name])]
        return []

    head, global_max = config.get("head_node_type"), count(config.get("max_workers"))
    plan: dict[str, tuple[list[tuple[str, str]], str]] = {}  # node type -> (what it runs, where its pin belongs)
    for name, node in node_types(config).items():
        if name == head:
            plan[name] = ([*image(("docker", docker, "head_image"), ("docker", docker, "image")), *common, *head_own],
                          "setup_commands")
        elif can_start(name, node, head, global_max):
            own_docker = node.get("docker") if isinstance(node.get("docker"), dict) else {}
            images = image((f"available_node_types.{name}.docker", own_docker, "worker_image"),
                           ("docker", docker, "worker_image"), ("docker", docker, "image"))
            own = node.get("worker_setup_commands")
            if isinstance(own, list):  # a node type's own list replaces setup_commands + worker_setup_commands
                home = f"available_node_types.{name}.worker_setup_commands"
                plan[name] = ([*images, *[(f"{home}[{i}]", c) for i, c in enumerate(own) if isinstance(c, str)]], home)
            else:
                plan[name] = ([*images, *common, *worker_own], "setup_commands")

    problems: dict[str, Problem] = {}
    unpinned: dict[str, list[str]] = {}
    pin = f'pip install "ray[default,tune]=={installed}"'
    provider = config.get("provider") if isinstance(config.get("provider"), dict) else {}
    for name, (sources, home) in plan.items():
        pinned = False
        for where, text in sources:
            is_image = ".docker." in f".{where}."
            for version in ([m.group(1) for m in _IMAGE_RE.finditer(text)] if is_image else _pins(text)):
                pinned = True
                if _same_version(version, installed) or where in problems:
                    continue
                top = re.split(r"[.\[]", where)[0]
                origin = "" if top in raw else (
                    f" (Ray's {provider.get('type')} default, as the file sets no `{top}`)")
                problems[where] = Problem(where, (
                    f"installs ray {version}{origin}, but the driver here runs ray {installed}: a head or worker "
                    f"running another Ray than the driver's fails when the driver connects; use `{pin}`."))
        if not pinned:
            unpinned.setdefault(home, []).append(name)
    for home, names in unpinned.items():
        problems[home] = Problem(home, (
            f"no command pins Ray for node type(s) {', '.join(names)}: they would run whatever Ray the image or "
            f"an unpinned install gives, not the driver's ray {installed}, and fail when the driver connects; "
            f"add `{pin}`."))
    return list(problems.values())


def head_problems(config: dict[str, Any], raw: dict[str, Any]) -> list[Problem]:
    """Rule (d): ``head_node_type`` names a node type (Ray's message, with what was found)."""
    head, nodes = config.get("head_node_type"), config.get("available_node_types")
    if not isinstance(nodes, dict) or not isinstance(head, str) or head in nodes:
        return []
    default = "" if "head_node_type" in raw else " (the file sets none, so Ray's default applies)"
    return [Problem("head_node_type", (
        f"`head_node_type` must be one of `available_node_types`: got `{head}`{default}; "
        f"node types: {', '.join(map(str, nodes)) or 'none'}."))]


def local_problems(config: dict[str, Any]) -> list[Problem]:
    """Rule (e): an on-prem (``local`` provider) file names its hosts and how to log in to them."""
    provider = config.get("provider") if isinstance(config.get("provider"), dict) else {}
    auth = config.get("auth") if isinstance(config.get("auth"), dict) else {}
    problems = []
    for key in ("available_node_types", "head_node", "worker_nodes", "head_node_type"):
        if key in config:
            problems.append(Problem(key, (
                "not allowed in an on-prem file: Ray's local provider makes one node type of the head and "
                "`provider.worker_ips`; remove it (or regenerate with `python -m calib.cluster onprem`).")))
    head = provider.get("head_ip")
    if not isinstance(head, str) or not head.strip():
        problems.append(Problem("provider.head_ip", f"must be the head's address (IP or host name), got {head!r}."))
    workers = provider.get("worker_ips", [])
    if not isinstance(workers, list) or not all(isinstance(w, str) and w.strip() for w in workers):
        problems.append(Problem("provider.worker_ips", f"must be a list of worker addresses, got {workers!r}."))
    else:
        repeated = sorted({w for w in [head, *workers] if [head, *workers].count(w) > 1})
        if repeated:
            problems.append(Problem("provider.worker_ips", (
                f"{', '.join(map(str, repeated))} appears more than once among the head and workers; each host once.")))
    user = auth.get("ssh_user")
    if not isinstance(user, str) or not user.strip():
        problems.append(Problem("auth.ssh_user", f"must be the account that logs in to every host, got {user!r}."))
    key = auth.get("ssh_private_key")
    if not isinstance(key, str) or not key.strip():
        problems.append(Problem("auth.ssh_private_key", (
            f"must be the private key that logs in to every host, got {key!r}: the launcher uses it and copies it "
            "to the head, which starts the workers with it.")))
    elif not Path(key).expanduser().is_file():
        problems.append(Problem("auth.ssh_private_key", f"`{key}` is not a file on this machine."))
    return problems


def drop_followups(problems: list[Problem]) -> list[Problem]:
    """Each key once: a later problem on a key already reported (e.g. a non-list `setup_commands`) follows from it."""
    seen: set[str] = set()
    kept = []
    for problem in problems:
        if problem.key not in seen:
            kept.append(problem)
            seen.add(problem.key)
    return kept
