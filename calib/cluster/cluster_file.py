"""A Ray cluster launcher file as calib reads it: loading it, the problems found in it, and the node types it
starts (shared by :mod:`calib.cluster.ray_checks`, :mod:`calib.cluster.cluster_rules` and
:mod:`calib.cluster.validate`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from calib._config import ConfigError

__all__ = ["CALIB_KEYS", "CALIB_SECTION", "SHARED_SCHEMES", "ClusterConfigError", "Problem", "can_start", "count",
           "load_cluster_yaml", "node_types", "worker_cap"]

CALIB_KEYS = ("store", "gpus_per_trial", "shared_paths", "trusted_network")
SHARED_SCHEMES = ("s3://", "gs://")
CALIB_SECTION = "metadata.calib"
"""Where calib's own settings live in a cluster file (Ray's schema keeps ``metadata`` free-form)."""


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


# ------------------------------------------------------------------------------------------ node types


def count(value: Any) -> int | None:
    """An integer count, or None when the value is not one (the schema reports that)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def node_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    types = config.get("available_node_types")
    return {str(k): v for k, v in types.items() if isinstance(v, dict)} if isinstance(types, dict) else {}


def worker_cap(name: str, node: dict[str, Any], head: Any, global_max: int | None) -> int | None:
    """How many workers of this type may start (None: unknown, taken as some)."""
    if global_max == 0:
        return 0
    cap = node.get("max_workers", 0 if name == head else global_max)
    return count(cap)


def can_start(name: str, node: dict[str, Any], head: Any, global_max: int | None) -> bool:
    cap = worker_cap(name, node, head, global_max)
    return name == head or cap is None or cap > 0
