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

Parsing also checks every parameter against the trial config it addresses, before anything runs: the
key must be a field of that config section, and each end of a range and every choice must be a valid
value there (``method.retention_init`` with ``high: 1.5`` is an error naming the file, the parameter
and the allowed range). ``method.*`` keys address the method that ``base`` names (``method.name`` or
``method: {name: ...}``), else :data:`DEFAULT_METHOD`, as ``studies/search.py`` does.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Any

from calib._config import ConfigError, _coerce, field_types, from_dict, load_yaml, named_section
from calib._registry import UnknownNameError
from calib.config import Stage1Config, TrialConfig, check_seed, check_trial_config_keys, set_dotted
from calib.datasets import DATASETS
from calib.losses import LOSSES
from calib.methods import METHODS
from calib.models import MODELS
from calib.registries import DEFAULT_LOSS

__all__ = ["DEFAULT_METHOD", "Distribution", "SearchSpace", "load_search_space", "parse_search_space"]

DEFAULT_METHOD = "mac_cal"
"""The method a space's ``method.*`` keys address when its ``base`` names none (``studies/search.py``'s)."""

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

    def probe_values(self) -> list[tuple[str, Any]]:
        """``(where, value)`` for every value a sampler can reach at the edge: both ends of a range
        (an int range's top is the last step), every choice of a categorical or grid."""
        s = self.spec
        if self.kind in ("categorical", "grid"):
            name = "choice" if self.kind == "categorical" else "value"
            return [(f"{name} {v!r}", v) for v in s["choices" if self.kind == "categorical" else "values"]]
        high = s["high"]
        if self.kind == "int":
            step = int(s.get("step", 1))
            high = s["low"] + (s["high"] - s["low"]) // step * step
        return [(f"low={s['low']!r}", s["low"]), (f"high={high!r}", high)]

    def to_optuna(self) -> Any:
        # lazy: optuna loads only for a search
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
        # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
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

    def probes(self) -> list[tuple[str | None, str, dict[str, Any]]]:
        """Assignments of every parameter (dotted key -> value) that reach each end of every range and
        every choice: first all parameters at their first value (low, first choice), then one
        assignment per other value of one parameter, the others at their first. Each comes as
        ``(parameter, where, assignment)``; the first has parameter ``None``.

        A trial config validated with each of these (``parse_trial_config``) shows, before anything
        runs, that no sampled value is out of range."""
        first = {k: d.probe_values()[0][1] for k, d in self.parameters.items()}
        out: list[tuple[str | None, str, dict[str, Any]]] = [(None, "every parameter at its first value", first)]
        for key, dist in self.parameters.items():
            out += [(key, where, {**first, key: value}) for where, value in dist.probe_values()[1:]]
        return out

    def is_finite(self) -> bool:
        return all(d.kind in ("grid", "categorical") for d in self.parameters.values())

    def grid(self) -> list[dict[str, Any]]:
        """Every combination of a grid/categorical-only space, as dicts of dotted keys."""
        if not self.is_finite():
            raise ConfigError("Only grid and categorical parameters can be enumerated; use an Optuna sampler.")
        keys = list(self.parameters)
        values = [d.spec.get("values", d.spec.get("choices")) for d in self.parameters.values()]
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


