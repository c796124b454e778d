"""PLP, progressively layer-peeled training (Wang & Zhang, ICML 2024), as a Stage-I training procedure,
docs/methods.md §4.10: at the start of each epoch the model's top parameter tensors are frozen by the stage
schedule of :mod:`calib.training.plp`, and every one is trainable again after the last epoch."""

from __future__ import annotations

from dataclasses import dataclass

from calib._config import check_fields, checked_field
from calib.models import CalibModel
from calib.training.plp import PLPSchedule
from calib.training.procedures._base import TrainingProcedure, register_procedure, switch_rule

__all__ = ["PLP", "PLPConfig"]


@dataclass(frozen=True, kw_only=True)
class PLPConfig:
    """PLP (``plp``).

    Attributes:
        plp_gamma: γ of PLP: stage k of 11 starts at epoch ⌊(k/11)^γ · epochs⌋ and freezes the model's top layers;
            null trains every layer throughout. The PLP row uses 1.0 (``dengbaowang/PLP`` README).
    """

    plp_gamma: float | None = checked_field(None, switch_rule(0, "PLP's layer peeling"))

    def __post_init__(self) -> None:
        check_fields(self)


class PLP(TrainingProcedure):
    """The layer-peeling schedule, applied at each epoch's start (the module docstring)."""

    schedule: PLPSchedule

    def start(self, model: CalibModel) -> None:
        self.schedule = PLPSchedule(self.setup.arch, model, epochs=self.setup.epochs, gamma=self.config.plp_gamma)

    def start_epoch(self, epoch: int) -> None:
        self.schedule.apply(epoch)

    def end_training(self) -> None:
        self.schedule.release()


register_procedure("plp", PLPConfig, PLP, "PLP: progressively layer-peeled training (Wang & Zhang, ICML 2024)",
                   label="PLP", row_values={"plp_gamma": 1.0}, order=3)
