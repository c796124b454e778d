"""Ablation ladders: a baseline config plus an ordered list of named components, each a config change.

A ladder file (YAML)::

    description: MaC-Cal Table 5
    baseline: {name: Vanilla, set: {method: {name: vanilla}}}
    components:
      - {name: +Masked Retraining, set: {method: {name: mac_cal, head: linear, head_init: stage1}}}
      - {name: +Gradient Restriction, set: {method.gradient_restriction: true}}

``set`` maps dotted trial-config keys to values (a mapping value replaces that whole section).
Modes: ``incremental`` (baseline, then each component added to the row above: the paper's Table 5),
``leave_one_out`` (all components, then all but one), ``factorial`` (every subset; at most 6 components).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any, Literal

from calib._config import ConfigError, load_yaml
from calib.config import parse_trial_config, set_dotted

__all__ = ["MODES", "AblationStep", "Ladder", "load_ladder", "parse_ladder"]

MODES = ("incremental", "leave_one_out", "factorial")
Mode = Literal["incremental", "leave_one_out", "factorial"]
MAX_FACTORIAL = 6


@dataclass(frozen=True)
class Change:
    """A named config change: dotted key → value."""

    name: str
    values: dict[str, Any]

    def apply(self, config: dict[str, Any]) -> dict[str, Any]:
        for key, value in self.values.items():
            config = set_dotted(config, key, value)
        return config


@dataclass(frozen=True)
class AblationStep:
    """One row of an ablation: its label, the components it contains, and its trial config."""

    label: str
    components: tuple[str, ...]
    config: dict[str, Any]


@dataclass(frozen=True)
class Ladder:
    """A baseline and ordered components; :meth:`steps` turns them into configs for a mode."""

    baseline: Change
    components: tuple[Change, ...]
    description: str = ""
    source: str = "<ladder>"

    def _config(self, base: dict[str, Any], chosen: list[Change]) -> dict[str, Any]:
        config = self.baseline.apply(base)
        for change in chosen:
            config = change.apply(config)
        return config

    def check(self, base: dict[str, Any]) -> None:
        """Every incremental step (the baseline, then each component added to the row above: the ladder as
        written) must be a valid config over ``base``; the first that is not raises ``ConfigError`` naming
        the step. Other modes may then skip combinations the ladder never wrote (leave-one-out of a
        component the others build on), never an unknown name or an out-of-range value of a component."""
        for i in range(len(self.components) + 1):
            label = self.components[i - 1].name if i else self.baseline.name
            try:
                parse_trial_config(self._config(base, list(self.components[:i])))
            except (ConfigError, KeyError) as err:
                raise ConfigError(f"{self.source}: ladder step {label!r} is not a valid config: {err}") from None

    def steps(self, base: dict[str, Any], mode: Mode = "incremental") -> tuple[list[AblationStep], list[str]]:
        """Valid steps of ``mode`` applied to ``base``, and a note for each step whose config is invalid.

        The ladder's own incremental steps must all be valid (:meth:`check`), in every mode."""
        candidates: list[tuple[str, list[Change]]]
        comps = list(self.components)
        if mode == "incremental":
            candidates = [(self.baseline.name, [])] + [(c.name, comps[: i + 1]) for i, c in enumerate(comps)]
        elif mode == "leave_one_out":
            candidates = [("full", comps)] + [(f"− {c.name}", [d for d in comps if d is not c]) for c in comps]
        elif mode == "factorial":
            if len(comps) > MAX_FACTORIAL:
                raise ConfigError(f"factorial mode takes at most {MAX_FACTORIAL} components, got {len(comps)}.")
            candidates = [
                (" ".join(c.name for c in subset) or self.baseline.name, list(subset))
                for r in range(len(comps) + 1) for subset in itertools.combinations(comps, r)
            ]
        else:
            raise ConfigError(f"`mode` must be one of {', '.join(MODES)}, got mode={mode!r}.")
        self.check(base)
        steps, skipped = [], []
        for label, chosen in candidates:
            try:
                config = self._config(base, chosen)
                parse_trial_config(config)
            except (ConfigError, KeyError) as err:
                skipped.append(f"{label}: {err}")
                continue
            steps.append(AblationStep(label, tuple(c.name for c in chosen), config))
        return steps, skipped


def _change(entry: Any, where: str) -> Change:
    if not isinstance(entry, dict) or set(entry) != {"name", "set"} or not isinstance(entry["set"], dict):
        raise ConfigError(f"{where} must be a mapping with exactly the keys `name` and `set`, got {entry!r}.")
    bad = [k for k in entry["set"] if not isinstance(k, str) or not k]
    if bad:
        raise ConfigError(f"{where}: `set` keys must be dotted trial-config keys such as `method.head`, "
                          f"got {bad[0]!r}.")
    return Change(str(entry["name"]), dict(entry["set"]))


def parse_ladder(data: Any, *, source: str = "<ladder>") -> Ladder:
    """Validate the mapping of a ladder file; errors name the file and the entry."""
    if not isinstance(data, dict) or not {"baseline", "components"} <= set(data):
        raise ConfigError(f"{source}: a ladder is a mapping with `baseline` and `components`, got {data!r}.")
    unknown = sorted(set(data) - {"baseline", "components", "description"})
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown}; allowed: baseline, components, description.")
    components = data["components"]
    if not isinstance(components, list) or not components:
        raise ConfigError(f"{source}: `components` must be a non-empty list.")
    parsed = tuple(_change(c, f"{source}: component {i}") for i, c in enumerate(components))
    names = [c.name for c in parsed]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: component names must be unique, got {names}.")
    return Ladder(_change(data["baseline"], f"{source}: `baseline`"), parsed, str(data.get("description", "")),
                  source)


def load_ladder(path: str | os.PathLike) -> Ladder:
    """Read and validate a ladder YAML file."""
    return parse_ladder(load_yaml(path, "Ladder"), source=os.fspath(path))
