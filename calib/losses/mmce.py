"""MMCE: maximum mean calibration error (Kumar, Sarawagi, Jain, ICML 2018), docs/methods.md §4.7.

With p = softmax(z), r_i = max_k p_{i,k} the confidence, c_i = 1[argmax_k p_{i,k} = y_i] the
correctness, the Laplacian kernel k(r, r') = exp(−|r − r'| / w) (w = ``kernel_width``, 0.4) and
B samples, of which m are correct (set D_c) and n incorrect (set D_i):

**MMCE_m** (``variant="unweighted"``, FOCAL-R ``MMCE``)::

    MMCE_m = (1/B²) · Σ_{i,j} (c_i − r_i)(c_j − r_j) · k(r_i, r_j)            (no square root)

**MMCE_w** (``variant="weighted"``, FOCAL-R ``MMCE_weighted``, its default)::

    MMCE_w = sqrt( (1/m²) · mean_{i,j ∈ D_c} (1 − r_i)(1 − r_j) · k(r_i, r_j)
                 + (1/n²) · mean_{i,j ∈ D_i} r_i · r_j · k(r_i, r_j)
                 − (2/(m·n)) · mean_{i ∈ D_c, j ∈ D_i} (1 − r_i) · r_j · k(r_i, r_j) )

  Each double sum of docs/methods.md §4.7 is a **mean over its pair matrix** (m×m, n×n, m×n), as in
  FOCAL-R ``Losses/mmce.py`` (``get_out_tensor`` is ``torch.mean``), and it is *then* divided by
  m², n² or m·n as well, as FOCAL-R does; so the pairs are effectively normalised by m⁴, n⁴ and
  m²n². Read without the code, the formula would normalise once; λ = 2 was tuned with FOCAL-R's
  double normalisation, so that is what is reproduced. MMCE_w is 0 when the
  batch has no correct or no incorrect sample. The quantity under the root is a squared RKHS
  distance (>= 0 up to rounding); it is clamped at 1e-10 before the root so the gradient stays finite
  (FOCAL-R adds 1e-10 instead, and 1e-5 to each denominator; both are left out here).

The loss is L̄ = mean_i CE_i + λ · MMCE (FOCAL-R ``mmce_weighted`` uses the mean cross-entropy).
Gradients flow through r (the kernel and the weights); c comes from the argmax and has none.
Batch reduction: see :mod:`calib.losses._reduction` ("sum" = B · L̄ = Σ_i CE_i + B·λ·MMCE, FOCAL-R's
"MMCE multiplied by the batch size").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch.nn import functional as F

from calib._config import check_fields, checked_field, in_range
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import scale_batch_mean

__all__ = ["MMCE", "MMCEConfig", "mmce_penalty"]

MMCEVariant = Literal["weighted", "unweighted"]


@dataclass(frozen=True, kw_only=True)
class MMCEConfig:
    """CE + λ·MMCE (``mmce``). Defaults: FOCAL-R ``--loss mmce_weighted --lamda 2.0``.

    Attributes:
        penalty_weight: λ, the weight of MMCE, >= 0 (2.0; BALCAL-R uses 1.5 weighted, 1.0 unweighted).
        variant: "weighted" (MMCE_w) or "unweighted" (MMCE_m) ("weighted").
        kernel_width: w of the Laplacian kernel exp(−|r − r'|/w), > 0 (0.4).
    """

    penalty_weight: float = checked_field(2.0, in_range(at_least=0))
    variant: MMCEVariant = "weighted"
    kernel_width: float = checked_field(0.4, in_range(above=0))

    def __post_init__(self) -> None:
        check_fields(self)


def _kernel(a: torch.Tensor, b: torch.Tensor, width: float) -> torch.Tensor:
    """The Laplacian kernel matrix exp(−|a_i − b_j| / width), shape (len(a), len(b))."""
    return torch.exp(-(a[:, None] - b[None, :]).abs() / width)


def mmce_penalty(
    logits: torch.Tensor, targets: torch.Tensor, *, variant: MMCEVariant = "weighted", kernel_width: float = 0.4
) -> torch.Tensor:
    """MMCE_w or MMCE_m of the batch (a scalar in the logits' dtype), as in the module docstring."""
    confidence, predicted = F.softmax(logits, dim=1).max(dim=1)
    correct = predicted == targets
    if variant == "unweighted":
        residual = correct.to(confidence.dtype) - confidence
        return (residual[:, None] * residual[None, :] * _kernel(confidence, confidence, kernel_width)).mean()
    m, n = int(correct.sum()), int((~correct).sum())
    if m == 0 or n == 0:
        return confidence.new_zeros(())
    r_c, r_i = confidence[correct], confidence[~correct]
    w_c, w_i = 1 - r_c, r_i
    correct_correct = (w_c[:, None] * w_c[None, :] * _kernel(r_c, r_c, kernel_width)).mean()
    incorrect_incorrect = (w_i[:, None] * w_i[None, :] * _kernel(r_i, r_i, kernel_width)).mean()
    correct_incorrect = (w_c[:, None] * w_i[None, :] * _kernel(r_c, r_i, kernel_width)).mean()
    squared = correct_correct / m**2 + incorrect_incorrect / n**2 - 2 * correct_incorrect / (m * n)
    return squared.clamp_min(1e-10).sqrt()


class MMCE(ConfiguredLoss):
    """mean CE + λ·MMCE (weighted or unweighted), reduced by ``reduction`` (see the module docstring)."""

    def __init__(self, penalty_weight: float = MMCEConfig.penalty_weight, variant: MMCEVariant = MMCEConfig.variant,
                 kernel_width: float = MMCEConfig.kernel_width, reduction: Reduction = "mean") -> None:
        super().__init__(MMCEConfig, locals())

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        ce = F.cross_entropy(logits, targets)
        penalty = mmce_penalty(logits, targets, variant=self.variant, kernel_width=self.kernel_width)
        return scale_batch_mean(ce + self.penalty_weight * penalty, logits.shape[0], self.reduction)


register_loss("mmce", MMCEConfig, MMCE, "CE + λ·MMCE, Laplacian-kernel calibration penalty (Kumar et al., ICML 2018)",
              label="MMCE", order=7)
