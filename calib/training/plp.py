"""PLP: progressively layer-peeled training (Wang & Zhang, ICML 2024, "Calibration Bottleneck: Over-compressed
Representations are Less Calibratable"), docs/methods.md §4.10.

Training runs in S stages; stage k (k = 0 … S−1) starts at epoch ⌊(k/S)^γ · E⌋ (E epochs, γ = ``plp_gamma``) and
updates only the first c_k parameter tensors of the model in forward order (the body's, then the head's), with
c_0 = all and c_k decreasing: each stage "peels" the top layers off, which stay frozen for the rest of training
(no update, no weight decay, no momentum; gradients still flow through them to the layers below, and their
BatchNorm statistics still track the data, as in the official code). This is the official implementation
(``dengbaowang/PLP`` ``train.py`` with ``my_sgd.SGD.step(idx)``, which updates ``params[:idx]``; BALCAL-R's
``PLP_Adam`` is the same rule for Adam).

The cut points c_k: for the architectures the official code lists, its own (``resnet50``: 161 tensors,
S = 11, block boundaries; calib's ``resnet50`` and ``resnet50_tiny`` have exactly that parameter list). For any
other architecture calib's rule: the tensors are grouped by the module that owns them (a convolution, a
BatchNorm's weight and bias, the head's weight and bias), M groups in forward order, and stage k trains the
first ⌈M·(S−k)/S⌉ of them (S = 11, the official number of stages), so the last stage trains the bottom ~1/S.

Difference from the official loop: it moves to the next stage only on the epoch that equals that stage's start
(``if epoch == epoch_froze[-1]``), so when two starts coincide (few epochs, e.g. a 2-epoch run) it stops
peeling; here the stage of epoch e is the last one whose start is <= e (stages without an epoch are skipped).
For E = 350 and S = 11 (the papers' protocol) the starts are distinct and the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from torch import nn

__all__ = ["OFFICIAL_CUTS", "PLP_STAGES", "PLPSchedule", "cut_points", "peel_order", "stage_of", "stage_starts"]

PLP_STAGES = 11
"""S, the number of stages: the length of the official code's ``layer_idx`` lists (ResNet-18 and ResNet-50)."""

_RESNET50_CUTS = (33, 54, 72, 84, 93, 102, 120, 129, 141, 150, 161)
OFFICIAL_CUTS: dict[str, tuple[int, ...]] = {"resnet50": _RESNET50_CUTS, "resnet50_tiny": _RESNET50_CUTS}
"""The official ``layer_idx`` (ascending) of architectures whose parameter list is the official model's."""


def peel_order(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) in forward order: the body's in registration order, then the head's (a CalibModel
    registers its head first; the official models register it last)."""
    named = list(model.named_parameters())
    return [(n, p) for n, p in named if not n.startswith("head.")] + [(n, p) for n, p in named
                                                                       if n.startswith("head.")]


def cut_points(arch: str, model: nn.Module, stages: int = PLP_STAGES) -> tuple[int, ...]:
    """The ascending c_k (parameter tensors trained at each stage, the last one = all) of ``model``."""
    order = peel_order(model)
    official = OFFICIAL_CUTS.get(arch)
    if official is not None and official[-1] == len(order) and len(official) == stages:
        return official
    owners: list[str] = []
    sizes: list[int] = []
    for name, _ in order:
        owner = name.rsplit(".", 1)[0]
        if owners and owners[-1] == owner:
            sizes[-1] += 1
        else:
            owners.append(owner)
            sizes.append(1)
    groups = len(sizes)
    kept = [math.ceil(groups * (stages - k) / stages) for k in range(stages)]  # groups trained at stage k
    return tuple(sum(sizes[:n]) for n in reversed(kept))


def stage_starts(epochs: int, gamma: float, stages: int = PLP_STAGES) -> tuple[int, ...]:
    """The first epoch of each stage, ⌊(k/S)^γ · E⌋, in the official code's floating point (``epoch_froze``:
    ``np.linspace(0, 1, S + 1) ** γ * E``, truncated): at γ = 2, E = 121 it starts stage 3 at epoch 8, not the exact
    9, and the same float steps ``(k / S) ** γ`` would give 24 and 99 for stages 5 and 10 where it gives 25 and 100."""
    return tuple(int(start) for start in (np.linspace(0, 1, stages + 1) ** gamma * epochs)[:stages])


def stage_of(epoch: int, starts: Sequence[int]) -> int:
    """The stage of ``epoch``: the last one whose start is <= ``epoch``."""
    return max(k for k, start in enumerate(starts) if start <= epoch)


class PLPSchedule:
    """Freezes ``model``'s top parameters epoch by epoch (``requires_grad``), as the module docstring says."""

    def __init__(self, arch: str, model: nn.Module, *, epochs: int, gamma: float, stages: int = PLP_STAGES) -> None:
        self.order = [p for _, p in peel_order(model)]
        self.cuts = cut_points(arch, model, stages)
        self.starts = stage_starts(epochs, gamma, stages)

    def trained(self, epoch: int) -> int:
        """c_k of ``epoch``'s stage: how many leading parameter tensors it updates."""
        return self.cuts[len(self.cuts) - 1 - stage_of(epoch, self.starts)]

    def apply(self, epoch: int) -> int:
        """Let the first :meth:`trained` tensors learn and freeze the rest; returns that count."""
        count = self.trained(epoch)
        for i, param in enumerate(self.order):
            param.requires_grad_(i < count)
        return count

    def release(self) -> None:
        """Every parameter trainable again (after training)."""
        for param in self.order:
            param.requires_grad_(True)
