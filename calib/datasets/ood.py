"""Out-of-distribution evaluation sets (docs/methods.md §6.7, §8): images in the in-distribution's input format.

Each set is the *test* split of another dataset, transformed with the in-distribution's evaluation
transform (CIFAR statistics for CIFAR-10/100 in-distribution), every sample labelled 0 (labels are
irrelevant: all are OOD). ``natural-patches`` is the offline OOD set of the digits: 8×8 grayscale
patches of scikit-learn's bundled sample photographs, with the same additive noise as
``digits-noisy`` when that is the in-distribution.

For ``fashion-mnist`` both OOD sets are offline, 28×28 gray images made uint8 0..255 (rounded), then
normalised as Fashion-MNIST's evaluation transform does: ``digits``, the scikit-learn digits' test split
(the 630 images of the ``digits`` dataset's split) upsampled bilinearly from 8×8, and
``natural-patches`` cut at 28×28 by the 8×8 patches' recipe (crops 4 times the size, pooled 4×4).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from calib.datasets import cifar, digits, fashion_mnist
from calib.datasets._base import DatasetNotFoundError
from calib.registries import OOD_SETS

__all__ = ["DEFAULT_OOD", "OOD_SETS", "OODSet", "load_ood"]


@dataclass(frozen=True)
class OODSet:
    """``load(root, download, in_distribution)`` returns the OOD images; ``compatible`` lists the
    in-distribution datasets whose input format it can take; ``require(root)`` checks the files."""

    load: Callable[[str, bool, str], Dataset]
    require: Callable[[str], None]
    compatible: tuple[str, ...]
    description: str


# The OOD sets each in-distribution dataset is evaluated against (MaC-Cal Table 2; FeDLaS Table 3).
DEFAULT_OOD: dict[str, tuple[str, ...]] = {
    "cifar10": ("cifar100", "svhn"),
    "cifar100": ("cifar10", "svhn"),
    "digits": ("natural-patches",),
    "digits-noisy": ("natural-patches",),
    "fashion-mnist": ("digits", "natural-patches"),
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
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision.datasets import SVHN

    test = SVHN(root, split="test", transform=cifar.cifar_eval_transform(), download=download)
    return _Unlabelled(test)


def _cifar_test(dataset_name: str, require: Callable[[str], None]) -> Callable[[str, bool, str], Dataset]:
    def load(root: str, download: bool, in_distribution: str) -> Dataset:
        # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
        import torchvision.datasets

        if not download:
            require(root)
        dataset_cls = getattr(torchvision.datasets, dataset_name)
        return _Unlabelled(dataset_cls(root, train=False, transform=cifar.cifar_eval_transform(), download=download))

    return load


NUM_PATCHES = 630
"""As many patches as the digits test split has images."""
NUM_FASHION_PATCHES = 10_000
"""The 28×28 patches for ``fashion-mnist``: as many as its test split has images."""
PATCH_SEED = 4321
POOL = 4
"""Patches are crops of ``POOL`` times their side, average-pooled ``POOL``×``POOL``."""
FASHION_SIDE = fashion_mnist.INPUT_SHAPE[-1]


def natural_patches(noisy: bool, side: int = 8, count: int = NUM_PATCHES) -> np.ndarray:
    """(count, 1, side, side) float32 patches in [0, 1] (plus digits-noisy's noise when ``noisy``).

    Random (4·side)×(4·side) crops (32×32 for the digits) of scikit-learn's two sample photographs,
    alternating, converted to gray, average-pooled 4×4 to side×side, scaled to [0, 1] per patch so
    their contrast matches the digits'. Seeded (:data:`PATCH_SEED`): fixed images.
    """
    # lazy: scikit-learn takes a second or more to import
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(PATCH_SEED)
    photos = [img.mean(axis=2) for img in load_sample_images().images]
    crop_side = POOL * side
    patches = np.empty((count, side, side))
    for i in range(count):
        photo = photos[i % len(photos)]
        top, left = rng.integers(0, photo.shape[0] - crop_side), rng.integers(0, photo.shape[1] - crop_side)
        crop = photo[top:top + crop_side, left:left + crop_side].reshape(side, POOL, side, POOL).mean(axis=(1, 3))
        low, high = crop.min(), crop.max()
        patches[i] = (crop - low) / (high - low) if high > low else np.zeros_like(crop)
    if noisy:
        patches += rng.normal(0.0, digits.NOISE_STD, size=patches.shape)
    return patches[:, None].astype(np.float32)


def upsampled_digits() -> np.ndarray:
    """The clean digits' test split (630 images, the ``digits`` dataset's) as (630, 1, 28, 28) float64 in
    [0, 1]: pixels / 16, upsampled bilinearly (``F.interpolate``, half-pixel centres) from 8×8."""
    images, labels = digits.digits_arrays()
    _, _, test_idx = digits.digits_split_indices(labels)
    small = torch.from_numpy(images[test_idx]).double()
    side = (FASHION_SIDE, FASHION_SIDE)
    return F.interpolate(small, size=side, mode="bilinear", align_corners=False).numpy()


def fashion_mnist_input(images: np.ndarray) -> torch.Tensor:
    """Images in [0, 1] as Fashion-MNIST's evaluation transform gives them: rounded to uint8 0..255, then
    x / 255 and (x − mean) / std in float32 (the operations of ``ToTensor`` and ``Normalize``)."""
    pixels = torch.from_numpy(np.rint(np.clip(images, 0.0, 1.0) * 255).astype(np.uint8))
    mean, std = fashion_mnist.FASHION_MNIST_MEAN[0], fashion_mnist.FASHION_MNIST_STD[0]
    return pixels.float().div(255).sub(torch.tensor(mean)).div(torch.tensor(std))


def _unlabelled_tensors(images: torch.Tensor) -> Dataset:
    return TensorDataset(images, torch.zeros(len(images), dtype=torch.long))


def _load_patches(root: str, download: bool, in_distribution: str) -> Dataset:
    if in_distribution == "fashion-mnist":
        patches = natural_patches(noisy=False, side=FASHION_SIDE, count=NUM_FASHION_PATCHES)
        return _unlabelled_tensors(fashion_mnist_input(patches))
    return _unlabelled_tensors(torch.from_numpy(natural_patches(noisy=in_distribution == "digits-noisy")))


def _load_digits(root: str, download: bool, in_distribution: str) -> Dataset:
    return _unlabelled_tensors(fashion_mnist_input(upsampled_digits()))


OOD_SETS.register("svhn")(OODSet(_load_svhn, _require_svhn, CIFAR_LIKE,
                                 "SVHN test split (26,032 images), CIFAR normalisation"))
OOD_SETS.register("cifar10")(OODSet(_cifar_test("CIFAR10", cifar.require_cifar10), cifar.require_cifar10,
                                    ("cifar100",), "CIFAR-10 test split"))
OOD_SETS.register("cifar100")(OODSet(_cifar_test("CIFAR100", cifar.require_cifar100),
                                     cifar.require_cifar100, ("cifar10",), "CIFAR-100 test split"))
OOD_SETS.register("natural-patches")(OODSet(_load_patches, lambda root: None,
                                            ("digits", "digits-noisy", "fashion-mnist"),
                                            "gray patches of scikit-learn's sample photographs: 8×8 for the "
                                            "digits, 28×28 for fashion-mnist"))
OOD_SETS.register("digits")(OODSet(_load_digits, lambda root: None, ("fashion-mnist",),
                                   "scikit-learn digits' test split (630), upsampled to 28×28"))


def load_ood(name: str, root: str, download: bool, in_distribution: str) -> Dataset:
    """The OOD set ``name`` in the input format of ``in_distribution`` (one of its ``compatible``)."""
    ood_set = OOD_SETS.get(name)
    if in_distribution not in ood_set.compatible:
        raise ValueError(f"OOD set {name!r} fits the in-distribution datasets {', '.join(ood_set.compatible)}, "
                         f"got in_distribution={in_distribution!r}.")
    return ood_set.load(root, download, in_distribution)
