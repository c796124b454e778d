"""The device pipeline's per-batch transforms: random crop of the zero-padded image, horizontal flip,
scaling and normalisation, on whatever device the images are (the GPU in the device pipeline).

With the same draws (crop offsets and flips) these give exactly the tensors torchvision's
``RandomCrop(size, padding=p)``, ``RandomHorizontalFlip()``, ``ToTensor()`` and ``Normalize(mean, std)``
give one image at a time; the draws come from one ``torch.Generator`` per trial, on the CPU, with the
distribution torchvision draws from (offsets uniform in 0..2p, flip with probability 1/2).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from calib.datasets import Augmentation, TensorSplit

__all__ = ["AugmentationDraws", "apply_augmentation", "draw_augmentation", "to_model_input"]


class AugmentationDraws:
    """Per-image random draws of a batch: crop offsets (top, left) into the padded image, and flips."""

    def __init__(self, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor) -> None:
        self.top, self.left, self.flip = top, left, flip


def draw_augmentation(augmentation: Augmentation, batch: int, generator: torch.Generator) -> AugmentationDraws:
    """The draws of one batch: offsets uniform in 0..2p (torchvision's ``randint(0, h − th + 1)`` on the
    padded image), flips with probability 1/2."""
    span = 2 * augmentation.crop_padding + 1
    top = torch.randint(0, span, (batch,), generator=generator)
    left = torch.randint(0, span, (batch,), generator=generator)
    flip = (torch.rand(batch, generator=generator) < 0.5) if augmentation.horizontal_flip else torch.zeros(
        batch, dtype=torch.bool)
    return AugmentationDraws(top, left, flip)


def apply_augmentation(images: torch.Tensor, augmentation: Augmentation, draws: AugmentationDraws) -> torch.Tensor:
    """Crop each image of ``images`` (N, C, H, W, any dtype) at its offsets in the image zero-padded by
    ``crop_padding``, then mirror the ones drawn to flip; same shape and dtype out."""
    n, _, height, width = images.shape
    pad = augmentation.crop_padding
    device = images.device
    if pad:
        padded = F.pad(images, (pad, pad, pad, pad))  # zeros, as RandomCrop's default fill
        rows = draws.top.to(device)[:, None] + torch.arange(height, device=device)[None, :]  # (N, H)
        cols = draws.left.to(device)[:, None] + torch.arange(width, device=device)[None, :]  # (N, W)
        batch = torch.arange(n, device=device)[:, None, None]
        # advanced indexing on (N, H+2p, W+2p, C): out[i, y, x] = padded[i, rows[i, y], cols[i, x]]
        images = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    if augmentation.horizontal_flip:
        flip = draws.flip.to(device)
        images = torch.where(flip[:, None, None, None], images.flip(-1), images)
    return images


def to_model_input(images: torch.Tensor, split: TensorSplit) -> torch.Tensor:
    """uint8 pixels as ``ToTensor`` then ``Normalize`` make them: x / 255, then (x − mean) / std per
    channel, in float32 (the same operations in the same order, so the same bits); float images are
    taken as they are."""
    if images.dtype != torch.uint8:
        return images.float()
    x = images.float().div(255)
    if split.mean is None:
        return x
    mean = torch.as_tensor(split.mean, dtype=torch.float32, device=x.device)[None, :, None, None]
    std = torch.as_tensor(split.std, dtype=torch.float32, device=x.device)[None, :, None, None]
    return x.sub(mean).div(std)
