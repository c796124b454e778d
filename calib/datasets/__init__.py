"""Datasets by registered name: ``load_dataset("digits-noisy", root)`` returns the four splits.

Every entry of :data:`DATASETS` is a :class:`DatasetInfo`; ``calib.datasets.DATASETS.names()``
lists the valid names (the ones the CLI and the search space files accept).
"""

from __future__ import annotations

from calib._registry import Registry
from calib.datasets._base import (
    Augmentation,
    DatasetInfo,
    DatasetNotFoundError,
    DatasetSplits,
    TensorData,
    TensorSplit,
)

__all__ = [
    "DATASETS",
    "DEFAULT_OOD",
    "OOD_SETS",
    "Augmentation",
    "DatasetInfo",
    "DatasetNotFoundError",
    "DatasetSplits",
    "OODSet",
    "TensorData",
    "TensorSplit",
    "load_dataset",
    "load_ood",
    "require_dataset",
]

DATASETS: Registry[DatasetInfo] = Registry("dataset")
"""Dataset name → :class:`DatasetInfo`. Defined before the modules below import it to register."""

# Importing the modules runs their registrations; they import DATASETS from this package.
from calib.datasets import cifar, digits, fashion_mnist, synthetic, tiny_imagenet  # noqa: E402,F401
from calib.datasets.ood import DEFAULT_OOD, OOD_SETS, OODSet, load_ood  # noqa: E402


def load_dataset(name: str, root: str, download: bool = False, *, cifar100_test_norm: str = "cifar") -> DatasetSplits:
    """Load the dataset registered under ``name`` from ``root``.

    Args:
        name: a name from ``DATASETS.names()``; an unknown name raises a ``KeyError`` listing them.
        root: the directory that holds (or will hold, with ``download=True``) the files.
            Datasets bundled with an installed package (``digits``) ignore it.
        download: fetch missing files into ``root`` instead of raising
            :class:`DatasetNotFoundError`.
        cifar100_test_norm: ``"focal_bug"`` normalises CIFAR-100's test split with the ImageNet
            statistics, as FOCAL-R does (docs/methods.md §7.2); other datasets accept only ``"cifar"``.
    """
    info = DATASETS.get(name)
    if cifar100_test_norm == "cifar":
        return info.load(root, download)
    if name != "cifar100":
        raise ValueError(f"`cifar100_test_norm` applies to 'cifar100' only, got {cifar100_test_norm!r} for {name!r}.")
    return info.load(root, download, test_norm=cifar100_test_norm)


def require_dataset(name: str, root: str) -> None:
    """Raise :class:`DatasetNotFoundError` when dataset ``name`` is not on disk under ``root``.

    Cheap (checks paths only); call it before any trial starts.
    """
    DATASETS.get(name).require(root)
