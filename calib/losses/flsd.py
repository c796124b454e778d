"""FLSD-53: focal loss with a sample-dependent γ (Mukhoti et al., NeurIPS 2020), docs/methods.md §4.5.

Per sample, γ_i is chosen from the current probability of the label, p_{i,y_i}, detached (no
gradient flows through the choice) and recomputed at every step:

    γ_i = gamma_low (5)  if p_{i,y_i} < 0.2
    γ_i = gamma     (3)  if p_{i,y_i} >= 0.2

    FLSD_i = −(1 − p_{i,y_i})^{γ_i} · log p_{i,y_i}

FOCAL-R (``Losses/focal_loss_adaptive_gamma.py``, run as ``focal_loss_adaptive --gamma 3``) has a
third band, 0.2 <= p_y < 0.5, with a hard-coded γ = 3; with ``--gamma 3`` it equals the p_y >= 0.5
band, so two bands reproduce it. Here ``gamma`` covers both bands, i.e. all of p_y >= 0.2. There is
no epoch schedule (that is the different "FLSc" variant). Batch reduction: see
:mod:`calib.losses._reduction` (FOCAL-R sums over the batch). Numerics: as :mod:`calib.losses.focal`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from calib._config import check
from calib.losses._base import LossSpec, Reduction
from calib.losses._reduction import check_reduction, reduce_per_sample
from calib.losses._registry import LOSSES
from calib.losses.focal import focal_terms

__all__ = ["FLSD53", "FLSD53Config"]

LOW_PROBABILITY = 0.2
"""Below this probability of the label, FLSD-53 uses ``gamma_low`` (FOCAL-R's first band)."""


@dataclass(frozen=True, kw_only=True)
class FLSD53Config:
    """FLSD-53 (``flsd53``).

    Attributes:
        gamma: γ used when p_y >= 0.2, >= 0 (3.0, FOCAL-R's ``--gamma 3``).
        gamma_low: γ used when p_y < 0.2, >= 0 (5.0, FOCAL-R's first band).
    """

    gamma: float = 3.0
    gamma_low: float = 5.0

    def __post_init__(self) -> None:
        check(self.gamma >= 0, "gamma", self.gamma, "be >= 0")
        check(self.gamma_low >= 0, "gamma_low", self.gamma_low, "be >= 0")


class FLSD53(nn.Module):
    """Focal loss with γ_i = ``gamma_low`` if sg[p_y] < 0.2 else ``gamma``, reduced by ``reduction``."""

    def __init__(self, gamma: float = 3.0, gamma_low: float = 5.0, reduction: Reduction = "mean") -> None:
        super().__init__()
        FLSD53Config(gamma=gamma, gamma_low=gamma_low)  # validates the ranges
        self.gamma = float(gamma)
        self.gamma_low = float(gamma_low)
        self.reduction = check_reduction(reduction)

    def sample_gamma(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """γ_i per sample, shape (B,), in the logits' dtype, from the detached p_y."""
        with torch.no_grad():
            p_y = F.log_softmax(logits, dim=1).gather(1, targets[:, None]).squeeze(1).exp()
            low = torch.full_like(p_y, self.gamma_low)
            return torch.where(p_y < LOW_PROBABILITY, low, torch.full_like(p_y, self.gamma))

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        gamma = self.sample_gamma(logits, targets)
        return reduce_per_sample(focal_terms(logits, targets, gamma), self.reduction)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, gamma_low={self.gamma_low}, reduction={self.reduction!r}"


LOSSES.register("flsd53")(
    LossSpec(
        config=FLSD53Config,
        label="FLSD-53",
        order=3,
        build=lambda params, *, num_classes, reduction: FLSD53(params.gamma, params.gamma_low, reduction),
        description="FLSD-53: focal loss with γ = 5 when p_y < 0.2, else 3 (Mukhoti et al. 2020)",
    )
)
