"""FeDLaS: feature-modulated bidirectional label smoothing (Bahavan, Seneviratne, Halgamuge, ECCV'26).

docs/methods.md §3.

A plug-in for label smoothing (LS) or MbLS that makes the smoothing weight per sample:

    α_i = α_base · 2 · sigmoid(β · ψ_i · γ_i),   α_i ∈ (0, 2·α_base)            (FEDLAS-P Eq. 7)

- α_base: the LS smoothing α, or the MbLS weight λ; β ≥ 0: the modulation strength (β = 0 gives
  α_i = α_base, the base loss exactly).
- γ_i: the norm-based confidence indicator (NCI, §3.2), a standardised L1 norm of the detached
  penultimate feature h_i, using running statistics that move only in training mode.
- ψ_i ∈ {−1, 0, +1}: the bidirectional calibration gate (BCG, §3.3), the sign of a small MLP of
  the detached logits, trained through a straight-through estimator by the model's own optimiser
  on the training loss itself (no separate gate loss).

Losses (FEDLAS-R ``FEDLAS.forward`` and ``FEDLASplus.forward``), with p = softmax(z), CE_i = −log p_{i,y_i},
E_i = −(1/C) Σ_k log p_{i,k} and d_{i,k} = max_l z_{i,l} − z_{i,k}:

    FeDLaS-LS    (``fedlas_ls``):   L = mean_i[(1 − α_i)·CE_i + α_i·E_i]
    FeDLaS-MbLS  (``fedlas_mbls``): L = mean_i[(1 − α_i)·CE_i] + mean_i[α_i · (1/C)·Σ_k relu(d_{i,k} − m)]

Sources: FEDLAS-P (the paper, Eq. 3-12 and §5) and FEDLAS-R (GitHub ``nadarasarbahavan/FEDLAS``,
commit 93b0b73, ``calibrate/losses/fedlas.py``: classes NCI, DCG/STE_DCG, FEDLAS, FEDLASplus;
``configs/loss/*.yaml`` and ``configs/data/*.yaml`` for the defaults).

Pitfalls (docs/methods.md §3.7):
- The NCI statistics are updated only in training mode. The loss module must be put in ``train()``
  mode every epoch (``calib.training.stage1`` calls ``loss_fn.train()``); otherwise μ and σ stay
  frozen at their initial values (20, 100).
- The MbLS margin penalty is the *class mean* (the code), not the class sum of the paper's Eq. 6;
  the two differ by a factor C in the effective λ. This module reproduces the code.
- The gate parameters must be in the optimiser (``calib.training.stage1`` optimises
  ``model.parameters() + loss_fn.parameters()``); gradient clipping applies to the model only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from calib._config import check, check_fields, checked_field, in_range, number
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import scale_batch_mean
from calib.losses.mbls import margin_penalty

__all__ = [
    "BidirectionalCalibrationGate",
    "FeDLaSLS",
    "FeDLaSLSConfig",
    "FeDLaSMbLS",
    "FeDLaSMbLSConfig",
    "NormConfidenceIndicator",
    "adaptive_coefficient",
]

_STD_EPS = 1e-3  # γ_i = (n_i − μ)/(σ + 1e-3)  [FEDLAS-R NCI]
MOMENTUM = in_range(above=0, at_most=1)
"""The rule of the NCI's momentum θ: in (0, 1]."""


@dataclass(frozen=True, kw_only=True)
class FeDLaSLSConfig:
    """FeDLaS on label smoothing (``fedlas_ls``). Defaults: CIFAR-10 (docs/methods.md §3.5, FEDLAS-R configs).

    Attributes:
        smoothing: α_base, the LS smoothing α, in [0, 1) (0.05; CIFAR-100: 0.1; Tiny-ImageNet, CUB,
            Aircraft: 0.05). Since α_i < 2·α_base, α_base ≤ 0.5 keeps 1 − α_i ≥ 0.
        modulation_strength: β of Eq. 7, >= 0 (4.0 on every dataset); 0 gives plain LS.
        norm_momentum: θ, the NCI's weight of the *current* batch in the running mean/std, in (0, 1]
            (0.95; CIFAR-100 and Tiny-ImageNet: 0.5). FEDLAS-R's config key is ``data.momentum``.
    """

    smoothing: float = checked_field(0.05, in_range(at_least=0, below=1))
    modulation_strength: float = checked_field(4.0, number(at_least=0))
    norm_momentum: float = checked_field(0.95, MOMENTUM)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class FeDLaSMbLSConfig:
    """FeDLaS on MbLS (``fedlas_mbls``, FEDLAS-R ``FEDLASplus``). Defaults: CIFAR-10 (docs/methods.md §3.5).

    Attributes:
        penalty_weight: λ = α_base, the weight of the margin penalty, >= 0 (0.1; CIFAR-100: 0.1;
            Tiny-ImageNet, CUB, Aircraft: 0.05). Since α_i < 2·λ, λ ≤ 0.5 keeps 1 − α_i ≥ 0.
        margin: m, the logit-gap margin, >= 0 (6.0; Tiny-ImageNet, CUB, Aircraft: 10.0).
        modulation_strength: β of Eq. 7, >= 0 (0.5; CIFAR-100: 1.0; Tiny-ImageNet: 0.5).
        norm_momentum: θ, the NCI's weight of the *current* batch, in (0, 1] (0.95; CIFAR-100 and
            Tiny-ImageNet: 0.5).
    """

    penalty_weight: float = checked_field(0.1, number(at_least=0))
    margin: float = checked_field(6.0, number(at_least=0))
    modulation_strength: float = checked_field(0.5, number(at_least=0))
    norm_momentum: float = checked_field(0.95, MOMENTUM)

    def __post_init__(self) -> None:
        check_fields(self)


