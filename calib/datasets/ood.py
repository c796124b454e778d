"""Out-of-distribution evaluation sets (docs/methods.md §6.7, §8): images in the in-distribution's input format.

Each set is the *test* split of another dataset, transformed with the in-distribution's evaluation
transform (CIFAR statistics for CIFAR-10/100 in-distribution), every sample labelled 0 (labels are
irrelevant: all are OOD). ``natural-patches`` is the offline OOD set of the digits: 8×8 grayscale
patches of scikit-learn's bundled sample photographs, with the same additive noise as
``digits-noisy`` when that is the in-distribution.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from calib._registry import Registry
from calib.datasets import cifar, digits
from calib.datasets._base import DatasetNotFoundError

__all__ = ["DEFAULT_OOD", "OOD_SETS", "OODSet", "load_ood"]


@dataclass(frozen=True)
class OODSet:
    """``load(root, download, in_distribution)`` returns the OOD images; ``compatible`` lists the
    in-distribution datasets whose input format it can take; ``require(root)`` checks the files."""

    load: Callable[[str, bool, str], Dataset]
    require: Callable[[str], None]
    compatible: tuple[str, ...]
    description: str


OOD_SETS: Registry[OODSet] = Registry("OOD dataset")

# The OOD sets each in-distribution dataset is evaluated against (MaC-Cal Table 2; FeDLaS Table 3).
DEFAULT_OOD: dict[str, tuple[str, ...]] = {
    "cifar10": ("cifar100", "svhn"),
    "cifar100": ("cifar10", "svhn"),
    "digits": ("natural-patches",),
    "digits-noisy": ("natural-patches",),
}
CIFAR_LIKE = ("cifar10", "cifar100")


class _Unlabelled(Dataset):
    """Images of ``base`` with every label replaced by 0."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.base[index][0], 0


def _require_svhn(root: str) -> None:
    path = os.path.join(os.path.abspath(root), "test_32x32.mat")
    if not os.path.isfile(path):
        raise DatasetNotFoundError(
            f"SVHN not found: expected the file {path} (torchvision's SVHN test split). Pass --download to "
            f"fetch it into {os.path.abspath(root)}, or point --data-root at the directory that holds it."
        )


def _load_svhn(root: str, download: bool, in_distribution: str) -> Dataset:
    if not download:
        _require_svhn(root)
    from torchvision.datasets import SVHN

    test = SVHN(root, split="test", transform=cifar.cifar_eval_transform(), download=download)
    return _Unlabelled(test)


def _cifar_test(dataset_name: str, require: Callable[[str], None]) -> Callable[[str, bool, str], Dataset]:
    def load(root: str, download: bool, in_distribution: str) -> Dataset:
        import torchvision.datasets

        if not download:
            require(root)
        dataset_cls = getattr(torchvision.datasets, dataset_name)
        return _Unlabelled(dataset_cls(root, train=False, transform=cifar.cifar_eval_transform(), download=download))

    return load


NUM_PATCHES = 630
"""As many patches as the digits test split has images."""
PATCH_SEED = 4321


def natural_patches(noisy: bool) -> np.ndarray:
    """(NUM_PATCHES, 1, 8, 8) float32 patches in [0, 1] (plus digits-noisy's noise when ``noisy``).

    Random 32×32 crops of scikit-learn's two sample photographs, converted to gray, average-pooled
    4×4 to 8×8, scaled to [0, 1] per patch so their contrast matches the digits'. Seeded: fixed images.
    """
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(PATCH_SEED)
    photos = [img.mean(axis=2) for img in load_sample_images().images]
    patches = np.empty((NUM_PATCHES, 8, 8))
    for i in range(NUM_PATCHES):
        photo = photos[i % len(photos)]
        top, left = rng.integers(0, photo.shape[0] - 32), rng.integers(0, photo.shape[1] - 32)
        crop = photo[top:top + 32, left:left + 32].reshape(8, 4, 8, 4).mean(axis=(1, 3))
        low, high = crop.min(), crop.max()
        patches[i] = (crop - low) / (high - low) if high > low else np.zeros_like(crop)
    if noisy:
        patches += rng.normal(0.0, digits.NOISE_STD, size=patches.shape)
    return patches[:, None].astype(np.float32)


def _load_patches(root: str, download: bool, in_distribution: str) -> Dataset:
    images = torch.from_numpy(natural_patches(noisy=in_distribution == "digits-noisy"))
    return TensorDataset(images, torch.zeros(len(images), dtype=torch.long))


OOD_SETS.register("svhn")(OODSet(_load_svhn, _require_svhn, CIFAR_LIKE,
                                 "SVHN test split (26,032 images), CIFAR normalisation"))
OOD_SETS.register("cifar10")(OODSet(_cifar_test("CIFAR10", cifar.require_cifar10), cifar.require_cifar10,
                                    ("cifar100",), "CIFAR-10 test split"))
OOD_SETS.register("cifar100")(OODSet(_cifar_test("CIFAR100", cifar.require_cifar100),
                                     cifar.require_cifar100, ("cifar10",), "CIFAR-100 test split"))
OOD_SETS.register("natural-patches")(OODSet(_load_patches, lambda root: None, ("digits", "digits-noisy"),
                                            "8×8 gray patches of scikit-learn's sample photographs"))


def load_ood(name: str, root: str, download: bool, in_distribution: str) -> Dataset:
    """The OOD set ``name`` in the input format of ``in_distribution``."""
    return OOD_SETS.get(name).load(root, download, in_distribution)
