"""Stage-I training procedures, by registered name: Mixup, MIT, PLP, BalCAL. Adding one: one file here, a config
dataclass whose fields (``stage1`` keys) declare their defaults and rules once and a :class:`TrainingProcedure`
with the hooks it needs, registered with one :func:`register_procedure` call: every module of this package that
does not start with ``_`` is imported below (docs/extending.md §1.1), after calib's own four in this order."""

import importlib

from calib._registry import import_submodules
from calib.registries import PROCEDURES
from calib.training.procedures._base import (
    BatchStep,
    ProcedureSetup,
    ProcedureSpec,
    TrainingProcedure,
    register_procedure,
    switch_rule,
    weighted_pair,
)

for _own in ("mixup", "mit", "plp", "balcal"):  # calib's own first, in this order: their rows' and their hooks'
    importlib.import_module(f"{__name__}.{_own}")
import_submodules(__name__, __path__)

__all__ = ["PROCEDURES", "BatchStep", "ProcedureSetup", "ProcedureSpec", "TrainingProcedure",
           "register_procedure", "switch_rule", "weighted_pair"]
