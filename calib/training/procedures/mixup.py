"""Mixup (Zhang, Cisse, Dauphin, Lopez-Paz, ICLR 2018) as a Stage-I training procedure, docs/methods.md §4.8.

Each minibatch is mixed with a random permutation of itself, x̃ = λ·x + (1 − λ)·x_π with one λ ~ Beta(α, α) per
batch (drawn from a NumPy generator seeded with the trial's seed; π from the data-order generator), and the loss is
λ·L(f(x̃), y) + (1 − λ)·L(f(x̃), y_π). Training accuracy is scored against the unpermuted labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from calib._config import check_fields, checked_field
from calib.training.mixing import mix
from calib.training.procedures._base import (
    BatchStep,
    ProcedureSetup,
    TrainingProcedure,
    register_procedure,
    switch_rule,
)

__all__ = ["TABLE_ALPHA", "MixingProcedure", "Mixup", "MixupConfig"]

TABLE_ALPHA = 1.0
"""The Beta(α, α) of the Mixup and MIT rows of the tables (MaC-Cal Tables 1 and 3)."""


@dataclass(frozen=True, kw_only=True)
class MixupConfig:
    """Mixup (``mixup``).

    Attributes:
        mixup_alpha: α of Mixup's Beta(α, α); null trains without Mixup. The tables' row uses 1.0.
    """

    mixup_alpha: float | None = checked_field(None, switch_rule(0, "Mixup"))

    def __post_init__(self) -> None:
        check_fields(self)


class MixingProcedure(TrainingProcedure):
    """A procedure that draws mixing coefficients from a NumPy generator seeded with the trial's seed, kept in
    Stage I's checkpoint."""

    def __init__(self, config: Any, setup: ProcedureSetup) -> None:
        super().__init__(config, setup)
        self.rng = np.random.default_rng(setup.seed)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]


class Mixup(MixingProcedure):
    """The mixed batch and its two-label loss (the module docstring)."""

    def batch_loss(self, step: BatchStep) -> tuple[torch.Tensor, torch.Tensor]:
        alpha = self.config.mixup_alpha
        lam = float(self.rng.beta(alpha, alpha))
        perm = step.permutation()
        features, logits = step.outputs(mix(step.inputs, step.inputs[perm], lam))
        loss = step.pair(lam, (logits, step.targets, features), (logits, step.targets[perm], features), perm)
        return loss, logits


register_procedure("mixup", MixupConfig, Mixup, "Mixup: train on Beta(α, α) mixtures of the batch (Zhang et al. 2018)",
                   label="Mixup", row_values={"mixup_alpha": TABLE_ALPHA}, order=1, combines=True,
                   identity_at_default=True, excluded_because="trains on mixed inputs")
