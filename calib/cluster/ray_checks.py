"""Ray's own checks of a cluster file, offline: the config preparation and JSON-schema validation ``ray up``
runs (``ray.autoscaler._private.util.prepare_config`` and ``validate_config`` against the ``ray-schema.json``
shipped in the installed ray), without the provider steps that call the cloud, each violation a
:class:`~calib.cluster.cluster_file.Problem`."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from calib._config import did_you_mean
from calib.cluster.cluster_file import CALIB_KEYS, CALIB_SECTION, Problem

__all__ = ["PREPARATION_ERROR_KEYS", "ray_checks"]

# The key to blame when Ray's own config preparation raises: the provider (a type Ray cannot load) or
# the docker section (Ray asserts on it); anything else is the config as a whole.
PREPARATION_ERROR_KEYS: tuple[tuple[type[Exception], str], ...] = (
    (NotImplementedError, "provider.type"),
    (AssertionError, "docker"),
)


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
    # lazy: ray takes seconds to import; the launcher commands that never talk to Ray (slurm, onprem) skip it
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def _schema_problems(config: dict[str, Any]) -> list[Problem]:
    """Every violation of Ray's cluster schema (``validate_config`` raises only the first)."""
    # lazy: jsonschema is installed with Ray's cluster extra (.[cluster]), which only `validate` needs
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
                hint = (f"; calib's settings go under `{CALIB_SECTION}`" if not where and name in CALIB_KEYS else
                        did_you_mean(str(name), allowed, show=lambda c: f"`{c}`", form="; did you mean {}?"))
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
    # lazy: ray takes seconds to import; the launcher commands that never talk to Ray (slurm, onprem) skip it
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
