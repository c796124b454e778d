"""CIFAR-10 and CIFAR-100 through torchvision, with the FOCAL-R protocol (docs/methods.md §7.2, §8).

- Split: the 50,000 training images give 45,000 train and 5,000 validation images. Indices
  0..49,999 are shuffled with ``np.random.RandomState(1).shuffle`` (FOCAL-R: NumPy seed 1,
  ``valid_size=0.1``); validation is the *first* 5,000 shuffled indices, train the rest, as in
  FOCAL-R's ``Data/cifar10.py``. The split does not depend on the trial seed.
- ``train``: RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor, Normalize.
  ``train_eval``, ``val``, ``test``: ToTensor, Normalize.
- Normalize uses mean (0.4914, 0.4822, 0.4465), std (0.2023, 0.1994, 0.2010) for both datasets.
  ``load_cifar100(..., test_norm="focal_bug")`` reproduces FOCAL-R's CIFAR-100 test loader, which
  normalises the test split (only) with the ImageNet statistics.
- ``tensors`` (built on first read): the same splits as uint8 (N, 3, 32, 32) tensors with each split's
  mean and std, taken from the datasets' arrays in memory (the files are not read again);
  augmentation: crop padding 4, horizontal flip.

The files are torchvision's "python version": ``<root>/cifar-10-batches-py`` and
``<root>/cifar-100-python``. torchvision is imported when a loader runs, not with this module: it
takes seconds, and every study process (and every Ray worker) imports the dataset registry.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

if TYPE_CHECKING:
    from torchvision import datasets as tv_datasets
    from torchvision import transforms

from calib.datasets import DATASETS
from calib.datasets._base import Augmentation, DatasetInfo, DatasetNotFoundError, DatasetSplits, TensorData, TensorSplit

__all__ = [
    "AUGMENTATION",
    "CIFAR10_FOLDER",
    "CIFAR100_FOLDER",
    "CIFAR_MEAN",
    "CIFAR_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "INPUT_SHAPE",
    "SPLIT_SEED",
    "VAL_SIZE",
    "TestNorm",
    "cifar_eval_transform",
    "cifar_splits",
    "cifar_tensor_data",
    "cifar_train_transform",
    "focal_split_indices",
    "load_cifar10",
    "load_cifar100",
    "require_cifar10",
    "require_cifar100",
]

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2023, 0.1994, 0.2010)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
"""Used only by ``test_norm="focal_bug"`` (FOCAL-R's CIFAR-100 test loader)."""
IMAGENET_STD = (0.229, 0.224, 0.225)

INPUT_SHAPE = (3, 32, 32)
VAL_SIZE = 5000
"""Validation images held out of the 50,000 training images (FOCAL-R ``valid_size=0.1``)."""
SPLIT_SEED = 1
"""Seed of ``np.random.RandomState`` shuffling the training indices (FOCAL-R ``random_seed=1``)."""

TestNorm = Literal["cifar", "focal_bug"]

AUGMENTATION = Augmentation(crop_padding=4, horizontal_flip=True)
"""What :func:`cifar_train_transform` adds, as the device pipeline applies it."""

CIFAR10_FOLDER = "cifar-10-batches-py"  # torchvision's CIFAR10.base_folder
CIFAR100_FOLDER = "cifar-100-python"  # torchvision's CIFAR100.base_folder


def cifar_train_transform(
    mean: tuple[float, float, float] = CIFAR_MEAN, std: tuple[float, float, float] = CIFAR_STD
) -> transforms.Compose:
    """Training augmentation: random 32×32 crop of the 4-pixel zero-padded image, horizontal flip."""
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ]
    )


def cifar_eval_transform(
    mean: tuple[float, float, float] = CIFAR_MEAN, std: tuple[float, float, float] = CIFAR_STD
) -> transforms.Compose:
    """Evaluation transform: ToTensor (pixels / 255) then per-channel (x − mean) / std."""
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision import transforms

    return transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])


