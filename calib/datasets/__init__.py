"""Datasets by registered name: ``load_dataset("digits-noisy", root)`` returns the four splits.

Every entry of :data:`DATASETS` is a :class:`DatasetInfo`; ``calib.datasets.DATASETS.names()``
lists the valid names (the ones the CLI and the search space files accept).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from calib._config import ConfigError, from_dict
from calib.datasets._base import Augmentation, DatasetInfo, DatasetNotFoundError, DatasetSplits, TensorData, TensorSplit
from calib.registries import DATASETS

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
    "dataset_options",
    "load_dataset",
    "load_ood",
    "require_dataset",
]

# Importing the modules runs their registrations into DATASETS (calib.registries).
from calib.datasets import cifar, digits, fashion_mnist, imagefolder, synthetic, tiny_imagenet  # noqa: F401
from calib.datasets.ood import DEFAULT_OOD, OOD_SETS, OODSet, load_ood


def _plain(value: Any) -> Any:
    """``value`` with every tuple (nested in lists and dicts too) turned into a list."""
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _validated_options(name: str, options: Mapping[str, Any] | None) -> Any:
    """The options config of dataset ``name`` built from ``options`` (None: the dataset takes none)."""
    info = DATASETS.get(name)
    if info.options is None:
        if options:
            given = dict(options) if isinstance(options, Mapping) else options
            raise ConfigError(f"Dataset {name!r} takes no options, got dataset_options={given!r}. "
                              f"Leave them out for {name!r}.")
        return None
    return from_dict(info.options, {} if options is None else options, prefix="dataset_options.")


def dataset_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options of dataset ``name`` validated, as a plain dict: every field with its default filled
    in, tuples as lists (what a trial config stores); ``{}`` for a dataset that takes no options.

    An unknown key, a value of the wrong type or out of range, or any option for a dataset that takes
    none is a :class:`ConfigError`; an unknown ``name`` a ``KeyError`` listing the valid ones.
    """
    config = _validated_options(name, options)
    return {} if config is None else _plain(dataclasses.asdict(config))


def load_dataset(
    name: str,
    root: str,
    download: bool = False,
    *,
    cifar100_test_norm: str = "cifar",
    options: Mapping[str, Any] | None = None,
) -> DatasetSplits:
    """Load the dataset registered under ``name`` from ``root``.

    Args:
        name: a name from ``DATASETS.names()``; an unknown name raises a ``KeyError`` listing them.
        root: the directory that holds (or will hold, with ``download=True``) the files.
            Datasets bundled with an installed package (``digits``) ignore it.
        download: fetch missing files into ``root`` instead of raising
            :class:`DatasetNotFoundError`.
        cifar100_test_norm: ``"focal_bug"`` normalises CIFAR-100's test split with the ImageNet
            statistics, as FOCAL-R does (docs/methods.md §7.2); other datasets accept only ``"cifar"``.
        options: the dataset's options (``DatasetInfo.options``' fields; missing ones take their
            defaults), validated as :func:`dataset_options` does and passed to the loader as keyword
            arguments. Options for a dataset that takes none are a :class:`ConfigError`.
    """
    info = DATASETS.get(name)
    config = _validated_options(name, options)
    kwargs: dict[str, Any] = {}
    if config is not None:
        kwargs = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    if cifar100_test_norm != "cifar":
        if name != "cifar100":
            raise ValueError(
                f"`cifar100_test_norm` applies to 'cifar100' only, got {cifar100_test_norm!r} for {name!r}."
            )
        kwargs["test_norm"] = cifar100_test_norm
    return info.load(root, download, **kwargs)


def require_dataset(name: str, root: str) -> None:
    """Raise :class:`DatasetNotFoundError` when dataset ``name`` is not on disk under ``root``.

    Cheap (checks paths only); call it before any trial starts.
    """
    DATASETS.get(name).require(root)
