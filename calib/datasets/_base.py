"""What every dataset loader returns, and the error for a dataset that is not on disk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset

__all__ = ["Augmentation", "DatasetInfo", "DatasetNotFoundError", "DatasetSplits", "TensorData", "TensorSplit"]


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is missing from disk; the message names the expected path and the download flag."""


@dataclass(frozen=True)
class Augmentation:
    """The training augmentation of a dataset, as the device pipeline applies it per batch.

    ``crop_padding`` p > 0: a random crop of the input size from the image zero-padded by p pixels on
    every side (torchvision's ``RandomCrop(size, padding=p)``); 0: no crop. ``horizontal_flip``: a
    mirror image with probability 1/2 (``RandomHorizontalFlip()``). Crop, then flip, then normalise,
    as the loaders' torchvision transforms do.
    """

    crop_padding: int = 0
    horizontal_flip: bool = False


@dataclass
class TensorSplit:
    """One split as two tensors, for data that fits in memory (the device pipeline).

    ``images`` (N, C, H, W) are uint8 pixels 0..255 (scaled to [0, 1] as ``ToTensor`` does, then
    normalised by ``mean`` / ``std`` per channel) or float32 values the model takes as they are
    (``mean`` and ``std`` None). ``labels`` (N,) are int64.
    """

    images: torch.Tensor
    labels: torch.Tensor
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


@dataclass
class TensorData:
    """A dataset's splits as tensors: ``train`` holds the training images un-augmented (the
    ``train_eval`` view); ``augmentation`` is what the ``train`` view adds per batch."""

    train: TensorSplit
    val: TensorSplit
    test: TensorSplit
    augmentation: Augmentation = Augmentation()

    @property
    def nbytes(self) -> int:
        """Bytes of every image and label tensor."""
        return sum(t.numel() * t.element_size() for s in (self.train, self.val, self.test)
                   for t in (s.images, s.labels))


@dataclass
class DatasetSplits:
    """The four views of one dataset that a trial needs.

    ``train`` carries the training augmentation; ``train_eval`` holds the same images with the
    evaluation transform (used to cache Stage-I features); ``val`` and ``test`` use the evaluation
    transform. Every item is ``(image_tensor, label_int)``.

    ``tensors``, where the data fit in memory, holds the same splits as tensors: the device pipeline
    (``stage1.data_pipeline``) moves them to the GPU once and augments batches there; it must give the
    same images, item for item, as the datasets (up to the augmentation's random draws). It is a
    property, built on its first read by ``tensor_loader`` (a zero-argument function the loader
    passes; None: the dataset has no tensor view, and ``tensors`` is None) and kept, so that runs which
    never read it never pay for it (Tiny-ImageNet decodes 1.35 GB of JPEGs); before that first read,
    ``tensor_loader is not None`` tells, at no cost, that there will be tensors. Assigning ``tensors``
    sets them (and drops the loader).
    """

    train: Dataset
    train_eval: Dataset
    val: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, int, int]
    tensor_loader: Callable[[], TensorData] | None = field(default=None, repr=False, compare=False)

    @property
    def tensors(self) -> TensorData | None:
        """The splits as tensors (built by ``tensor_loader`` on the first read, then kept), or None."""
        tensors = self.__dict__.get("_tensors")
        if tensors is None and self.tensor_loader is not None:
            tensors = self.__dict__["_tensors"] = self.tensor_loader()
        return tensors

    @tensors.setter
    def tensors(self, value: TensorData | None) -> None:
        self.__dict__["_tensors"] = value
        self.tensor_loader = None


@dataclass(frozen=True)
class DatasetInfo:
    """A registry entry: how to load a dataset and how to check, cheaply, that it is on disk.

    ``load(root, download, **options)`` returns the splits; ``require(root)`` raises
    :class:`DatasetNotFoundError` when the files are missing (used before any trial starts);
    ``num_classes`` and ``input_shape`` (C, H, W) are None when only the files tell them (a dataset
    of the user's own images): then they are known after loading, from :class:`DatasetSplits`;
    ``train_images`` is the size of the training split Stage I trains on (None: not known before
    loading), which bounds ``stage1.train_size`` before any trial starts; ``val_images`` the size of
    the validation split, which bounds a post-hoc method's ``calibration_size`` the same way; ``test_images`` the
    size of the test split (with ``val_images``, what a study's kept predictions will take, said before it runs).

    ``options`` is the config class of the loader's keyword options, a
    ``@dataclass(frozen=True, kw_only=True)`` whose fields are the keyword arguments ``load`` takes
    (``load_dataset`` validates a mapping of them with ``calib._config.from_dict`` and passes the
    fields on); None: the dataset takes no options.
    """

    load: Callable[..., DatasetSplits]
    require: Callable[[str], None]
    num_classes: int | None
    input_shape: tuple[int, int, int] | None
    description: str
    train_images: int | None = None
    options: type | None = None
    val_images: int | None = None
    test_images: int | None = None
