"""A Stage-I training procedure as a registry entry: its config dataclass, whose fields are keys of the trial
config's ``stage1`` section (declared once, with their defaults and rules, :func:`~calib._config.checked_field`),
and its :class:`TrainingProcedure` class, whose hooks Stage I (:func:`calib.training.stage1.train_stage1`) calls.
:func:`register_procedure` registers the pair.

A procedure is on when its ``switch`` field (null = off) is set. The hooks, each a no-op unless overridden:

- ``__init__(config, setup)``: built once per Stage I from its config and a :class:`ProcedureSetup`;
- :meth:`~TrainingProcedure.wrap_model`: the freshly initialised model, before it moves to the device (BalCAL adds
  its second classifier);
- :meth:`~TrainingProcedure.start`: the model on its device, before the first epoch (PLP reads its layers);
- :meth:`~TrainingProcedure.start_epoch` / :meth:`~TrainingProcedure.end_epoch`: around each epoch's training steps
  (PLP freezes the top layers; BalCAL sets λ);
- :meth:`~TrainingProcedure.batch_loss`: a minibatch's loss and logits from a :class:`BatchStep` (Mixup mixes, MIT
  runs two passes, BalCAL scores two heads); at most one procedure that has this hook is on in a trial;
- :meth:`~TrainingProcedure.end_training`: after the last epoch;
- :meth:`~TrainingProcedure.state_dict` / :meth:`~TrainingProcedure.load_state_dict`: what Stage I's checkpoint
  keeps of it (Mixup's generator), so a resumed run is the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from calib._config import Rule, field_types
from calib.config import Stage1Config
from calib.models import CalibModel
from calib.registries import PROCEDURES
from calib.training.device import autocast

__all__ = ["BatchStep", "ProcedureSetup", "ProcedureSpec", "TrainingProcedure", "register_procedure",
           "switch_rule", "weighted_pair"]

Positions = dict[str, torch.Tensor]


def weighted_pair(loss_fn: nn.Module, weight: float, first: tuple, second: tuple,
                  indices: tuple[Positions, Positions] = ({}, {})) -> torch.Tensor:
    """weight·L(first) + (1 − weight)·L(second), with the loss's running state updated once per minibatch.

    Stateful losses (FeDLaS's NCI statistics, CRL's correctness history) update only in training mode, so the
    second call runs in eval mode and reads the state the first call just updated. ``indices``: the keyword
    arguments of each call (the samples' positions, for a loss that needs them).
    """
    loss_a = loss_fn(*first, **indices[0])
    loss_fn.eval()
    try:
        loss_b = loss_fn(*second, **indices[1])
    finally:
        loss_fn.train()
    return weight * loss_a + (1 - weight) * loss_b


def switch_rule(above: float, name: str) -> Rule:
    """A procedure's switch: a number > ``above``, or null to train without the procedure ``name``."""
    return Rule(f"> {above:g}, or null to train without {name}",
                lambda value: value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                                and value > above))


@dataclass(frozen=True)
class ProcedureSetup:
    """What a procedure is built from besides its config: the trial's architecture, Stage I's epochs and seed."""

    arch: str
    epochs: int
    seed: int


