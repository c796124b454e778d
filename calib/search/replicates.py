"""Replicated search objectives: each Optuna trial runs its config on several (dataset, architecture, seed)
replicates, and Optuna sees one aggregate of their validation values.

A search's replicates are full base configs (one per seed × setup); a sampled config is the same parameters set
on each. The first replicate's trial id (its *anchor*) names the Optuna trial (``calib_trial_id``), so a search
without replicates keeps the ids it always had.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calib._config import ConfigError
from calib.config import set_dotted
from calib.trial import trial_id

__all__ = ["AGGREGATES", "REPLICATE_KEYS", "Replicates", "aggregate", "aggregate_values"]

AGGREGATES = ("mean", "median", "worst", "mean_plus_std")
"""How the replicates' values of an objective become the one value Optuna sees."""
REPLICATE_KEYS = ("seed", "dataset", "arch")
"""The config keys that tell a search's replicates apart: a replicated search's space may not set them."""


def aggregate(values: Sequence[float], how: str, mode: str) -> float:
    """The value Optuna sees for one objective whose replicates scored ``values``; ``mode``: "min" or "max".

    ``mean``, ``median``; ``worst``: the max of a minimised objective, the min of a maximised one;
    ``mean_plus_std``: the mean moved by the sample standard deviation (ddof 1; 0 for one value) towards worse
    (+ for a minimised objective, − for a maximised one)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("aggregate of no values")
    if how == "mean":
        return float(x.mean())
    if how == "median":
        return float(np.median(x))
    if how == "worst":
        return float(x.max() if mode == "min" else x.min())
    if how == "mean_plus_std":
        spread = float(x.std(ddof=1)) if x.size > 1 else 0.0
        return float(x.mean() + spread if mode == "min" else x.mean() - spread)
    raise ConfigError(f"`--aggregate` must be one of {', '.join(AGGREGATES)}, got {how!r}.")


def aggregate_values(per_replicate: Sequence[Sequence[float]], how: str, modes: Sequence[str]) -> list[float]:
    """Each objective's :func:`aggregate` over the replicates (``per_replicate[r][o]``)."""
    return [aggregate([values[o] for values in per_replicate], how, mode) for o, mode in enumerate(modes)]


def _sampled(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    config = base
    for key, value in params.items():
        config = set_dotted(config, key, value)
    return config


@dataclass(frozen=True)
class Replicates:
    """The replicate base configs of a search (``bases[0]`` its anchor) and the aggregate Optuna sees."""

    bases: tuple[dict[str, Any], ...]
    how: str = "mean"

    def __post_init__(self) -> None:
        if not self.bases:
            raise ConfigError("A search needs at least one replicate (a seed of one setup).")
        if self.how not in AGGREGATES:
            raise ConfigError(f"`--aggregate` must be one of {', '.join(AGGREGATES)}, got {self.how!r}.")

    def __len__(self) -> int:
        return len(self.bases)

    def config(self, params: dict[str, Any], replicate: int = 0, number: int | None = None) -> dict[str, Any]:
        """The trial config of replicate ``replicate`` of the sampled ``params`` (``number``: its Optuna trial)."""
        config = _sampled(self.bases[replicate], params)
        return config if number is None else {**config, "search_trial": number}

    def ids(self, params: dict[str, Any]) -> list[str]:
        """The store ids of the replicates of ``params``, in replicate order (the first is the anchor)."""
        return [trial_id(self.config(params, r)) for r in range(len(self.bases))]

    def described(self) -> list[list[Any]]:
        """[dataset, arch, seed] of each replicate: what a study's journal records (a resume must match it)."""
        return [[b["dataset"], b.get("arch"), b["seed"]] for b in self.bases]

    def check_space(self, parameters: Sequence[str]) -> None:
        """A ``ConfigError`` for a replicated search whose space varies what tells replicates apart."""
        clash = [k for k in parameters if k in REPLICATE_KEYS]
        if len(self.bases) > 1 and clash:
            raise ConfigError(f"The space varies {', '.join(clash)}, which tells a search's replicates apart: use "
                              f"--replicates 1 and one setup, or a space without {', '.join(clash)}.")
