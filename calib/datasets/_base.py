"""What every dataset loader returns, and the error for a dataset that is not on disk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch.utils.data import Dataset

__all__ = ["DatasetInfo", "DatasetNotFoundError", "DatasetSplits"]


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is missing from disk; the message names the expected path and the download flag."""


@dataclass
class DatasetSplits:
    """The four views of one dataset that a trial needs.

    ``train`` carries the training augmentation; ``train_eval`` holds the same images with the
    evaluation transform (used to cache Stage-I features); ``val`` and ``test`` use the evaluation
    transform. Every item is ``(image_tensor, label_int)``.
    """

    train: Dataset
    train_eval: Dataset
    val: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, int, int]


@dataclass(frozen=True)
class DatasetInfo:
    """A registry entry: how to load a dataset and how to check, cheaply, that it is on disk.

    ``load(root, download)`` returns the splits; ``require(root)`` raises
    :class:`DatasetNotFoundError` when the files are missing (used before any trial starts).
    """

    load: Callable[[str, bool], DatasetSplits]
    require: Callable[[str], None]
    num_classes: int
    input_shape: tuple[int, int, int]
    description: str
