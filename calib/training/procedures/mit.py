"""MIT, Mixup Inference in Training (Wang, Li, Ren, Sun, CVPR 2023), as a Stage-I training procedure,
docs/methods.md §4.9.

Two mixtures of the batch with a random permutation of itself, at λ1 = max(λ, 1 − λ) and λ2 = min(λ', 1 − λ')
(λ, λ' ~ Beta(α, α), :func:`~calib.training.mixing.mit_coefficients`), go through the model; their outputs (logits
and features) are decoupled into estimates of f(x) and f(x_π) (:func:`~calib.training.mixing.mit_decouple`), and the
loss is ½·L(f̂(x), y) + ½·L(f̂(x_π), y_π).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from calib._config import check_fields, checked_field
from calib.training.mixing import mit_coefficients, mit_decouple, mix
from calib.training.procedures._base import BatchStep, register_procedure, switch_rule
from calib.training.procedures.mixup import TABLE_ALPHA, MixingProcedure

__all__ = ["MIT", "MITConfig"]


@dataclass(frozen=True, kw_only=True)
class MITConfig:
    """MIT (``mit``).

    Attributes:
        mit_alpha: α of MIT's Beta(α, α); null trains without MIT. The tables' row uses 1.0.
    """

    mit_alpha: float | None = checked_field(None, switch_rule(0, "MIT"))

    def __post_init__(self) -> None:
        check_fields(self)


class MIT(MixingProcedure):
    """Two mixed passes, decoupled (the module docstring)."""

    def batch_loss(self, step: BatchStep) -> tuple[torch.Tensor, torch.Tensor]:
        lam1, lam2 = mit_coefficients(self.config.mit_alpha, self.rng)
        x, perm = step.inputs, step.permutation()
        h1, z1 = step.outputs(mix(x, x[perm], lam1))
        if step.cuda_graphs:  # the second replay of the graph reuses the first one's output memory
            h1, z1 = h1.clone(), z1.clone()
        h2, z2 = step.outputs(mix(x, x[perm], lam2))
        logits, logits_b = mit_decouple(z1, z2, lam1, lam2)
        features, features_b = mit_decouple(h1, h2, lam1, lam2)
        loss = step.pair(0.5, (logits, step.targets, features), (logits_b, step.targets[perm], features_b), perm)
        return loss, logits


register_procedure("mit", MITConfig, MIT, "MIT: Mixup Inference in Training, two mixed passes decoupled "
                   "(Wang et al. 2023)", label="MIT", row_values={"mit_alpha": TABLE_ALPHA}, order=2, combines=True,
                   identity_at_default=True, excluded_because="trains on two mixed passes of each batch")
