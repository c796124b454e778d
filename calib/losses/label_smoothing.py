"""Label smoothing (Szegedy et al., CVPR 2016; as a calibration baseline: Müller et al., NeurIPS 2019).

docs/methods.md §4.1.

With p = softmax(z), C classes, CE_i = −log p_{i,y_i} and E_i = −(1/C) Σ_k log p_{i,k} (the
cross-entropy to the uniform distribution), the per-sample loss is

    LS_i = (1 − α)·CE_i + α·E_i,

the cross-entropy to the smoothed target (1 − α)·onehot(y) + α/C. Batch reduction: see
:mod:`calib.losses._reduction` ("mean" = mean_i LS_i, "sum" = Σ_i LS_i).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from calib._config import check_fields, checked_field, in_range
from calib.losses._base import ConfiguredLoss, Reduction, register_loss
from calib.losses._reduction import reduce_per_sample

__all__ = ["LabelSmoothing", "LabelSmoothingConfig"]


@dataclass(frozen=True, kw_only=True)
class LabelSmoothingConfig:
    """Label smoothing (``label_smoothing``).

    Attributes:
        smoothing: α, the weight of the uniform target, in [0, 1) (0.05, the FOCAL-R/BALCAL-R value;
            the FeDLaS paper uses 0.1 on CIFAR-100). α = 0 is cross-entropy.
    """

    smoothing: float = checked_field(0.05, in_range(at_least=0, below=1))

    def __post_init__(self) -> None:
        check_fields(self)


class LabelSmoothing(ConfiguredLoss):
    """LS_i = (1 − α)·CE_i + α·E_i, reduced over the batch by ``reduction`` (see the module docstring)."""

    def __init__(self, smoothing: float = LabelSmoothingConfig.smoothing, reduction: Reduction = "mean") -> None:
        super().__init__(LabelSmoothingConfig, locals())

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        log_probs = F.log_softmax(logits, dim=1)
        ce = -log_probs.gather(1, targets[:, None]).squeeze(1)
        uniform = -log_probs.mean(dim=1)
        return reduce_per_sample((1 - self.smoothing) * ce + self.smoothing * uniform, self.reduction)


register_loss("label_smoothing", LabelSmoothingConfig, LabelSmoothing,
              "label smoothing: (1 − α)·CE + α·CE to the uniform distribution", label="LS", order=1)
