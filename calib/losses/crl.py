"""CRL: correctness ranking loss (Moon, Kim, Shin, Hwang, ICML 2020), docs/methods.md §4.13.

Cross-entropy plus a ranking term that orders the samples' confidences like their *correctness history*
c_i: how often sample i was classified correctly in training so far. Source: CRL-R
(``daintlab/confidence-aware-learning``: ``train.py``, ``crl_utils.py`` ``History``, ``main.py``), whose
behaviour is reproduced:

- κ_i, the rank target of sample i (``rank_target``): "softmax" max_k p_{i,k} (the default); "entropy" the
  negative entropy divided by log C; "margin" the top-1 minus the top-2 probability. Gradients flow through κ.
- Pairs: each sample with the next one of the batch, cyclically (i, i + 1 mod B).
- Targets: with ĉ = (c − min c) / (c_max − min c), min over *all* training samples and c_max the history's
  maximum count (1 through the second epoch, then the number of finished epochs):
  y_i = sign(ĉ_i − ĉ_{i+1}) and the margin δ_i = |ĉ_i − ĉ_{i+1}|.
- L_rank = (1/B)·Σ_i max(0, −y_i·(κ_i − κ_{i+1}) + |y_i|·δ_i)  (``MarginRankingLoss`` with the margin folded
  into its second input, as CRL-R does; pairs with equal histories add 0).
- L̄ = mean_i CE_i + λ·L_rank; λ = ``penalty_weight`` (CRL-R ``--rank_weight``, 1.0).
- The history: after the loss of a training step, c_i += 1[argmax_k z_{i,k} = y_i] for the batch's samples
  (the step's own logits, before the weights move); c_max grows by one at the end of every epoch from the
  second on. When c_max equals min c (every sample right in every epoch so far) CRL-R divides by zero; here
  the denominator is then 1 (the targets y do not depend on it).

The history is sample-indexed: Stage I passes the batch's positions in the training split (``indices=``)
and sizes the history before the first epoch (:class:`~calib.losses.TrainingStateLoss`). It moves only in
training mode, and is part of the loss's ``state_dict`` (a resumed Stage I continues it). Batch reduction:
see :mod:`calib.losses._reduction` (CRL-R averages: ``reduction="mean"``; "sum" is B · L̄).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch.nn import functional as F

from calib._config import check, check_fields, checked_field, number
from calib.losses._base import ConfiguredLoss, Reduction, TrainingStateLoss, register_loss
from calib.losses._reduction import scale_batch_mean

__all__ = ["CRL", "CRLConfig", "rank_targets"]

RankTarget = Literal["softmax", "entropy", "margin"]


@dataclass(frozen=True, kw_only=True)
class CRLConfig:
    """CE + λ·correctness ranking loss (``crl``). Defaults: CRL-R's ``main.py`` (docs/methods.md §4.13).

    Attributes:
        penalty_weight: λ, the weight of the ranking loss, >= 0 (1.0, ``--rank_weight``).
        rank_target: κ, "softmax" (max probability), "entropy" (negative normalised entropy) or "margin"
            (top-1 − top-2 probability) ("softmax", ``--rank_target``).
    """

    penalty_weight: float = checked_field(1.0, number(at_least=0))
    rank_target: RankTarget = "softmax"

    def __post_init__(self) -> None:
        check_fields(self)


def rank_targets(logits: torch.Tensor, rank_target: RankTarget) -> torch.Tensor:
    """κ per sample, shape (B,), with gradient (see the module docstring)."""
    if rank_target == "softmax":
        return F.softmax(logits, dim=1).max(dim=1).values
    if rank_target == "entropy":
        log_probs = F.log_softmax(logits, dim=1)
        return (log_probs.exp() * log_probs).sum(dim=1) / math.log(logits.shape[1])
    top2 = F.softmax(logits, dim=1).topk(2, dim=1).values
    return top2[:, 0] - top2[:, 1]


class CRL(ConfiguredLoss, TrainingStateLoss):
    """mean CE + λ·L_rank against the samples' correctness history (see the module docstring).

    Call as ``loss(logits, targets, features, indices=positions)`` after :meth:`start_training`.
    """

    needs_sample_indices: ClassVar[bool] = True
    correctness: torch.Tensor
    max_correctness: torch.Tensor

    def __init__(self, penalty_weight: float = CRLConfig.penalty_weight,
                 rank_target: RankTarget = CRLConfig.rank_target, reduction: Reduction = "mean") -> None:
        super().__init__(CRLConfig, locals())
        self.register_buffer("correctness", torch.zeros(0, dtype=torch.int64))
        self.register_buffer("max_correctness", torch.ones((), dtype=torch.int64))

    def start_training(self, num_samples: int) -> None:
        """An empty history for ``num_samples`` training samples, c_max = 1."""
        check(isinstance(num_samples, int) and num_samples >= 1, "num_samples", num_samples, "be an integer >= 1")
        self.correctness = torch.zeros(num_samples, dtype=torch.int64, device=self.max_correctness.device)
        self.max_correctness.fill_(1)

    def end_epoch(self, epoch: int) -> None:
        """c_max += 1 after every epoch but the first (CRL-R: ``if epoch > 1`` with epochs counted from 1)."""
        if epoch >= 1:
            self.max_correctness += 1

    def ranking_loss(self, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """L_rank of the batch against the current history (the history is not updated here)."""
        kappa = rank_targets(logits, self.rank_target)
        history = self.correctness.to(torch.float64)
        lowest = history.min()
        span = self.max_correctness.to(torch.float64) - lowest
        span = torch.where(span > 0, span, torch.ones_like(span))
        first = (history[indices] - lowest) / span
        second = torch.roll(first, -1)
        sign = torch.sign(first - second).to(kappa.dtype)
        margin = (first - second).abs().to(kappa.dtype)
        return (-sign * (kappa - torch.roll(kappa, -1)) + sign.abs() * margin).clamp_min(0).mean()

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None, *,
        indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if indices is None:
            raise ValueError("CRL needs the batch's positions in the training split: call it as "
                             "loss(logits, targets, features, indices=positions).")
        if self.correctness.numel() == 0:
            raise RuntimeError("CRL's correctness history is empty: call start_training(num_samples) first.")
        if indices.shape != targets.shape:
            raise ValueError(f"indices and targets must have the same shape, got {tuple(indices.shape)} and "
                             f"{tuple(targets.shape)}.")
        indices = indices.to(self.correctness.device).long()
        loss = F.cross_entropy(logits, targets) + self.penalty_weight * self.ranking_loss(logits, indices)
        if self.training:
            with torch.no_grad():
                correct = (logits.argmax(dim=1) == targets).to(torch.int64).to(self.correctness.device)
                self.correctness.index_add_(0, indices, correct)
        return scale_batch_mean(loss, logits.shape[0], self.reduction)


register_loss("crl", CRLConfig, CRL,
              "CRL: CE + λ·ranking of confidences by the samples' correctness history (Moon et al. 2020)",
              label="CRL", order=7.4)
