"""AdaFocal: calibration-aware adaptive focal loss (Ghosh, Schaaf, Gormley, NeurIPS 2022), docs/methods.md §4.14.

A focal loss whose γ is kept per confidence bin and updated after every epoch from the validation split's
calibration in that bin; a bin whose γ falls below a switch point moves to the *inverse* focal loss. Source:
ADAFOCAL-R (``3mcloud/adafocal``: ``losses/adafocal.py``, ``utils/train_utils.py``, ``utils/metrics.py``
``adaECE_error_mukhoti``, ``main.py`` for the defaults), whose behaviour is reproduced:

- **Loss.** With p_i = p_{i,y_i} (the probability of the *label*), b(i) its bin and γ = γ_{b(i)}:

      AdaFocal_i = −(1 − sign(γ)·p_i + 1e-20)^{|γ|} · log p_i

  γ > 0 is the focal loss, γ < 0 the inverse focal loss −(1 + p_i)^{|γ|}·log p_i; the gradient flows through
  both factors, none through the choice of γ. The bin of p_i: the first b < B − 1 with p_i < u_b, else the
  last (u_b the upper edge of bin b); at first the B equal-width bins of [0, 1].
- **Update, after each epoch** (``update_gamma_every=-1``, ADAFOCAL-R's default), from the validation split
  with confidences r = max_k p_k and correctness 1[argmax = y]: B equal-mass bins (edges interpolated in the
  sorted r at positions j·N/B, as ``np.interp``; bin b holds e_b < r ≤ e_{b+1}, so the smallest r is in
  none), E_b = mean r − accuracy in bin b (0 for an empty bin), then per bin

      γ ← γ·exp(λ·E_b) if γ > 0 else γ·exp(−λ·E_b);
      if |γ| < S: γ ← −S if γ > 0 else S   (the switch between focal and inverse focal);
      γ ← clip(γ, γ_min, γ_max),

  and the training bins take the validation bins' edges. The bins are built on the *confidence* and looked
  up with the *label's* probability, as in ADAFOCAL-R.

Defaults (ADAFOCAL-R ``main.py``, the paper's): B = 15, γ_0 = 1, λ = 1, S = 0.2, γ_min = −2, γ_max = 20.
FeDLaS ran AdaFocal itself (FEDLAS-P Table 1 †) with "the hyperparameters of the original publication".
Stage I feeds the validation logits (:class:`~calib.losses.TrainingStateLoss`); γ and the edges are float64
buffers, saved with a Stage-I checkpoint. Batch reduction: see :mod:`calib.losses._reduction` (ADAFOCAL-R
sums over the batch, ``reduction="sum"``, as FOCAL-R).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from calib._config import all_of, check, check_fields, checked_field, in_range, integer, number
from calib.losses._base import ConfiguredLoss, Reduction, TrainingStateLoss, register_loss
from calib.losses._reduction import reduce_per_sample

__all__ = ["AdaFocal", "AdaFocalConfig", "equal_mass_edges", "update_gammas"]

BASE_OFFSET = 1e-20
"""Added to the base 1 − sign(γ)·p (ADAFOCAL-R, "for numerical stability": p = 1 keeps a finite gradient)."""


@dataclass(frozen=True, kw_only=True)
class AdaFocalConfig:
    """AdaFocal (``adafocal``). Defaults: ADAFOCAL-R ``main.py`` (docs/methods.md §4.14).

    Attributes:
        num_bins: B, the confidence bins that each keep a γ, an integer >= 1 (15).
        gamma_initial: γ_0, every bin's γ before the first update, in [gamma_min, gamma_max] (1.0).
        update_rate: λ of γ ← γ·exp(±λ·E_b), >= 0 (1.0).
        switch_point: S, the |γ| below which a bin switches between focal and inverse focal, >= 0 (0.2).
        gamma_min, gamma_max: the clipping range of γ, gamma_min < gamma_max (−2.0, 20.0).
    """

    num_bins: int = checked_field(15, integer(at_least=1))
    gamma_initial: float = checked_field(1.0, number())
    update_rate: float = checked_field(1.0, all_of(number(), in_range(at_least=0)))
    switch_point: float = checked_field(0.2, all_of(number(), in_range(at_least=0)))
    gamma_min: float = checked_field(-2.0, number())
    gamma_max: float = checked_field(20.0, number())

    def __post_init__(self) -> None:
        check_fields(self)
        check(self.gamma_min < self.gamma_max, "gamma_min", self.gamma_min,
              f"be below gamma_max={self.gamma_max}")
        check(self.gamma_min <= self.gamma_initial <= self.gamma_max, "gamma_initial", self.gamma_initial,
              f"be in [gamma_min, gamma_max] = [{self.gamma_min}, {self.gamma_max}]")


def equal_mass_edges(confidences: torch.Tensor, num_bins: int) -> torch.Tensor:
    """B + 1 edges (float64): ``np.interp(np.linspace(0, N, B + 1), np.arange(N), np.sort(r))``, positions past
    N − 1 taking the largest r."""
    values = confidences.to(torch.float64).sort().values
    n = values.numel()
    positions = torch.arange(num_bins + 1, dtype=torch.float64, device=values.device) * (n / num_bins)
    positions[-1] = n
    lower = positions.floor().clamp(max=n - 1).long()
    upper = (lower + 1).clamp(max=n - 1)
    edges = values[lower] + (positions - lower.to(torch.float64)) * (values[upper] - values[lower])
    return torch.where(positions >= n - 1, values[-1], edges)


def update_gammas(gammas: torch.Tensor, gaps: torch.Tensor, *, update_rate: float, switch_point: float,
                  gamma_min: float, gamma_max: float) -> torch.Tensor:
    """The next γ per bin from the validation gaps E_b (the rule in the module docstring)."""
    step = torch.where(gammas > 0, update_rate * gaps, -update_rate * gaps)
    proposed = gammas * torch.exp(step)
    switched = torch.where(proposed > 0, torch.full_like(proposed, -switch_point),
                           torch.full_like(proposed, switch_point))
    proposed = torch.where(proposed.abs() < switch_point, switched, proposed)
    return proposed.clamp(gamma_min, gamma_max)


class AdaFocal(ConfiguredLoss, TrainingStateLoss):
    """AdaFocal_i = −(1 − sign(γ_b)·p_y + 1e-20)^{|γ_b|}·log p_y with per-bin γ_b updated from validation each
    epoch (:meth:`observe_validation`), reduced by ``reduction`` (see the module docstring)."""

    gammas: torch.Tensor
    edges: torch.Tensor

    def __init__(self, num_bins: int = AdaFocalConfig.num_bins, *,
                 gamma_initial: float = AdaFocalConfig.gamma_initial, update_rate: float = AdaFocalConfig.update_rate,
                 switch_point: float = AdaFocalConfig.switch_point, gamma_min: float = AdaFocalConfig.gamma_min,
                 gamma_max: float = AdaFocalConfig.gamma_max, reduction: Reduction = "mean") -> None:
        super().__init__(AdaFocalConfig, locals())
        self.register_buffer("gammas", torch.full((num_bins,), float(gamma_initial), dtype=torch.float64))
        self.register_buffer("edges", torch.arange(num_bins + 1, dtype=torch.float64) * (1 / num_bins))

    def sample_gamma(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """γ per sample (float64, shape (B,)): the γ of the bin of the detached p_y."""
        with torch.no_grad():
            p_y = F.log_softmax(logits, dim=1).gather(1, targets[:, None]).squeeze(1).exp()
            uppers = self.edges[1:-1].contiguous()  # u_0 … u_{B-2}; past them: the last bin
            bins = torch.searchsorted(uppers, p_y.to(torch.float64).contiguous(), right=True)
            return self.gammas[bins]

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        gamma = self.sample_gamma(logits, targets).to(logits.dtype)
        log_p = F.log_softmax(logits, dim=1).gather(1, targets[:, None]).squeeze(1)
        base = 1 - torch.sign(gamma) * log_p.exp() + BASE_OFFSET
        return reduce_per_sample(-base.pow(gamma.abs()) * log_p, self.reduction)

    def observe_validation(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Update every bin's γ and the bins' edges from the validation split (the module docstring's rule)."""
        if logits.shape[0] == 0:
            raise ValueError("AdaFocal updates γ from the validation split, which is empty.")
        with torch.no_grad():
            probs = F.softmax(logits, dim=1)
            confidence, predicted = probs.max(dim=1)
            confidence = confidence.to(torch.float64).to(self.edges.device)
            correct = (predicted == labels.to(predicted.device)).to(torch.float64).to(self.edges.device)
            edges = equal_mass_edges(confidence, self.num_bins)
            in_bin = (confidence[None, :] > edges[:-1, None]) & (confidence[None, :] <= edges[1:, None])
            counts = in_bin.sum(dim=1).to(torch.float64)
            mean_confidence = (in_bin * confidence).sum(dim=1) / counts.clamp_min(1)
            accuracy = (in_bin * correct).sum(dim=1) / counts.clamp_min(1)
            gaps = torch.where(counts > 0, mean_confidence - accuracy, torch.zeros_like(counts))
            self.gammas.copy_(update_gammas(self.gammas, gaps, update_rate=self.update_rate,
                                            switch_point=self.switch_point, gamma_min=self.gamma_min,
                                            gamma_max=self.gamma_max))
            self.edges.copy_(edges)


register_loss("adafocal", AdaFocalConfig, AdaFocal,
              "AdaFocal: focal loss with a per-confidence-bin γ updated from validation calibration each epoch, "
              "switching to inverse focal (Ghosh et al., NeurIPS 2022)", label="AdaFocal", order=4.5)