def focal_split_indices(
    num_train: int, val_size: int = VAL_SIZE, seed: int = SPLIT_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """FOCAL-R's (train, validation) indices: shuffle 0..num_train−1, validation = first ``val_size``.

    ``np.random.RandomState(seed).shuffle`` draws exactly what FOCAL-R's ``np.random.seed(seed)``
    followed by ``np.random.shuffle(list(range(num_train)))`` draws.
    """
    if not 1 <= val_size < num_train:
        raise ValueError(
            f"`val_size` must be in [1, {num_train}) for {num_train} training images, "
            f"got val_size={val_size}."
        )
    indices = np.arange(num_train)
    np.random.RandomState(seed).shuffle(indices)
    return indices[val_size:], indices[:val_size]


def _require(root: str, folder: str, title: str) -> None:
    abs_root = os.path.abspath(root)
    expected = os.path.join(abs_root, folder)
    if not os.path.isdir(expected):
        raise DatasetNotFoundError(
            f"{title} not found: expected the directory {expected} (the python version of {title}). "
            f"Pass --download to fetch it into {abs_root}, or point --data-root at the directory "
            f"that holds {folder}."
        )


def require_cifar10(root: str) -> None:
    """Raise :class:`DatasetNotFoundError` unless ``<root>/cifar-10-batches-py`` exists."""
    _require(root, CIFAR10_FOLDER, "CIFAR-10")


def require_cifar100(root: str) -> None:
    """Raise :class:`DatasetNotFoundError` unless ``<root>/cifar-100-python`` exists."""
    _require(root, CIFAR100_FOLDER, "CIFAR-100")


def cifar_tensor_data(
    train_images: np.ndarray,
    train_labels: Sequence[int],
    train_idx: np.ndarray,
    val_idx: np.ndarray,
    test_images: np.ndarray,
    test_labels: Sequence[int],
    test_mean: tuple[float, float, float] = CIFAR_MEAN,
    test_std: tuple[float, float, float] = CIFAR_STD,
) -> TensorData:
    """The tensor view of CIFAR-style splits: ``train_images`` / ``test_images`` are uint8 (N, 32, 32, 3)
    arrays (torchvision's ``CIFAR10.data``), the labels lists of ints; train and validation are the
    rows ``train_idx`` and ``val_idx`` of the training arrays, normalised with the CIFAR statistics,
    test is every test row, normalised with ``test_mean`` / ``test_std``. The images are copied into
    (N, 3, 32, 32) tensors."""

    def split(images: np.ndarray, labels: Sequence[int], indices: np.ndarray,
              mean: tuple[float, ...], std: tuple[float, ...]) -> TensorSplit:
        rows = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        chw = torch.from_numpy(images).permute(0, 3, 1, 2)
        return TensorSplit(
            images=chw[rows].contiguous(),
            labels=torch.as_tensor(np.asarray(labels, dtype=np.int64))[rows],
            mean=tuple(mean),
            std=tuple(std),
        )

    return TensorData(
        train=split(train_images, train_labels, train_idx, CIFAR_MEAN, CIFAR_STD),
        val=split(train_images, train_labels, val_idx, CIFAR_MEAN, CIFAR_STD),
        test=split(test_images, test_labels, np.arange(len(test_images)), test_mean, test_std),
        augmentation=AUGMENTATION,
    )


def cifar_splits(
    train_augmented: Dataset,
    train_plain: Dataset,
    test: Dataset,
    *,
    val_size: int,
    num_classes: int,
    test_mean: tuple[float, float, float] = CIFAR_MEAN,
    test_std: tuple[float, float, float] = CIFAR_STD,
) -> DatasetSplits:
    """The FOCAL-R splits of CIFAR-style datasets: ``train_augmented`` and ``train_plain`` hold the same
    training images (``.data`` uint8 (N, 32, 32, 3), ``.targets``) with the training and the evaluation
    transform, ``test`` the test images with the test transform; ``tensors`` are built from
    ``train_plain``'s and ``test``'s arrays on first read (:func:`cifar_tensor_data`)."""
    train_idx, val_idx = focal_split_indices(len(train_plain), val_size=val_size)
    train_arrays = (train_plain.data, train_plain.targets)  # type: ignore[attr-defined]
    test_arrays = (test.data, test.targets)  # type: ignore[attr-defined]
    return DatasetSplits(
        train=Subset(train_augmented, train_idx.tolist()),
        train_eval=Subset(train_plain, train_idx.tolist()),
        val=Subset(train_plain, val_idx.tolist()),
        test=test,
        num_classes=num_classes,
        input_shape=INPUT_SHAPE,
        tensor_loader=partial(cifar_tensor_data, *train_arrays, train_idx, val_idx, *test_arrays, test_mean, test_std),
    )


def _load_cifar(
    dataset_cls: type[tv_datasets.CIFAR10],
    root: str,
    download: bool,
    val_size: int,
    num_classes: int,
    test_mean: tuple[float, float, float] = CIFAR_MEAN,
    test_std: tuple[float, float, float] = CIFAR_STD,
) -> DatasetSplits:
    # Two instances over the same files: one with the augmentation, one with the eval transform.
    train_augmented = dataset_cls(root, train=True, transform=cifar_train_transform(), download=download)
    train_plain = dataset_cls(root, train=True, transform=cifar_eval_transform(), download=False)
    test = dataset_cls(root, train=False, transform=cifar_eval_transform(test_mean, test_std), download=False)
    return cifar_splits(train_augmented, train_plain, test, val_size=val_size, num_classes=num_classes,
                        test_mean=test_mean, test_std=test_std)


def load_cifar10(root: str, download: bool = False, *, val_size: int = VAL_SIZE) -> DatasetSplits:
    """CIFAR-10 split 45,000 / 5,000 / 10,000 (train / validation / test) as in FOCAL-R.

    Args:
        root: directory holding ``cifar-10-batches-py``.
        download: fetch the archive into ``root`` when missing; otherwise a missing directory raises
            :class:`DatasetNotFoundError`.
        val_size: validation images taken from the training set (5,000 in the protocol).
    """
    if not download:
        require_cifar10(root)
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision.datasets import CIFAR10

    return _load_cifar(CIFAR10, root, download, val_size, 10)


def load_cifar100(
    root: str, download: bool = False, *, val_size: int = VAL_SIZE, test_norm: TestNorm = "cifar"
) -> DatasetSplits:
    """CIFAR-100 split 45,000 / 5,000 / 10,000 (train / validation / test) as in FOCAL-R.

    Args:
        root: directory holding ``cifar-100-python``.
        download: fetch the archive into ``root`` when missing; otherwise a missing directory raises
            :class:`DatasetNotFoundError`.
        val_size: validation images taken from the training set (5,000 in the protocol).
        test_norm: ``"cifar"`` normalises every split with the CIFAR statistics; ``"focal_bug"``
            normalises the test split with the ImageNet statistics, as FOCAL-R's
            ``Data/cifar100.py`` does (docs/methods.md §7.2 pitfall), and the other splits as usual.
    """
    allowed = get_args(TestNorm)
    if test_norm not in allowed:
        raise ValueError(f"`test_norm` must be one of {list(allowed)}, got test_norm={test_norm!r}.")
    if not download:
        require_cifar100(root)
    test_mean, test_std = (IMAGENET_MEAN, IMAGENET_STD) if test_norm == "focal_bug" else (CIFAR_MEAN, CIFAR_STD)
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision.datasets import CIFAR100

    return _load_cifar(CIFAR100, root, download, val_size, 100, test_mean, test_std)


DATASETS.register("cifar10")(
    DatasetInfo(
        load=load_cifar10,
        require=require_cifar10,
        num_classes=10,
        input_shape=INPUT_SHAPE,
        description="CIFAR-10 (torchvision), FOCAL-R split 45k/5k/10k, crop+flip augmentation.",
        train_images=50_000 - VAL_SIZE,
        val_images=VAL_SIZE,
        test_images=10_000,
    )
)
DATASETS.register("cifar100")(
    DatasetInfo(
        load=load_cifar100,
        require=require_cifar100,
        num_classes=100,
        input_shape=INPUT_SHAPE,
        description="CIFAR-100 (torchvision), FOCAL-R split 45k/5k/10k, crop+flip, CIFAR test statistics.",
        train_images=50_000 - VAL_SIZE,
        val_images=VAL_SIZE,
        test_images=10_000,
    )
)
