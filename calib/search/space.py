"""Search-space files: ``search_spaces/*.yaml``, one documented format for grids and Optuna searches.

Format::

    description: free text                      # optional
    base:                                       # optional: fixed trial-config values (dotted keys)
      method.name: mac_cal
    parameters:                                 # dotted trial-config key -> distribution
      method.accuracy_weight: {distribution: uniform, low: 0.85, high: 1.0}
      method.clip_init:       {distribution: loguniform, low: 0.005, high: 0.2}
      method.bottleneck_width: {distribution: int, low: 32, high: 512, log: true}
      stage1.mixup_alpha:     {distribution: categorical, choices: [null, 0.2, 1.0]}
      seed:                   {distribution: grid, values: [1, 2, 3]}

Distributions: ``uniform`` (low, high), ``loguniform`` (low > 0, high), ``int`` (low, high inclusive,
optional ``log``, optional ``step``), ``categorical`` (choices), ``grid`` (values: every value is
run; with an Optuna sampler a grid parameter is sampled as categorical, with ``--sampler grid`` the
whole space must be grid/categorical and is enumerated).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

from calib._config import ConfigError, load_yaml

__all__ = ["Distribution", "SearchSpace", "load_search_space", "parse_search_space"]

_REQUIRED = {
    "uniform": {"low", "high"},
    "loguniform": {"low", "high"},
    "int": {"low", "high"},
    "categorical": {"choices"},
    "grid": {"values"},
}
_OPTIONAL = {"int": {"log", "step"}}


@dataclass(frozen=True)
class Distribution:
    """One parameter's distribution; ``spec`` holds the keys of its YAML mapping."""

    key: str
    kind: str
    spec: dict[str, Any]

    def to_optuna(self) -> Any:
        import optuna.distributions as od

        s = self.spec
        if self.kind == "uniform":
            return od.FloatDistribution(s["low"], s["high"])
        if self.kind == "loguniform":
            return od.FloatDistribution(s["low"], s["high"], log=True)
        if self.kind == "int":
            return od.IntDistribution(s["low"], s["high"], log=bool(s.get("log", False)), step=int(s.get("step", 1)))
        return od.CategoricalDistribution(s["choices"] if self.kind == "categorical" else s["values"])

    def to_tune(self) -> Any:
        from ray import tune

        s = self.spec
        if self.kind == "uniform":
            return tune.uniform(s["low"], s["high"])
        if self.kind == "loguniform":
            return tune.loguniform(s["low"], s["high"])
        if self.kind == "int":
            step = int(s.get("step", 1))
            if s.get("log"):
                return tune.lograndint(s["low"], s["high"] + 1)
            return tune.qrandint(s["low"], s["high"], step)
        if self.kind == "categorical":
            return tune.choice(s["choices"])
        return tune.grid_search(s["values"])


@dataclass(frozen=True)
class SearchSpace:
    """A parsed search-space file: fixed ``base`` values and the searched ``parameters``."""

    parameters: dict[str, Distribution]
    base: dict[str, Any]
    description: str = ""

    def optuna_space(self) -> dict[str, Any]:
        return {k: d.to_optuna() for k, d in self.parameters.items()}

    def is_finite(self) -> bool:
        return all(d.kind in ("grid", "categorical") for d in self.parameters.values())

    def grid(self) -> list[dict[str, Any]]:
        """Every combination of a grid/categorical-only space, as dicts of dotted keys."""
        if not self.is_finite():
            raise ConfigError("Only grid and categorical parameters can be enumerated; use an Optuna sampler.")
        keys = list(self.parameters)
        values = [d.spec.get("values", d.spec.get("choices")) for d in self.parameters.values()]
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


def _check_number(source: str, key: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: parameter `{key}`: `{name}` must be a number, got {name}={value!r}.")


def parse_search_space(data: Any, *, source: str = "<search space>") -> SearchSpace:
    """Validate the mapping of a search-space file; every error names the file and the parameter."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a search space must be a mapping with a `parameters` key, got {data!r}.")
    unknown = sorted(set(data) - {"parameters", "base", "description"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {unknown}; allowed: parameters, base, description.")
    params = data.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"{source}: `parameters` must be a non-empty mapping of dotted keys to distributions.")
    parsed = {}
    for key, spec in params.items():
        if not isinstance(spec, dict) or "distribution" not in spec:
            raise ConfigError(f"{source}: parameter `{key}` must be a mapping with a `distribution` key, got {spec!r}.")
        spec = dict(spec)
        kind = spec.pop("distribution")
        if kind not in _REQUIRED:
            raise ConfigError(
                f"{source}: parameter `{key}` has unknown distribution {kind!r}; "
                f"allowed: {', '.join(sorted(_REQUIRED))}."
            )
        missing = _REQUIRED[kind] - set(spec)
        extra = set(spec) - _REQUIRED[kind] - _OPTIONAL.get(kind, set())
        if missing or extra:
            raise ConfigError(
                f"{source}: parameter `{key}` ({kind}) needs exactly the keys {sorted(_REQUIRED[kind])}"
                f"{' (optional: ' + ', '.join(sorted(_OPTIONAL[kind])) + ')' if kind in _OPTIONAL else ''}; "
                f"missing {sorted(missing)}, unexpected {sorted(extra)}."
            )
        if kind in ("uniform", "loguniform", "int"):
            _check_number(source, key, "low", spec["low"])
            _check_number(source, key, "high", spec["high"])
            if not spec["low"] < spec["high"]:
                raise ConfigError(f"{source}: parameter `{key}`: `low < high` must hold, got low={spec['low']}, "
                                  f"high={spec['high']}.")
            if kind == "loguniform" and spec["low"] <= 0:
                raise ConfigError(f"{source}: parameter `{key}`: loguniform needs low > 0, got low={spec['low']}.")
        else:
            values = spec.get("values", spec.get("choices"))
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{source}: parameter `{key}` ({kind}) needs a non-empty list, got {values!r}.")
        parsed[key] = Distribution(key, kind, spec)
    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError(f"{source}: `base` must be a mapping of dotted keys to values, got {base!r}.")
    return SearchSpace(parsed, base, str(data.get("description", "")))


def load_search_space(path: str | os.PathLike) -> SearchSpace:
    """Read and validate a search-space YAML file."""
    return parse_search_space(load_yaml(path, "Search space"), source=os.fspath(path))