@dataclass
class BatchStep:
    """One minibatch of Stage I, as :meth:`TrainingProcedure.batch_loss` sees it.

    ``inputs``, ``targets`` and ``positions`` (the samples' places in the training split) on the device; the
    Stage-I loss ``loss_fn``; ``forward``, the (compiled) model pass ``x -> (features, logits)``; ``generator``, the
    data-order generator a procedure draws its permutations from; ``cuda_graphs``: a second call of ``forward``
    overwrites the first one's outputs (clone them to keep them)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor
    loss_fn: nn.Module
    forward: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    generator: torch.Generator
    device: torch.device
    amp: str
    indexed: bool
    cuda_graphs: bool

    def outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(features, logits) of ``x`` under the trial's autocast, as float32."""
        with autocast(self.device, self.amp):
            features, logits = self.forward(x)
        return features.float(), logits.float()

    def permutation(self) -> torch.Tensor:
        """A random order of the batch's samples, drawn from the data-order generator, on the device."""
        return torch.randperm(self.inputs.shape[0], generator=self.generator).to(self.device)

    def indices(self, positions: torch.Tensor) -> Positions:
        """The keyword arguments that give the loss the samples' ``positions``: none for a loss that does not
        need them."""
        return {"indices": positions} if self.indexed else {}

    def loss(self, logits: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """The loss of the batch's own targets."""
        return self.loss_fn(logits, self.targets, features, **self.indices(self.positions))

    def pair(self, weight: float, first: tuple, second: tuple, order: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`weighted_pair` of ``first`` and ``second`` (``(logits, targets, features)`` each); ``order``: the
        second's samples are the batch's in this order (a loss that needs positions gets them so)."""
        second_positions = self.positions if order is None or not self.indexed else self.positions[order]
        return weighted_pair(self.loss_fn, weight, first, second,
                             (self.indices(self.positions), self.indices(second_positions)))


class TrainingProcedure:
    """A Stage-I training procedure's hooks (the module docstring); a subclass overrides those it needs."""

    def __init__(self, config: Any, setup: ProcedureSetup) -> None:
        self.config, self.setup = config, setup

    def wrap_model(self, model: CalibModel) -> CalibModel:
        """The model to train, given the initialised one (on the CPU)."""
        return model

    def start(self, model: CalibModel) -> None:
        """Once before the first epoch (and before a checkpoint is loaded back), ``model`` on its device."""

    def start_epoch(self, epoch: int) -> None:
        """Before ``epoch``'s (0-based) training steps, the model in training mode."""

    def batch_loss(self, step: BatchStep) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of one minibatch and the logits its training accuracy is scored by."""
        features, logits = step.outputs(step.inputs)
        return step.loss(logits, features), logits

    def end_epoch(self, epoch: int) -> None:
        """After ``epoch``'s training steps, before the learning-rate step and validation."""

    def end_training(self) -> None:
        """After the last epoch."""

    def state_dict(self) -> dict[str, Any]:
        """What a Stage-I checkpoint keeps of the procedure (plain values and tensors)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s ``state``."""


def computes_batch_loss(procedure: type[TrainingProcedure]) -> bool:
    """Whether ``procedure`` overrides :meth:`TrainingProcedure.batch_loss`."""
    return procedure.batch_loss is not TrainingProcedure.batch_loss


@dataclass(frozen=True)
class ProcedureSpec:
    """A registered Stage-I training procedure (:func:`register_procedure`).

    ``config``: its frozen config dataclass, whose fields are ``stage1`` keys; ``switch``, the field whose null
    means off; ``procedure``, its :class:`TrainingProcedure` class. What the studies read (``calib.study.rows``):
    ``label``, its row in the tables and ``--methods`` (None: no row), at ``row_values`` (its fields' values there);
    ``order``, its place among the procedure rows; ``combines``, its row is a Stage I that the other methods also
    run on (``combine.py``'s Stage Is: Mixup, MIT) rather than a row of its own only (PLP, BalCAL).
    ``identity_at_default``: its fields are hashed into the ids even at their default (Mixup's and MIT's, which every
    stored identity holds); a procedure added later leaves them out at the default, so stored ids stay.
    ``excluded_because``: what the error says when another batch-loss procedure is on too ("trains on clean
    inputs")."""

    config: type
    procedure: type[TrainingProcedure]
    description: str
    switch: str
    label: str | None = None
    row_values: dict[str, Any] = dataclasses.field(default_factory=dict)
    order: float = math.inf
    combines: bool = False
    identity_at_default: bool = False
    excluded_because: str = "computes the batch's loss itself"

    @property
    def computes_batch_loss(self) -> bool:
        """Whether it has the :meth:`TrainingProcedure.batch_loss` hook (at most one such is on in a trial)."""
        return computes_batch_loss(self.procedure)

    def is_on(self, params: Any) -> bool:
        """Whether the config ``params`` turns it on (its switch is set)."""
        return getattr(params, self.switch) is not None


def register_procedure(
    name: str, config: type, procedure: type[TrainingProcedure], description: str, *, switch: str | None = None,
    label: str | None = None, row_values: dict[str, Any] | None = None, order: float = math.inf,
    combines: bool = False, identity_at_default: bool = False, excluded_because: str | None = None,
) -> None:
    """Register training procedure ``name``: its ``config`` dataclass (each field a ``stage1`` key, named for the
    procedure: ``mixup_alpha``) and its ``procedure`` class. ``switch`` defaults to the config's first field, which
    must default to None (off). The rest: see :class:`ProcedureSpec`."""
    fields = {f.name: f for f in dataclasses.fields(config) if f.init}
    switch = switch or next(iter(fields), "")
    if switch not in fields or fields[switch].default is not None:
        raise TypeError(f"{config.__name__} needs a field that defaults to None (the procedure off) as its switch, "
                        f"got switch={switch!r}.")
    if not issubclass(procedure, TrainingProcedure):
        raise TypeError(f"{procedure.__name__} must derive from calib.training.procedures.TrainingProcedure.")
    if label is not None and (row_values or {}).get(switch) is None:
        raise TypeError(f"The row {label!r} of training procedure {name!r} needs its switch in row_values "
                        f"({{{switch!r}: ...}}): without it the row trains without the procedure.")
    taken = {**{f.name: "Stage1Config" for f in dataclasses.fields(Stage1Config) if f.init},
             **{f: other for other, spec in PROCEDURES.items() for f in field_types(spec.config)}}
    clashes = [f"{f!r} (of {taken[f]})" for f in fields if f in taken]
    if clashes:
        raise TypeError(f"Training procedure {name!r}: its config's fields are stage1 keys, and these are taken: "
                        f"{', '.join(clashes)}; name them after the procedure (as mixup_alpha).")
    PROCEDURES.register(name)(ProcedureSpec(config, procedure, description, switch, label=label,
                                            row_values=dict(row_values or {}), order=order, combines=combines,
                                            identity_at_default=identity_at_default,
                                            excluded_because=excluded_because or ProcedureSpec.excluded_because))