def _check_number(source: str, key: str, name: str, value: Any, *, integer: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: parameter `{key}`: `{name}` must be a number, got {name}={value!r}.")
    if not math.isfinite(value):
        raise ConfigError(f"{source}: parameter `{key}`: `{name}` must be a finite number, got {name}={value!r}.")
    if integer and not isinstance(value, int):
        raise ConfigError(f"{source}: parameter `{key}` (int): `{name}` must be an integer, got {name}={value!r}.")


def _section_of(config: dict[str, Any], section: str, registry: Any) -> tuple[type, dict[str, Any]]:
    name, params = named_section(config.get(section), section)
    return registry.get(name).config, params


def _check_config(config: dict[str, Any]) -> None:
    """The parts of a trial config a search space sets: known keys, types and ranges of each section.

    Placement and the dataset-dependent checks of :func:`calib.config.parse_trial_config` are left to
    the study, which validates its complete trial configs before Ray starts."""
    check_trial_config_keys(config)
    top = field_types(TrialConfig)
    from_dict(Stage1Config, config.get("stage1", {}), prefix="stage1.")
    for section, registry in (("loss", LOSSES), ("method", METHODS)):
        cls, params = _section_of(config, section, registry)
        from_dict(cls, params, prefix=f"{section}.")
    for key, value in config.items():
        if key not in ("stage1", "loss", "method"):
            value = _coerce(value, top[key], key)
            if key == "dataset":
                DATASETS.get(value)
            elif key == "arch":
                MODELS.get(value)
            elif key == "seed":
                check_seed(value, "seed")
            elif key == "num_bins" and value < 1:
                raise ConfigError(f"`num_bins` must be an integer >= 1, got num_bins={value!r}.")


def _check_against_config(space: SearchSpace, source: str) -> None:
    """Every probe of ``space`` (:meth:`SearchSpace.probes`) over its ``base`` is a valid config."""
    config: dict[str, Any] = {"stage1": {}, "loss": {"name": DEFAULT_LOSS}, "method": {"name": DEFAULT_METHOD}}
    try:
        for key, value in space.base.items():
            if not isinstance(key, str) or not key:
                raise ConfigError(f"`base` keys must be dotted trial-config keys, got {key!r}.")
            config = set_dotted(config, key, value)
        _check_config(config)
    except (ConfigError, UnknownNameError) as err:
        raise ConfigError(f"{source}: `base`: {err}") from None
    for parameter, where, assignment in space.probes():
        probe = config
        try:
            for key, value in assignment.items():
                probe = set_dotted(probe, key, value)
            _check_config(probe)
        except (ConfigError, UnknownNameError) as err:
            if parameter is None:  # blame the parameter the message names, if any
                named = [k for k in space.parameters if f"`{k}`" in str(err) or f"'{k}'" in str(err)]
                if len(named) == 1:
                    parameter, where = named[0], space.parameters[named[0]].probe_values()[0][0]
            what = f"parameter `{parameter}` ({space.parameters[parameter].kind}, at {where})" \
                if parameter is not None else f"with {where}"
            raise ConfigError(f"{source}: {what}: {err}") from None


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
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{source}: parameter names must be dotted trial-config keys such as "
                              f"`method.accuracy_weight`, got {key!r}.")
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
            _check_number(source, key, "low", spec["low"], integer=kind == "int")
            _check_number(source, key, "high", spec["high"], integer=kind == "int")
            if not spec["low"] < spec["high"]:
                raise ConfigError(f"{source}: parameter `{key}`: `low < high` must hold, got low={spec['low']}, "
                                  f"high={spec['high']}.")
            if kind == "loguniform" and spec["low"] <= 0:
                raise ConfigError(f"{source}: parameter `{key}`: loguniform needs low > 0, got low={spec['low']}.")
            if kind == "int":
                step, log = spec.get("step", 1), spec.get("log", False)
                if isinstance(step, bool) or not isinstance(step, int) or step < 1:
                    raise ConfigError(f"{source}: parameter `{key}` (int): `step` must be an integer >= 1, "
                                      f"got step={step!r}.")
                if not isinstance(log, bool):
                    raise ConfigError(f"{source}: parameter `{key}` (int): `log` must be true or false, "
                                      f"got log={log!r}.")
                if log and (spec["low"] < 1 or step != 1):
                    raise ConfigError(f"{source}: parameter `{key}` (int, log: true): a log scale needs low >= 1 "
                                      f"and no `step`, got low={spec['low']}, step={step}.")
        else:
            name = "values" if kind == "grid" else "choices"
            values = spec[name]
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{source}: parameter `{key}` ({kind}) needs a non-empty list of {name}, "
                                  f"got {name}={values!r}.")
        parsed[key] = Distribution(key, kind, spec)
    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError(f"{source}: `base` must be a mapping of dotted keys to values, got {base!r}.")
    space = SearchSpace(parsed, base, str(data.get("description", "")))
    _check_against_config(space, source)
    return space


def load_search_space(path: str | os.PathLike) -> SearchSpace:
    """Read and validate a search-space YAML file."""
    return parse_search_space(load_yaml(path, "Search space"), source=os.fspath(path))
