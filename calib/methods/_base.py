"""The registry entry of a method, and what a method hands back to ``run_trial``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from calib.artifacts import Stage1Artifact

__all__ = ["MethodOutcome", "MethodSpec"]


@dataclass
class MethodOutcome:
    """Class probabilities on the validation and test splits, plus the per-epoch Stage-II history."""

    val_probs: torch.Tensor
    test_probs: torch.Tensor
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class MethodSpec:
    """``run(params, artifact, seed=..., device=...)`` turns a Stage-I artifact into an outcome.

    Methods work on the artifact's cached features and logits (DESIGN.md): no backbone forward.
    """

    config: type
    run: Callable[..., MethodOutcome]
    description: str

    def __call__(
        self, params: Any, artifact: Stage1Artifact, *, seed: int, device: torch.device
    ) -> MethodOutcome:
        return self.run(params, artifact, seed=seed, device=device)
