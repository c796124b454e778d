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
  starts, so the GPU rule is not applied to it.

calib's own settings live under the top-level ``metadata`` key, which Ray's schema keeps free-form::

    metadata:
      calib:
        store: s3://my-calib-bucket/calib   # --store default
        gpus_per_trial: 1                   # --gpus-per-trial default
        shared_paths: [/mnt/efs]            # optional shared mounts a store path may live under

Every problem is reported, one ``error: <file>: <key>: <message>`` line each, and the exit code is 2.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import json
import logging
import math
import posixpath
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from calib._config import ConfigError

__all__ = ["Checked", "ClusterConfigError", "Problem", "check_cluster", "load_cluster_yaml", "validate_cluster"]

CALIB_KEYS = ("store", "gpus_per_trial", "shared_paths")
SHARED_SCHEMES = ("s3://", "gs://")
_CALIB = "metadata.calib"

# Ray pins: `ray==2.60.0`, `"ray[default,tune] == 2.60.0"`, a wheel URL `.../ray-2.60.0-cp311-...whl`;
# a Docker image `rayproject/ray:2.60.0-gpu` fixes the Ray its nodes run too.
_PIN_RES = (
    re.compile(r"(?<![\w.-])ray(?:\[[^\]]*\])?\s*==\s*([0-9][0-9A-Za-z.+!]*)"),
    re.compile(r"/ray-([0-9][0-9A-Za-z.+!]*)-cp\d"),
)
# The key to blame when Ray's own config preparation raises: the provider (a type Ray cannot load) or
# the docker section (Ray asserts on it); anything else is the config as a whole.
PREPARATION_ERROR_KEYS: tuple[tuple[type[Exception], str], ...] = (
    (NotImplementedError, "provider.type"),
    (AssertionError, "docker"),
)
_IMAGE_RE = re.compile(r"rayproject/ray(?:-ml)?:([0-9]+(?:\.[0-9]+)+)")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the cluster file: the key path it concerns and what to do about it."""

    key: str
    message: str

    def line(self, file: str) -> str:
        """``<file>: <key>: <message>`` (the key left out when there is none)."""
        return f"{file}: {self.key}: {self.message}" if self.key else f"{file}: {self.message}"


class ClusterConfigError(ConfigError):
    """The cluster file has problems; ``problems`` lists them all, ``str()`` gives one line each."""

    def __init__(self, file: str, problems: Sequence[Problem]) -> None:
        self.file = file
        self.problems = list(problems)
        super().__init__("\n".join(p.line(file) for p in self.problems))


# ---------------------------------------------------------------------------------------------- loading


def load_cluster_yaml(path: str | Path) -> dict[str, Any]:
    """The YAML file as a dict; a missing file, a syntax error or a non-mapping raises ClusterConfigError."""
    file = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ClusterConfigError(file, [Problem("", (
            "no such file. Pass the Ray cluster launcher YAML to check, e.g. "
            "`python -m calib.cluster validate cluster.yaml` from the repository root."))]) from None
    except OSError as err:
        raise ClusterConfigError(file, [Problem("", f"cannot be read: {err.strerror or err}.")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ClusterConfigError(file, [Problem("", (
            f"not valid YAML: {what}{where}. Fix the syntax there (indentation, a missing `:` or an "
            "unclosed quote or bracket) and run the check again."))]) from None
    if not isinstance(data, dict):
        raise ClusterConfigError(file, [Problem("", (
            "must hold a mapping of Ray cluster keys (cluster_name, provider, available_node_types, ...), "
            f"got {type(data).__name__}: {data!r:.60}."))])
    return data


# ------------------------------------------------------------------------------------------ Ray's checks


def _key(path: Sequence[Any]) -> str:
    """``available_node_types.gpu_worker.resources.GPU`` / ``setup_commands[1]``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _join(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent else child


def _schema() -> dict[str, Any]:
    """The JSON schema shipped in the installed ray package (the file ``validate_config`` reads)."""
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def _schema_problems(config: dict[str, Any]) -> list[Problem]:
    """Every violation of Ray's cluster schema (``validate_config`` raises only the first)."""
    import jsonschema

    schema = _schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    problems: list[Problem] = []
    for err in sorted(validator.iter_errors(config), key=lambda e: (_key(e.absolute_path), e.message)):
        where = _key(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = list(err.schema.get("properties", {}))
            patterns = list(err.schema.get("patternProperties", {}))
            for name in err.instance:
                if name in allowed or any(re.search(p, str(name)) for p in patterns):
                    continue
                hint = ""
                if not where and name in CALIB_KEYS:
                    hint = f"; calib's settings go under `{_CALIB}`"
                elif close := difflib.get_close_matches(str(name), allowed, n=1):
                    hint = f"; did you mean `{close[0]}`?"
                problems.append(Problem(_join(where, str(name)),
                                        f"unknown key: Ray's cluster schema allows no `{name}` here{hint}"))
        elif err.validator == "required" and isinstance(err.instance, dict):
            for name in err.validator_value:
                if name in err.instance:
                    continue
                hint = ""
                if name == "resources" and len(err.absolute_path) == 2:
                    hint = (" (`ray up` on AWS would look it up with boto3 and credentials; this offline check "
                            "needs it written out, e.g. `resources: {CPU: 4, GPU: 1}`)")
                problems.append(Problem(_join(where, name), f"missing: Ray's cluster schema requires it{hint}"))
        else:
            problems.append(Problem(where or "config", err.message))
    return problems


@contextlib.contextmanager
def _quiet_ray_logs() -> Iterator[None]:
    """Hide the INFO lines prepare_config logs for defaults it fills in ("setting max workers for ...")."""
    logger = logging.getLogger("ray.autoscaler")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def ray_checks(config: dict[str, Any]) -> tuple[dict[str, Any] | None, list[Problem]]:
    """Ray's ``prepare_config`` then its schema and ``validate_config`` checks; the prepared config or None.

    These are the offline steps of ``ray up``'s ``_bootstrap_config``: defaults merged from the provider's
    ``defaults.yaml``, setup commands merged, Docker checked, per-type min/max workers filled in, then
    ``ray-schema.json``. The provider steps in between (resource autodetection and bootstrap, which call
    AWS through boto3) are skipped.
    """
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared: dict[str, Any] | None
    try:
        with _quiet_ray_logs():
            prepared = prepare_config(copy.deepcopy(config))
        prep_error: Exception | None = None
    except Exception as err:  # Ray's own preparation failed: report it with the schema's view of the raw file
        prepared, prep_error = None, err
    problems = _schema_problems(prepared if prepared is not None else config)
    if prep_error is not None:
        # A KeyError/TypeError there follows from a wrong type or missing key the schema already named.
        if not (problems and isinstance(prep_error, (KeyError, TypeError, AttributeError))):
            key = next((k for kind, k in PREPARATION_ERROR_KEYS if isinstance(prep_error, kind)), "config")
            problems.append(Problem(key, f"Ray's config preparation failed: {prep_error}"))
        return None, problems
    assert prepared is not None
    if not problems:
        try:
            validate_config(prepared)
        except (ValueError, RuntimeError) as err:
            message = str(err)
            key = next((k for k in ("head_node_type", "max_workers", "file_mounts_sync_continuously")
                        if k in message), "config")
            problems.append(Problem(key, message))
    return prepared, problems


# ----------------------------------------------------------------------------------------- calib's rules


def _count(value: Any) -> int | None:
    """An integer count, or None when the value is not one (the schema reports that)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _node_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    types = config.get("available_node_types")
    return {str(k): v for k, v in types.items() if isinstance(v, dict)} if isinstance(types, dict) else {}


def _worker_cap(name: str, node: dict[str, Any], head: Any, global_max: int | None) -> int | None:
    """How many workers of this type may start (None: unknown, taken as some)."""
    if global_max == 0:
        return 0
    cap = node.get("max_workers", 0 if name == head else global_max)
    return _count(cap)


def _can_start(name: str, node: dict[str, Any], head: Any, global_max: int | None) -> bool:
    cap = _worker_cap(name, node, head, global_max)
    return name == head or cap is None or cap > 0


def _gpus_of(node: dict[str, Any]) -> int | None:
    """The node type's ``resources.GPU`` (0 when not declared); None when resources are missing or invalid."""
    resources = node.get("resources")
    if not isinstance(resources, dict):
        return None
    gpus = _count(resources.get("GPU", 0))
    return gpus if gpus is not None and gpus >= 0 else None


def _calib_settings(config: dict[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """``metadata.calib`` as a dict, with unknown keys reported."""
    metadata = config.get("metadata")
    calib = metadata.get("calib") if isinstance(metadata, dict) else None
    if calib is None:
        return {}, []
    if not isinstance(calib, dict):
        return {}, [Problem(_CALIB, f"must be a mapping with keys {', '.join(CALIB_KEYS)}, got {calib!r}")]
    problems = []
    for name in calib:
        if name not in CALIB_KEYS:
            close = difflib.get_close_matches(str(name), CALIB_KEYS, n=1)
            hint = f"; did you mean `{close[0]}`?" if close else f"; known: {', '.join(CALIB_KEYS)}"
            problems.append(Problem(f"{_CALIB}.{name}", f"unknown calib setting{hint}"))
    return calib, problems


def _gpu_problems(config: dict[str, Any], gpus: float, source: str) -> list[Problem]:
    """Rule (a): some node type that can start declares at least ceil(gpus) GPUs."""
    if gpus <= 0:
        return []
    need = math.ceil(gpus)
    head, global_max = config.get("head_node_type"), _count(config.get("max_workers"))
    nodes = {name: (node, _gpus_of(node)) for name, node in _node_types(config).items()}
    # A node type whose resources are missing or invalid may well be the GPU one: the schema problem covers it.
    if any((n_gpus is None or n_gpus >= need) and _can_start(name, node, head, global_max)
           for name, (node, n_gpus) in nodes.items()):
        return []
    found = [f"{name} (GPU {n_gpus}, " + ("head)" if name == head else
                                         f"max_workers {_worker_cap(name, node, head, global_max)})")
             for name, (node, n_gpus) in nodes.items() if n_gpus]
    seen = f"; GPU node types here: {', '.join(found)}" if found else "; no node type declares resources.GPU"
    example = ("e.g. g5.xlarge with `resources: {CPU: 4, GPU: 1}`" if need == 1 else
               f"an instance type with {need} GPUs and `resources: {{GPU: {need}, ...}}`")
    return [Problem("available_node_types", (
        f"a trial asks for {gpus:g} GPU{'' if gpus == 1 else 's'} ({source}) but no node type that can start "
        f"(the head, or max_workers > 0) declares resources.GPU >= {need}{seen}. Add a GPU worker type, {example} "
        f"and `max_workers: 8`, or for CPU-only trials set `{_CALIB}.gpus_per_trial: 0` (--gpus-per-trial 0)."))]


def _under(path: str, root: str) -> bool:
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _store_problems(config: dict[str, Any], calib: dict[str, Any], store: str | None, key: str) -> list[Problem]:
    """Rule (b): a cluster that can start workers keeps its store on shared storage."""
    shared_raw = calib.get("shared_paths", [])
    problems: list[Problem] = []
    shared: list[str] = []
    if not isinstance(shared_raw, list):
        problems.append(Problem(f"{_CALIB}.shared_paths", f"must be a list of absolute paths, got {shared_raw!r}"))
        shared_raw = []
    for i, entry in enumerate(shared_raw):
        if isinstance(entry, str) and entry.startswith("/"):
            shared.append(entry)
        else:
            problems.append(Problem(f"{_CALIB}.shared_paths[{i}]", (
                f"must be an absolute path of a directory every node mounts (e.g. /mnt/efs), got {entry!r}")))

    head, global_max = config.get("head_node_type"), _count(config.get("max_workers"))
    growing = []
    for name, node in _node_types(config).items():
        cap = _worker_cap(name, node, head, global_max)
        if cap is None or cap > 0:
            growing.append(f"{name}: up to {cap if cap is not None else '?'} workers")
    if not growing:
        return problems
    why = (f"this cluster can start nodes besides the head ({'; '.join(growing)}), and trials on every node "
           "write results, Stage-I artifacts and Ray Tune state to the store")
    fix = (f"set `{_CALIB}.store` (or --store) to s3://<bucket>/calib (or gs://...), or to a path under a shared "
           f"mount listed in `{_CALIB}.shared_paths` (e.g. /mnt/efs/calib with shared_paths: [/mnt/efs])")
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
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _commands(config: dict[str, Any], key: str) -> list[tuple[str, str]]:
    value = config.get(key)
    return [(f"{key}[{i}]", c) for i, c in enumerate(value) if isinstance(c, str)] if isinstance(value, list) else []


def _version_problems(config: dict[str, Any], raw: dict[str, Any], merged: bool, installed: str) -> list[Problem]:
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

    head, global_max = config.get("head_node_type"), _count(config.get("max_workers"))
    plan: dict[str, tuple[list[tuple[str, str]], str]] = {}  # node type -> (what it runs, where its pin belongs)
    for name, node in _node_types(config).items():
        if name == head:
            plan[name] = ([*image(("docker", docker, "head_image"), ("docker", docker, "image")), *common, *head_own],
                          "setup_commands")
        elif _can_start(name, node, head, global_max):
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


def _head_problems(config: dict[str, Any], raw: dict[str, Any]) -> list[Problem]:
    """Rule (d): ``head_node_type`` names a node type (Ray's message, with what was found)."""
    head, nodes = config.get("head_node_type"), config.get("available_node_types")
    if not isinstance(nodes, dict) or not isinstance(head, str) or head in nodes:
        return []
    default = "" if "head_node_type" in raw else " (the file sets none, so Ray's default applies)"
    return [Problem("head_node_type", (
        f"`head_node_type` must be one of `available_node_types`: got `{head}`{default}; "
        f"node types: {', '.join(map(str, nodes)) or 'none'}."))]


def _local_problems(config: dict[str, Any]) -> list[Problem]:
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


def _drop_followups(problems: list[Problem]) -> list[Problem]:
    """Each key once: a later problem on a key already reported (e.g. a non-list `setup_commands`) follows from it."""
    seen: set[str] = set()
    kept = []
    for problem in problems:
        if problem.key not in seen:
            kept.append(problem)
            seen.add(problem.key)
    return kept


@dataclass(frozen=True)
class Checked:
    """What :func:`check_cluster` found: the config as Ray prepared it, the settings in force, every problem."""

    config: dict[str, Any]
    store: str | None
    gpus_per_trial: float
    problems: list[Problem]


def check_cluster(config: dict[str, Any], *, store: str | None = None, gpus_per_trial: float | None = None) -> Checked:
    """Ray's checks and calib's rules on a loaded cluster config; ``store``/``gpus_per_trial`` override metadata."""
    import ray

    from calib.presets import PRESETS

    provider = config.get("provider") if isinstance(config.get("provider"), dict) else {}
    local = provider.get("type") == "local"
    local_problems = _local_problems(config) if local else []
    if local_problems:  # Ray's preparation of a local file aborts on these, with less to go on
        return Checked(config, store, float(gpus_per_trial or 0), _drop_followups(local_problems))
    prepared, problems = ray_checks(config)
    view = prepared if prepared is not None else config
    head_problems = _head_problems(view, config)
    if head_problems:  # one message for the key, whether or not Ray's validate_config got to raise its own
        problems = [p for p in problems if p.key != "head_node_type"] + head_problems

    calib, calib_problems = _calib_settings(config)
    problems += calib_problems
    gpus: Any
    if gpus_per_trial is not None:
        gpus, source = gpus_per_trial, "--gpus-per-trial"
    elif "gpus_per_trial" in calib:
        gpus, source = calib["gpus_per_trial"], f"{_CALIB}.gpus_per_trial"
    else:
        gpus, source = PRESETS.get("paper").gpus_per_trial, "the paper preset's default"
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus < 0:
        problems.append(Problem(source, f"must be a number >= 0 (GPUs each trial requests), got {gpus!r}."))
        gpus = 0.0
    if not local:
        problems += _gpu_problems(view, float(gpus), source)

    store_key = "--store" if store is not None else f"{_CALIB}.store"
    if store is None:
        store = calib.get("store")
        if store is not None and not isinstance(store, str):
            problems.append(Problem(store_key, f"must be a string (s3://<bucket>/calib or a path), got {store!r}."))
            store = None
    problems += _store_problems(view, calib, store, store_key)
    problems += _version_problems(view, config, prepared is not None, ray.__version__)
    return Checked(view, store, float(gpus), _drop_followups(problems))


# ------------------------------------------------------------------------------------------------- CLI


def _describe(checked: Checked) -> str:
    """``valid (ray X schema; head: ...; workers: ...; store ...; G GPU per trial)``."""
    import ray

    config = checked.config
    head, global_max = config.get("head_node_type"), _count(config.get("max_workers"))

    def resources(node: dict[str, Any]) -> str:
        res = node.get("resources") if isinstance(node.get("resources"), dict) else {}
        return ", ".join(f"{k} {v}" for k, v in res.items()) or "no resources"

    nodes = _node_types(config)
    workers = [f"{name} ({resources(n)} × {n.get('min_workers', 0)}-{_worker_cap(name, n, head, global_max)})"
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
    checked = check_cluster(load_cluster_yaml(path), store=store, gpus_per_trial=gpus_per_trial)
    if checked.problems:
        raise ClusterConfigError(str(path), checked.problems)
    return f"{path}: {_describe(checked)}"
