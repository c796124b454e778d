"""BalCAL: balancing two classifiers via a simplex ETF structure (Ni, Zhao, Gao, Guo, Zha, CVPR 2025),
docs/methods.md §4.10. Reference: BALCAL-R (``JianiNi/BalCAL``, commit 0ef3b5c), ``src/models/WRN.py``
``WideResNet_BalCAL`` and ``src/lightning_modules/One_Stage.py`` ``BalCAL_models``, by MaC-Cal's first author.

The model (:class:`BalCALModel`) keeps the backbone's features h (d values) and linear head W, b, and adds a
second classifier: an adaptor branch a = h + A(h) (A: BN-ReLU-Linear(d → d/2)-BN-ReLU-Linear(d/2 → d)), then
f = relu(BN(a)) normalised to unit length, scored against a fixed simplex equiangular tight frame
M = sqrt(C/(C−1)) · P · (I − 11ᵀ/C) (P: the orthonormal Q of a uniform random d × C matrix; a buffer, never
trained). Its output is the λ-mix of the two classifiers:

    z = λ · (W h + b) + (1 − λ) · f M.

Training (:class:`BalCALObjective`): the Stage-I loss L (any registered loss; BALCAL-R's script uses CE) on both
heads, L_total = λ · L(W h + b, y) + (1 − λ) · L(f M_B, y), where M_B scales M's column c by
sqrt(γ / n_c) for the n_c > 0 samples of class c in the batch (γ = batch size / classes present; absent classes
keep 1): BALCAL-R's ``produce_Ew`` class balancing. λ is not learned: it starts at 0.8 and after every epoch the
feedback rule :func:`feedback_weight` sets it from that epoch's training logits of both heads and δ
(``stage1.balcal_delta``; 0.95 in BALCAL-R's ``train_BalCAL.sh``).

Difference from BALCAL-R, so that it works with every architecture here: calib's models expose the pooled
features h, not the last feature map, so the adaptor acts on h with linear layers where BALCAL-R's acts on
WRN-28-10's last feature map with 3×3 convolutions (d → d/2 → d, residual) before BN-ReLU-pooling; the rest
(ETF, normalisation, balancing, λ-mix, feedback) is BALCAL-R's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from calib._config import ConfigError
from calib.models._base import CalibModel

__all__ = ["INITIAL_WEIGHT", "BalCALModel", "BalCALObjective", "balance_scale", "feedback_weight", "simplex_etf"]

INITIAL_WEIGHT = 0.8
"""λ before the first feedback (``WideResNet_BalCAL(lamd=0.8)``)."""

FEEDBACK_TOLERANCE = 1e-4
"""The bisection stops when its interval is this short (``find_lamd(tol=1e-4)``)."""


def simplex_etf(num_features: int, num_classes: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """M = sqrt(C/(C−1)) · P · (I − 11ᵀ/C), shape (d, C); P = Q of the QR of a uniform (d, C) matrix."""
    orthonormal, _ = torch.linalg.qr(torch.rand(num_features, num_classes, generator=generator))
    centring = torch.eye(num_classes) - torch.full((num_classes, num_classes), 1 / num_classes)
    return math.sqrt(num_classes / (num_classes - 1)) * orthonormal @ centring


class ETFHead(nn.Module):
    """z = λ·(W h + b) + (1 − λ)·f M on features [h; f] (2d values); λ is the buffer ``weight``."""

    def __init__(self, linear: nn.Linear, etf: torch.Tensor, initial_weight: float = INITIAL_WEIGHT) -> None:
        super().__init__()
        self.linear = linear
        self.register_buffer("etf", etf)
        self.register_buffer("weight", torch.tensor(float(initial_weight)))

    def branches(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(W h + b, f): the linear head's logits and the unit-length ETF feature."""
        d = self.linear.in_features
        return self.linear(features[:, :d]), features[:, d:]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        linear_logits, etf_features = self.branches(features)
        lam = self.weight.to(linear_logits.dtype)
        return lam * linear_logits + (1 - lam) * (etf_features @ self.etf.to(etf_features.dtype))


