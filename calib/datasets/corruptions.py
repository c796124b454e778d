"""Corrupted test sets in the CIFAR-10-C / CIFAR-100-C layout (Hendrycks & Dietterich, ICLR 2019; docs/methods.md §8).

Layout: one directory holding ``labels.npy`` (the test labels tiled 5 times) and one
``<corruption>.npy`` per corruption, uint8 of shape (5·N, H, W, C), rows [(s−1)·N, s·N) holding
severity s = 1..5. :func:`load_corrupted` reads that layout for every dataset: CIFAR-10-C and
CIFAR-100-C as published, and ``digits-C``, which :func:`generate_corrupted` writes from the clean
digits test split (``digits-noisy`` then adds its own fixed test noise, the noise being part of that
dataset). The generator implements the corruptions that are defined on 8×8 gray images
(:data:`GENERATED`); the loader accepts all 19 names.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from scipy import ndimage
from torch.utils.data import Dataset, TensorDataset

from calib.datasets import cifar, digits
from calib.datasets._base import DatasetNotFoundError

__all__ = [
    "CORRUPTIONS",
    "C_DIRECTORY",
    "GENERATED",
    "SEVERITIES",
    "ensure_digits_c",
    "generate_corrupted",
    "load_corrupted",
]

CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise",
    "defocus_blur", "glass_blur", "motion_blur", "zoom_blur", "gaussian_blur",
    "snow", "frost", "fog", "brightness", "spatter",
    "contrast", "elastic_transform", "pixelate", "jpeg_compression", "saturate",
)
SEVERITIES = (1, 2, 3, 4, 5)
C_DIRECTORY = {"cifar10": "CIFAR-10-C", "cifar100": "CIFAR-100-C", "digits": "digits-C", "digits-noisy": "digits-C"}


def _gaussian_noise(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    return x + rng.normal(0.0, (0.04, 0.06, 0.08, 0.09, 0.10)[s - 1], x.shape)


def _shot_noise(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    photons = (500, 250, 100, 75, 50)[s - 1]
    return rng.poisson(x * photons) / photons


def _impulse_noise(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    amount = (0.01, 0.02, 0.03, 0.05, 0.07)[s - 1]
    out = x.copy()
    hit = rng.random(x.shape) < amount
    out[hit] = rng.integers(0, 2, hit.sum()).astype(x.dtype)  # salt or pepper
    return out


def _speckle_noise(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    return x + x * rng.normal(0.0, (0.06, 0.1, 0.12, 0.16, 0.2)[s - 1], x.shape)


def _gaussian_blur(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    sigma = (0.4, 0.6, 0.7, 0.8, 1.0)[s - 1]
    return ndimage.gaussian_filter(x, sigma=(0, sigma, sigma, 0))


def _defocus_blur(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    radius, alias_sigma = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1))[s - 1]
    half = max(1, int(np.ceil(radius)))
    yy, xx = np.mgrid[-half:half + 1, -half:half + 1]
    disk = ((xx**2 + yy**2) <= radius**2).astype(np.float64)
    disk = ndimage.gaussian_filter(disk / disk.sum(), alias_sigma)
    return ndimage.convolve(x, disk[None, :, :, None] / disk.sum(), mode="reflect")


def _contrast(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    factor = (0.75, 0.5, 0.4, 0.3, 0.15)[s - 1]
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    return (x - mean) * factor + mean


def _brightness(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    return x + (0.05, 0.1, 0.15, 0.2, 0.3)[s - 1]  # the V channel of a gray image is the image


def _pil_each(x: np.ndarray, fn: Callable[[Image.Image], Image.Image]) -> np.ndarray:
    out = np.empty_like(x)
    for i, img in enumerate(x):
        gray = img.shape[-1] == 1
        pil = Image.fromarray(np.uint8(np.clip(img, 0, 1) * 255).squeeze(-1) if gray
                              else np.uint8(np.clip(img, 0, 1) * 255))
        arr = np.asarray(fn(pil), dtype=np.float64) / 255
        out[i] = arr[..., None] if gray else arr
    return out


def _pixelate(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    factor = (0.95, 0.9, 0.85, 0.75, 0.65)[s - 1]
    h, w = x.shape[1:3]
    small = (max(1, int(w * factor)), max(1, int(h * factor)))
    return _pil_each(x, lambda im: im.resize(small, Image.BOX).resize((w, h), Image.BOX))


def _jpeg(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    quality = (80, 65, 58, 50, 40)[s - 1]

    def compress(im: Image.Image) -> Image.Image:
        buffer = io.BytesIO()
        im.save(buffer, "JPEG", quality=quality)
        return Image.open(buffer).copy()

    return _pil_each(x, compress)


GENERATED: dict[str, Callable[[np.ndarray, int, np.random.Generator], np.ndarray]] = {
    "gaussian_noise": _gaussian_noise, "shot_noise": _shot_noise, "impulse_noise": _impulse_noise,
    "speckle_noise": _speckle_noise, "gaussian_blur": _gaussian_blur, "defocus_blur": _defocus_blur,
    "contrast": _contrast, "brightness": _brightness, "pixelate": _pixelate, "jpeg_compression": _jpeg,
}
"""Corruptions :func:`generate_corrupted` implements, with the CIFAR-10-C severity parameters. The
other nine need photographic assets (frost, snow, spatter), colour (saturate) or more pixels than
8×8 (glass, motion, zoom blur, elastic, fog) and come only from the published CIFAR-C files."""


def _atomic_save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


def generate_corrupted(images: np.ndarray, labels: np.ndarray, directory: str | os.PathLike,
                       corruptions: tuple[str, ...] = tuple(GENERATED), seed: int = 0) -> Path:
    """Write ``images`` (N, H, W, C) in [0, 1] corrupted at 5 severities, in the CIFAR-C layout.

    Each file is written to a temporary name and renamed, so a reader sees whole files only.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in corruptions:
        if name not in GENERATED:
            raise ValueError(f"cannot generate corruption {name!r}; generated: {', '.join(GENERATED)}.")
        rng = np.random.default_rng([seed, CORRUPTIONS.index(name)])
        stack = [np.clip(GENERATED[name](images.astype(np.float64), s, rng), 0, 1) for s in SEVERITIES]
        _atomic_save(directory / f"{name}.npy", np.uint8(np.round(np.concatenate(stack) * 255)))
    _atomic_save(directory / "labels.npy", np.tile(labels.astype(np.int64), len(SEVERITIES)))
    return directory