class NormConfidenceIndicator(nn.Module):
    """NCI (FEDLAS-P Eq. 10-12, FEDLAS-R ``NCI``): γ_i = (n_i − μ)/(σ + 1e-3), n_i = ‖sg[h_i]‖₁.

    μ and σ are buffers (initially 20 and 100). In training mode, once per call and *before* γ is
    computed, they move towards the batch statistics of n:

        μ ← θ·mean_batch(n) + (1 − θ)·μ,   σ ← θ·std_batch(n) + (1 − θ)·σ   (std unbiased, ``torch.std``)

    Note the naming: θ (``momentum``) weights the *current batch*, so a larger θ adapts faster;
    this is the opposite of the usual EMA "momentum" (e.g. BatchNorm's keeps ``1 − momentum`` of the old value).
    In eval mode the statistics are frozen. A batch of one sample has no unbiased std, so then only μ
    moves (FEDLAS-R would write NaN into σ).

    Args:
        momentum: θ in (0, 1].
        initial_mean, initial_std: the starting μ and σ (20, 100 in FEDLAS-R).
    """

    running_mean: torch.Tensor
    running_std: torch.Tensor

    def __init__(self, momentum: float, *, initial_mean: float = 20.0, initial_std: float = 100.0) -> None:
        super().__init__()
        MOMENTUM.check("momentum", momentum)
        self.momentum = float(momentum)
        self.register_buffer("running_mean", torch.tensor(float(initial_mean)))
        self.register_buffer("running_std", torch.tensor(float(initial_std)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """γ of shape (N,) from features h of shape (N, d) (further dims are flattened); never carries grad."""
        norms = features.detach().flatten(1).float().abs().sum(dim=1)
        if self.training:
            theta = self.momentum
            with torch.no_grad():
                self.running_mean.mul_(1 - theta).add_(theta * norms.mean())
                if norms.numel() > 1:
                    self.running_std.mul_(1 - theta).add_(theta * norms.std())
        return (norms - self.running_mean) / (self.running_std + _STD_EPS)

    def extra_repr(self) -> str:
        return f"momentum={self.momentum}"


class BidirectionalCalibrationGate(nn.Module):
    """BCG (FEDLAS-P Eq. 8-9, FEDLAS-R ``DCG`` / ``STE_DCG``): ψ_i = sign(s_i) ∈ {−1, 0, +1}.

    q_i = softmax(W₂ · LeakyReLU_{0.01}(W₁ · sg[z_i] + b₁) + b₂) ∈ R², with W₁: C → max(1, ⌊C/2⌋) and
    W₂: → 2; s_i = q_{i,1} − q_{i,0}; ψ_i = sign(s_i), 0 exactly when s_i = 0. The backward pass is
    the straight-through estimator: ∂ψ_i/∂s_i = 1. The forward value is exactly ±1 or 0:
    ``sign(s).detach() + (s − s.detach())`` adds an exact zero that carries the identity gradient.
    (The paper's w_gate = [1, −1] vs the code's [−1, +1] is immaterial: the gate is learned.)
    """

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        check(isinstance(num_classes, int) and num_classes >= 1, "num_classes", num_classes, "be an integer >= 1")
        hidden = max(1, num_classes // 2)
        self.fc1 = nn.Linear(num_classes, hidden)
        self.act = nn.LeakyReLU(0.01)
        self.fc2 = nn.Linear(hidden, 2)

    def score(self, logits: torch.Tensor) -> torch.Tensor:
        """s of shape (N,): the difference of the gate's two softmax outputs (in [−1, 1])."""
        q = F.softmax(self.fc2(self.act(self.fc1(logits.detach().to(self.fc1.weight.dtype)))), dim=1)
        return q[:, 1] - q[:, 0]

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """ψ of shape (N,) from logits z of shape (N, C); gradient reaches the gate weights only."""
        s = self.score(logits)
        return torch.sign(s).detach() + (s - s.detach())


def adaptive_coefficient(
    base: float, modulation_strength: float, direction: torch.Tensor, indicator: torch.Tensor
) -> torch.Tensor:
    """α_i = base · 2 · sigmoid(β · ψ_i · γ_i) (FEDLAS-P Eq. 7); γ is detached, ψ keeps its STE gradient."""
    return base * 2.0 * torch.sigmoid(modulation_strength * direction * indicator.detach())


class _FeDLaSBase(ConfiguredLoss):
    """The shared part: NCI + BCG → α_i, the reduction, and the ``features`` check. ``base`` names the config field
    that is α_base; ``values`` holds the config's fields, ``num_classes`` and ``reduction``."""

    def __init__(self, config: type, values: Mapping[str, Any], *, base: str) -> None:
        super().__init__(config, values)
        self.base = getattr(self, base)
        self.num_classes = values["num_classes"]
        self.nci = NormConfidenceIndicator(self.norm_momentum)
        self.gate = BidirectionalCalibrationGate(self.num_classes)

    def coefficients(self, logits: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
        """α of shape (N,); updates the NCI statistics when in training mode."""
        if features is None:
            raise ValueError(
                f"{type(self).__name__} needs the penultimate features h: call it as loss(logits, targets, features)."
            )
        if features.shape[0] != logits.shape[0]:
            raise ValueError(
                f"features and logits must have the same batch size, got {features.shape[0]} and {logits.shape[0]}."
            )
        gamma = self.nci(features)
        psi = self.gate(logits)
        return adaptive_coefficient(self.base, self.modulation_strength, psi, gamma)

    def _terms(self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(α_i, log p_i, CE_i = −log p_{i,y_i}), α in the log-probabilities' dtype."""
        alpha = self.coefficients(logits, features)
        log_probs = F.log_softmax(logits, dim=1)
        ce = -log_probs.gather(1, targets.long().unsqueeze(1)).squeeze(1)
        return alpha.to(log_probs.dtype), log_probs, ce


class FeDLaSLS(_FeDLaSBase):
    """FeDLaS-LS: L = mean_i[(1 − α_i)·CE_i + α_i·E_i], α_i = α·2·sigmoid(β·ψ_i·γ_i) (docs/methods.md §3.4).

    With β = 0, α_i = α and this is label smoothing LS_α = (1 − α)·CE + α·E exactly (§4.1).

    Takes the fields of :class:`FeDLaSLSConfig` (α = ``smoothing``), ``num_classes`` (C, the gate's input width) and
    ``reduction`` ("mean", or "sum" = batch size × the mean).
    """

    def __init__(
        self, smoothing: float, *, modulation_strength: float, norm_momentum: float, num_classes: int,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__(FeDLaSLSConfig, locals(), base="smoothing")

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        alpha, log_probs, ce = self._terms(logits, targets, features)
        uniform = -log_probs.mean(dim=1)
        loss = ((1 - alpha) * ce + alpha * uniform).mean()
        return scale_batch_mean(loss, logits.shape[0], self.reduction)


class FeDLaSMbLS(_FeDLaSBase):
    """FeDLaS-MbLS (FEDLAS-R ``FEDLASplus``), docs/methods.md §3.4:

        L = mean_i[(1 − α_i)·CE_i] + mean_i[α_i · (1/C)·Σ_k relu(d_{i,k} − m)],  d_{i,k} = max_l z_{i,l} − z_{i,k}

    α_i = λ·2·sigmoid(β·ψ_i·γ_i). The penalty is the class *mean* as in the code (the paper's Eq. 6
    sums over classes). Unlike plain MbLS (CE + λ·R), this is a convex combination; with β = 0 it
    is (1 − λ)·CE + λ·R.

    Takes the fields of :class:`FeDLaSMbLSConfig` (λ = ``penalty_weight``), ``num_classes`` and ``reduction``.
    """

    def __init__(
        self, penalty_weight: float, *, margin: float, modulation_strength: float, norm_momentum: float,
        num_classes: int, reduction: Reduction = "mean",
    ) -> None:
        super().__init__(FeDLaSMbLSConfig, locals(), base="penalty_weight")

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        alpha, log_probs, ce = self._terms(logits, targets, features)
        penalty = margin_penalty(logits, self.margin).to(log_probs.dtype)
        loss = ((1 - alpha) * ce).mean() + (alpha * penalty).mean()
        return scale_batch_mean(loss, logits.shape[0], self.reduction)


register_loss("fedlas_ls", FeDLaSLSConfig, FeDLaSLS,
              "FeDLaS-LS: label smoothing with a feature-norm, gate-modulated per-sample α (ECCV'26)",
              label="FeDLaS-LS", order=8,
              dataset_defaults={"cifar100": {"smoothing": 0.1, "norm_momentum": 0.5}})  # FEDLAS-R configs/data
register_loss("fedlas_mbls", FeDLaSMbLSConfig, FeDLaSMbLS,
              "FeDLaS-MbLS (FEDLASplus): margin penalty with a feature-norm, gate-modulated per-sample λ",
              label="FeDLaS-MbLS", order=9, dataset_defaults={"cifar100": {"modulation_strength": 1.0,
                                                                           "norm_momentum": 0.5}})
