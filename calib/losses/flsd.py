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
from torch.nn import functional as F

from calib._config import check_fields, checked_field, in_range
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import reduce_per_sample
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

    gamma: float = checked_field(3.0, in_range(at_least=0))
    gamma_low: float = checked_field(5.0, in_range(at_least=0))

    def __post_init__(self) -> None:
        check_fields(self)


class FLSD53(ConfiguredLoss):
    """Focal loss with γ_i = ``gamma_low`` if sg[p_y] < 0.2 else ``gamma``, reduced by ``reduction``."""

    def __init__(self, gamma: float = FLSD53Config.gamma, gamma_low: float = FLSD53Config.gamma_low,
                 reduction: Reduction = "mean") -> None:
        super().__init__(FLSD53Config, locals())

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


register_loss("flsd53", FLSD53Config, FLSD53,
              "FLSD-53: focal loss with γ = 5 when p_y < 0.2, else 3 (Mukhoti et al. 2020)", label="FLSD-53", order=3)
