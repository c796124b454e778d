"""The batch-reduction convention shared by the training losses (docs/methods.md §4, "Global pitfall").

Every loss here defines its **batch-mean form** L̄: the per-sample loss averaged over the B samples
of the batch, with any batch-level regulariser (the MbLS/ACLS penalties, MMCE) written as in
docs/methods.md §4. Then

- ``reduction="mean"`` returns L̄ (the ACLS/FeDLaS protocol);
- ``reduction="sum"`` returns B · L̄ (the FOCAL-R protocol, which MaC-Cal uses: CE, FL and FLSD are
  summed over the batch and MMCE is multiplied by the batch size to match).

For a loss that is a mean of per-sample terms, B · L̄ is exactly the sum of those terms.
"""

from __future__ import annotations

import torch

from calib.losses._base import Reduction, check_reduction

__all__ = ["check_reduction", "reduce_per_sample", "scale_batch_mean"]


def reduce_per_sample(losses: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """The sum (``"sum"``) or mean (``"mean"``) of the per-sample ``losses`` of shape (B,)."""
    return losses.sum() if reduction == "sum" else losses.mean()


def scale_batch_mean(mean_loss: torch.Tensor, batch_size: int, reduction: Reduction) -> torch.Tensor:
    """``batch_size · mean_loss`` for ``"sum"``, ``mean_loss`` for ``"mean"``."""
    return mean_loss * batch_size if reduction == "sum" else mean_loss