class BalCALModel(CalibModel):
    """A backbone with BalCAL's second (ETF) classifier: ``features`` are [h; f] (2d), ``head`` an :class:`ETFHead`."""

    def __init__(self, base: CalibModel) -> None:
        d, num_classes = base.num_features, base.num_classes
        if d < num_classes:
            raise ConfigError(
                f"`stage1.balcal_delta` needs an architecture with at least as many features as classes (its simplex "
                f"ETF is {num_classes} orthogonal directions in the feature space), got {d} features for "
                f"{num_classes} classes; pick a wider `arch` or set stage1.balcal_delta to null."
            )
        super().__init__(num_features=2 * d, num_classes=num_classes)
        linear = base.head
        base.head = nn.Identity()  # the linear classifier lives in the ETF head now
        self.base = base
        self.adaptor = nn.Sequential(
            nn.BatchNorm1d(d), nn.ReLU(), nn.Linear(d, d // 2, bias=False),
            nn.BatchNorm1d(d // 2), nn.ReLU(), nn.Linear(d // 2, d, bias=False),
        )
        self.etf_norm = nn.BatchNorm1d(d)
        self.head = ETFHead(linear, simplex_etf(d, num_classes))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = self.base.features(x)
        f = F.relu(self.etf_norm(h + self.adaptor(h)))
        f = f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return torch.cat([h, f], dim=1)


def balance_scale(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The per-class column scale of M in a batch: sqrt(γ / n_c) for classes present, 1 for absent ones."""
    counts = torch.bincount(labels, minlength=num_classes).to(torch.float32)
    present = counts > 0
    gamma = labels.numel() / present.sum()
    scale = torch.ones(num_classes, device=labels.device)
    scale[present] = torch.sqrt(gamma / counts[present])
    return scale


def _confidence_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    confidence, predicted = logits.double().softmax(dim=1).max(dim=1)
    return float(confidence.mean()), float((predicted == labels).double().mean())


def feedback_weight(linear_logits: torch.Tensor, etf_logits: torch.Tensor, labels: torch.Tensor, delta: float,
                    tol: float = FEEDBACK_TOLERANCE) -> float:
    """BALCAL-R's ``find_lamd``: the next λ from an epoch's training logits of the two heads.

    If the linear head is under-confident (δ·acc > conf) λ = 1. Otherwise bisect λ on [0, 1] towards
    conf(λ-mix) = δ·acc(λ-mix): mixes more confident than δ·acc move the upper end down, less confident ones the
    lower end up; λ is the last midpoint whose gap |δ·acc − conf| was below the linear head's own gap (as in
    BALCAL-R, which compares each midpoint with that first gap, not with the best one so far), or 1 if none was.
    Confidences are softmax maxima in float64.
    """
    conf_linear, acc_linear = _confidence_accuracy(linear_logits, labels)
    if acc_linear * delta > conf_linear:
        return 1.0
    first_gap = abs(acc_linear * delta - conf_linear)
    left, right, best = 0.0, 1.0, 1.0
    while right - left > tol:
        mid = (left + right) / 2
        conf, acc = _confidence_accuracy(mid * linear_logits.double() + (1 - mid) * etf_logits.double(), labels)
        if abs(acc * delta - conf) < first_gap:
            best = mid
        if acc * delta > conf:
            left = mid
        else:
            right = mid
    return best


class BalCALObjective:
    """BalCAL's training loss on one batch and its λ feedback after each epoch (the module docstring)."""

    def __init__(self, model: BalCALModel, delta: float) -> None:
        self.head: ETFHead = model.head  # type: ignore[assignment]
        self.delta = float(delta)
        self._epoch: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def loss(self, loss_fn: nn.Module, features: torch.Tensor, labels: torch.Tensor,
             pair_loss: Callable[..., torch.Tensor]) -> torch.Tensor:
        """λ·L(W h + b, y) + (1 − λ)·L(f M_B, y), recording both heads' logits for the epoch's feedback.

        ``pair_loss(loss_fn, weight, first, second)`` evaluates the weighted pair (Stage I's, which updates a
        stateful loss once per minibatch)."""
        linear_logits, etf_features = self.head.branches(features)
        num_classes = linear_logits.shape[1]
        etf = self.head.etf * balance_scale(labels, num_classes)[None, :]
        etf_logits = etf_features @ etf
        self._epoch.append((linear_logits.detach(), etf_logits.detach(), labels))
        h = features[:, : self.head.linear.in_features]
        return pair_loss(loss_fn, float(self.head.weight), (linear_logits, labels, h), (etf_logits, labels, h))

    def end_epoch(self) -> float:
        """Set λ by :func:`feedback_weight` from this epoch's logits and start the next epoch; returns λ."""
        linear_logits, etf_logits, labels = (torch.cat(parts) for parts in zip(*self._epoch, strict=True))
        self._epoch = []
        lam = feedback_weight(linear_logits, etf_logits, labels, self.delta)
        self.head.weight.fill_(lam)
        return lam
