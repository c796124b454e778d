"""Stage II's one training loop: K heads trained side by side on cached inputs (docs/architecture.md §6).

A method describes its members as a :class:`Population` (their heads and optimiser, how a minibatch
becomes their losses, what happens after each epoch) and :func:`train_population` runs the epochs. A
lone config is a population of one: TST, V-TST and MaC-Cal train every config through this loop, so
a config's result does not depend on whether it trained alone or with others.

Every epoch: ``start_epoch`` (MaC-Cal draws its masks there), one minibatch order per member from
its own CPU generator (``torch.randperm``), then per minibatch the members' mean losses (K,), one
backward pass of their sum (each member gets its own gradient, its loss's) and one optimiser step.
The per-member sums of loss·B, correct predictions and confidence (float64) go to ``end_epoch``. A
member whose summed loss is not finite fails with :class:`TrainingDiverged` and is no longer passed
to ``end_epoch``; the others go on, and the loop ends early once every member failed.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

import torch

from calib import progress

__all__ = ["EpochSums", "Population", "TrainingDiverged", "alone", "train_population"]

T = TypeVar("T")


class TrainingDiverged(FloatingPointError):
    """A member's Stage-II training loss became non-finite at ``epoch`` (0-based); the other members go on."""

    def __init__(self, message: str, *, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch


class EpochSums(NamedTuple):
    """Per member, sums over an epoch's minibatches of the mean loss times the batch size, the correct
    predictions and the max-softmax confidence; ``n`` is the number of training inputs."""

    loss: list[float]
    correct: list[float]
    confidence: list[float]
    n: int


class Population(abc.ABC):
    """K members trained together by :func:`train_population`.

    ``generators``: one CPU generator per member (its minibatch order; a method may draw its own noise
    or masks from it too, in the order a lone run draws them). ``device``: where the epoch sums are
    accumulated. ``index_device``: where the minibatch indices go (the device of the inputs they index).
    """

    def __init__(self, generators: Sequence[torch.Generator], *, epochs: int, batch_size: int,
                 device: torch.device, index_device: torch.device | str = "cpu") -> None:
        self.generators = list(generators)
        self.epochs, self.batch_size = epochs, batch_size
        self.device, self.index_device = device, index_device

    @property
    def size(self) -> int:
        """K, the number of members."""
        return len(self.generators)

    @abc.abstractmethod
    def start_epoch(self, epoch: int) -> None:
        """Before the epoch's minibatch orders are drawn: training mode, and whatever the epoch needs first."""

    @abc.abstractmethod
    def losses(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For minibatch ``indices`` (K, B), member k's row its own: the members' mean losses (K,), their
        logits (K, B, C) and labels (K, B)."""

    @abc.abstractmethod
    def zero_grad(self) -> None:
        """Clear the gradients of every member."""

    @abc.abstractmethod
    def step(self) -> None:
        """One optimiser step of every member, after the backward pass."""

    @abc.abstractmethod
    def divergence_message(self, epoch: int, total_loss: float, n: int) -> str:
        """The :class:`TrainingDiverged` message of a member whose summed loss is ``total_loss``."""

    @abc.abstractmethod
    def end_epoch(self, epoch: int, sums: EpochSums, active: Sequence[int]) -> None:
        """After the epoch: history rows, checkpoints, adaptation of the members in ``active`` (not failed)."""

    @abc.abstractmethod
    def results(self) -> list[Any]:
        """Each member's trained result, in member order (a failed member's is replaced by its failure)."""


def train_population(population: Population, n: int) -> list[Any]:
    """Train ``population`` on ``n`` training inputs for its epochs: per member its result or its
    :class:`TrainingDiverged`, in member order."""
    size = population.size
    failures: dict[int, TrainingDiverged] = {}
    for epoch in range(population.epochs):
        progress.record("stage2", epoch)
        population.start_epoch(epoch)
        order = torch.stack([torch.randperm(n, generator=g) for g in population.generators])
        order = order.to(population.index_device)  # (K, n)
        sums = torch.zeros(size, 3, dtype=torch.float64, device=population.device)  # loss·B, correct, confidence
        for indices in order.split(population.batch_size, dim=1):
            loss, logits, labels = population.losses(indices)
            population.zero_grad()
            loss.sum().backward()
            population.step()
            with torch.no_grad():
                confidence, predicted = logits.detach().softmax(2).max(2)
                sums += torch.stack([loss.detach().double() * labels.shape[1], (predicted == labels).sum(1).double(),
                                     confidence.sum(1).double()], dim=1)
        epoch_sums = EpochSums(*sums.T.tolist(), n=n)
        for k, total_loss in enumerate(epoch_sums.loss):
            if k not in failures and not math.isfinite(total_loss):
                failures[k] = TrainingDiverged(population.divergence_message(epoch, total_loss, n), epoch=epoch)
        population.end_epoch(epoch, epoch_sums, [k for k in range(size) if k not in failures])
        if len(failures) == size:
            break
    return [failures.get(k, result) for k, result in enumerate(population.results())]


def alone(results: Sequence[T | BaseException]) -> T:
    """The result of a population of one, or its failure raised."""
    (result,) = results
    if isinstance(result, BaseException):
        raise result
    return result
