"""BalCAL (Ni et al., CVPR 2025) as a Stage-I training procedure, docs/methods.md §4.10: the model gets a second,
simplex-ETF classifier beside its linear head (:class:`~calib.training.balcal.BalCALModel`), each batch's loss scores
both heads, and after each epoch the feedback rule sets their mixing weight λ (:mod:`calib.training.balcal`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from calib._config import check_fields, checked_field
from calib.models import CalibModel
from calib.training.balcal import BalCALModel, BalCALObjective
from calib.training.procedures._base import BatchStep, TrainingProcedure, register_procedure, switch_rule

__all__ = ["BalCAL", "BalCALConfig"]


@dataclass(frozen=True, kw_only=True)
class BalCALConfig:
    """BalCAL (``balcal``).

    Attributes:
        balcal_delta: δ of BalCAL, the target of its accuracy-confidence feedback; null trains the plain model.
            The BalCAL row uses 0.95 (BALCAL-R ``train_BalCAL.sh``).
    """

    balcal_delta: float | None = checked_field(None, switch_rule(0, "BalCAL's ETF classifier"))

    def __post_init__(self) -> None:
        check_fields(self)


class BalCAL(TrainingProcedure):
    """The ETF classifier beside the head, both scored per batch, λ set after each epoch (the module docstring)."""

    objective: BalCALObjective

    def wrap_model(self, model: CalibModel) -> CalibModel:
        return BalCALModel(model)

    def start(self, model: CalibModel) -> None:
        self.objective = BalCALObjective(model, self.config.balcal_delta)  # type: ignore[arg-type]

    def batch_loss(self, step: BatchStep) -> tuple[torch.Tensor, torch.Tensor]:
        features, logits = step.outputs(step.inputs)
        # both heads score the same samples: a loss that needs positions gets them twice
        loss = self.objective.loss(step.loss_fn, features, step.targets,
                                   lambda _loss_fn, weight, first, second: step.pair(weight, first, second))
        return loss, logits

    def end_epoch(self, epoch: int) -> None:
        self.objective.end_epoch()


register_procedure("balcal", BalCALConfig, BalCAL, "BalCAL: a simplex-ETF classifier balanced with the linear head "
                   "(Ni et al., CVPR 2025)", label="BalCAL", row_values={"balcal_delta": 0.95}, order=4,
                   excluded_because="trains on clean inputs")
