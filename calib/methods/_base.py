"""The registry entry of a method, and what a method hands back to ``run_trial``."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from calib.artifacts import Stage1Artifact

__all__ = ["MethodOutcome", "MethodSpec", "Predictor", "check_population", "guarded"]


Predictor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``predict(features, logits) -> probs``: the fitted method applied to any Stage-I outputs (OOD sets)."""


@dataclass
class MethodOutcome:
    """Class probabilities (float64) on the validation and test splits, the per-epoch Stage-II
    history, and ``predict`` to apply the fitted method to other inputs' cached features and logits.

    ``val_indices``: the validation samples ``val_probs`` covers (None: all of them); a post-hoc method
    fitted on part of the split reports its validation metrics on the held-out rest. ``fit_details``: values of
    the store's fit columns (``fit_degenerate``, ``fit_degenerate_reason``, ``fitted_*``) the method knows."""

    val_probs: torch.Tensor
    test_probs: torch.Tensor
    predict: Predictor
    history: list[dict[str, Any]] = field(default_factory=list)
    val_indices: torch.Tensor | None = None
    fit_details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_predictor(
        cls, predict: Predictor, artifact: Stage1Artifact, history: list[dict[str, Any]] | None = None
    ) -> MethodOutcome:
        """Apply ``predict`` to the artifact's validation and test splits."""
        val, test = artifact.splits["val"], artifact.splits["test"]
        return cls(
            val_probs=predict(val.features, val.logits), test_probs=predict(test.features, test.logits),
            predict=predict, history=history or [],
        )


def no_splits(params: Any) -> tuple[str, ...]:
    """A method that reads the artifact's train/val/test splits only."""
    return ()


@dataclass(frozen=True)
class MethodSpec:
    """``run(params, artifact, seed=..., device=...)`` turns a Stage-I artifact into an outcome.

    Methods work on the artifact's cached features and logits (docs/architecture.md): no backbone forward.

    A method that can train several configs at once on one artifact (a population, docs/architecture.md
    §6) also gives ``run_population(params_list, artifact, seeds=..., device=...)``, which returns one
    outcome or exception per config, each equal to the config's own ``run``; ``population_key(params)``
    says which configs can share a population (equal keys).

    ``splits(params)`` names the cached splits beyond train/val/test that a config reads
    (``calib.artifacts.METHOD_SPLITS``); ``run_trial`` adds them to ``artifact.splits`` first.

    ``logits_only``: the method reads only the validation and test logits (the uncalibrated model, the post-hoc
    methods), so it runs on a predictions file, which holds no features and no training split; ``posthoc``: it
    is a post-hoc calibrator (:func:`calib.posthoc.register_posthoc_method` sets both).

    What the studies read from the spec (``calib.study.rows``): ``label``, the method's row in the tables and its
    name in ``--methods`` (None: reachable by its registered name only, not a table row); ``order``, its place
    among the rows of its kind (ties: registration order). ``added_fields``: fields added after results were
    stored, with their defaults: at its default such a field is left out of the trial's identity, so trials
    stored before it existed keep their ids. ``check(params, config)``: the method's own checks of a whole trial
    config (its params against the rest), raising ``ConfigError``; run when the config is parsed.
    ``former_name``: the name the method was registered under before it was renamed: its trials' identity keeps
    it, so the trials stored under it keep their ids (``METHODS`` accepts it as an alias of the new name).
    ``draws``: whether the method draws random numbers in Stage II (so ``stage2_seed`` changes its result); a study's
    ``--stage2-seeds`` runs a method that does not (the uncalibrated model) once per seed, not once per Stage-II seed.
    """

    config: type
    run: Callable[..., MethodOutcome]
    description: str
    run_population: Callable[..., list[MethodOutcome | BaseException]] | None = None
    population_key: Callable[[Any], Hashable] | None = None
    splits: Callable[[Any], tuple[str, ...]] = no_splits
    logits_only: bool = False
    posthoc: bool = False
    label: str | None = None
    order: float = math.inf
    added_fields: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[Any, Any], None] | None = None
    former_name: str | None = None
    draws: bool = True

    def __post_init__(self) -> None:
        if (self.run_population is None) != (self.population_key is None):
            raise ValueError("`run_population` and `population_key` go together: give both or neither.")

    def __call__(
        self, params: Any, artifact: Stage1Artifact, *, seed: int, device: torch.device
    ) -> MethodOutcome:
        return self.run(params, artifact, seed=seed, device=device)


def guarded(make: Callable[..., MethodOutcome], *args: Any) -> MethodOutcome | BaseException:
    """``make(*args)``, or the exception it raised: one population member's failure stays its own."""
    try:
        return make(*args)
    except Exception as err:
        return err


def check_population(params: Sequence[Any], key: Callable[[Any], Hashable], fields: Sequence[str]) -> None:
    """Raise ``ValueError`` unless every config of ``params`` has the same ``key`` (made of ``fields``)."""
    keys = {key(p) for p in params}
    if len(keys) > 1:
        raise ValueError(f"Population members must share {', '.join(fields)}; got {sorted(keys)}.")