def ensure_digits_c(data_root: str | os.PathLike) -> Path:
    """``<data_root>/digits-C``: the clean digits test split corrupted, generated when missing."""
    directory = Path(data_root) / C_DIRECTORY["digits"]
    if not all((directory / f"{n}.npy").exists() for n in GENERATED) or not (directory / "labels.npy").exists():
        images, labels = digits.digits_arrays()
        test = digits.digits_split_indices(labels)[2]
        generate_corrupted(images[test].transpose(0, 2, 3, 1), labels[test], directory)
    return directory


def load_corrupted(root: str, dataset: str, corruption: str, severity: int) -> Dataset:
    """The test split of ``dataset`` under ``corruption`` at ``severity`` from ``<root>/<C directory>``,
    transformed as the in-distribution test set (labels kept)."""
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; valid: {', '.join(CORRUPTIONS)}.")
    if severity not in SEVERITIES:
        raise ValueError(f"`severity` must be one of 1..5, got severity={severity}.")
    directory = Path(root).resolve() / C_DIRECTORY[dataset]
    path = directory / f"{corruption}.npy"
    if not path.exists() or not (directory / "labels.npy").exists():
        raise DatasetNotFoundError(
            f"{C_DIRECTORY[dataset]} not found: expected {path} and {directory / 'labels.npy'} (one .npy per "
            f"corruption, 5 severities, as published on Zenodo); extract the archive into {Path(root).resolve()}."
        )
    data = np.load(path, mmap_mode="r")
    n = data.shape[0] // len(SEVERITIES)
    rows = slice((severity - 1) * n, severity * n)
    images = np.array(data[rows])  # a writable copy of the memory-mapped rows
    labels = torch.from_numpy(np.load(directory / "labels.npy")[rows].astype(np.int64))
    if dataset in ("digits", "digits-noisy"):
        x = torch.from_numpy(images.astype(np.float32) / 255).permute(0, 3, 1, 2)
        if dataset == "digits-noisy":
            all_images, all_labels = digits.digits_arrays()
            noise = np.random.default_rng(digits.NOISE_SEED).normal(0.0, digits.NOISE_STD, size=all_images.shape)
            x = x + torch.from_numpy(noise[digits.digits_split_indices(all_labels)[2]].astype(np.float32))
        return TensorDataset(x, labels)
    transform = cifar.cifar_eval_transform()
    return TensorDataset(torch.stack([transform(img) for img in images]), labels)
