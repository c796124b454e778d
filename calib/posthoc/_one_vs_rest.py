"""What the one-vs-rest calibrators share (docs/methods.md §5.8): the checked softmax scores of new logits."""

from __future__ import annotations

import numpy as np
import torch

from calib.metrics import softmax64
from calib.posthoc._base import check_logits

__all__ = ["checked_softmax"]


def checked_softmax(logits: torch.Tensor, num_classes: int) -> np.ndarray:
    """softmax(z) (N, C) in float64 of new logits, after checking them and that C is the fit's ``num_classes``."""
    z = check_logits(logits)
    if z.shape[1] != num_classes:
        raise ValueError(f"`logits` must have the {num_classes} classes of the fit, got {z.shape[1]}.")
    return softmax64(z.cpu())
