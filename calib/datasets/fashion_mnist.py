"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747), read from its IDX files (docs/methods.md §8).

- Files: the release's four gzip-compressed IDX files (:data:`FILES`), looked for in torchvision's layout
  ``<root>/FashionMNIST/raw/`` first, then in :data:`SYSTEM_FOLDER` (Debian's ``dataset-fashion-mnist``
  package: the same names, recompressed, so their gzip md5s are not torchvision's, the bytes inside
  are). ``download=True`` fetches missing files with torchvision's ``FashionMNIST(root, download=True)``
  into the former. The files are parsed here (:func:`read_idx`: NumPy and gzip), never through
  torchvision's own loader.
- Split: the 60,000 training images give 55,000 train and 5,000 validation images, stratified by class
  (500 a class) with a fixed seed (:data:`SPLIT_SEED`), whatever the trial seed
  (:func:`stratified_split_indices`). ``test`` is the 10,000 t10k images.
- ``train``: RandomCrop(28, padding=2), ToTensor, Normalize. No horizontal flip: the footwear faces
  one way (the right half holds more ink than the left in 5,999 of the 6,000 training ankle boots,
  99.4% of the sneakers, 91.9% of the sandals), so mirror images would leave the data's distribution.
  ``train_eval``, ``val``, ``test``: ToTensor, Normalize.
- Normalize: mean 0.2860, std 0.3530, the pixel mean and standard deviation (pixels / 255) of the
  55,000 training-split images (0.28604 and 0.35302 over all 60,000).
- ``tensors`` (built on first read): the same splits as uint8 (N, 1, 28, 28) tensors taken from the
  arrays the datasets hold (no file is read again); augmentation: crop padding 2, no flip.

torchvision and PIL are imported when a loader runs or an item is read, not with this module.
"""

from __future__ import annotations

import gzip
import os
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

if TYPE_CHECKING:
    from torchvision import transforms

from calib.datasets import DATASETS
from calib.datasets._base import Augmentation, DatasetInfo, DatasetNotFoundError, DatasetSplits, TensorData, TensorSplit
from calib.datasets.subsets import stratified_sample

__all__ = [
    "AUGMENTATION",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "FILES",
    "IMAGES_MAGIC",
    "INPUT_SHAPE",
    "LABELS_MAGIC",
    "NUM_CLASSES",
    "RAW_FOLDER",
    "SPLIT_SEED",
    "SYSTEM_FOLDER",
    "VAL_SIZE",
    "GrayImageDataset",
    "fashion_mnist_eval_transform",
    "fashion_mnist_folder",
    "fashion_mnist_tensor_data",
    "fashion_mnist_train_transform",
    "load_fashion_mnist",
    "read_idx",
    "require_fashion_mnist",
    "stratified_split_indices",
]

NUM_CLASSES = 10
INPUT_SHAPE = (1, 28, 28)
FASHION_MNIST_MEAN = (0.2860,)
FASHION_MNIST_STD = (0.3530,)
VAL_SIZE = 5000
"""Validation images held out of the 60,000 training images (500 a class)."""
SPLIT_SEED = 1
"""Seed of the ``np.random.RandomState`` drawing the validation images; fixed, independent of the trial seed."""
AUGMENTATION = Augmentation(crop_padding=2, horizontal_flip=False)
"""What :func:`fashion_mnist_train_transform` adds, as the device pipeline applies it."""

RAW_FOLDER = os.path.join("FashionMNIST", "raw")
"""torchvision's ``FashionMNIST(root).raw_folder``, relative to ``root``."""
SYSTEM_FOLDER = "/usr/share/datasets/fashion-mnist"
"""Where Debian's ``dataset-fashion-mnist`` package installs the four files."""
FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
IMAGES_MAGIC = 2051
"""IDX magic number of an image file: unsigned bytes (0x08), 3 dimensions (N, rows, columns)."""
LABELS_MAGIC = 2049
"""IDX magic number of a label file: unsigned bytes (0x08), 1 dimension (N)."""


def fashion_mnist_train_transform() -> transforms.Compose:
    """Training augmentation: random 28×28 crop of the 2-pixel zero-padded image (no flip)."""
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision import transforms

    return transforms.Compose([
        transforms.RandomCrop(28, padding=2),
        transforms.ToTensor(),
        transforms.Normalize(FASHION_MNIST_MEAN, FASHION_MNIST_STD),
    ])


def fashion_mnist_eval_transform() -> transforms.Compose:
    """Evaluation transform: ToTensor (pixels / 255) then (x − mean) / std."""
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision import transforms

    return transforms.Compose([transforms.ToTensor(), transforms.Normalize(FASHION_MNIST_MEAN, FASHION_MNIST_STD)])


def read_idx(path: str, magic: int) -> np.ndarray:
    """The uint8 array of the gzip-compressed IDX file ``path``, of the shape its header gives.

    IDX (LeCun et al.'s MNIST format): a big-endian int32 magic number (0x0000, then the type byte 0x08
    for unsigned bytes, then the number of dimensions), one big-endian int32 per dimension, then the
    values in C order. A file that is not gzip, has another magic number than ``magic``, or whose size
    does not match its header raises a ``ValueError`` naming it.
    """
    try:
        with gzip.open(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as error:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: not a readable gzip file ({error}).") from error
    if len(data) < 4 or int.from_bytes(data[:4], "big") != magic:
        found = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
        raise ValueError(f"{path}: not an IDX file of the expected kind: the magic number must be {magic}, "
                         f"got {found}.")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated IDX header: expected {header} bytes, got {len(data)}.")
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape))
    if len(data) != expected:
        raise ValueError(f"{path}: an IDX file of shape {shape} has {expected} bytes, got {len(data)}.")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape).copy()


def _read_split(folder: str, images_key: str, labels_key: str) -> tuple[np.ndarray, np.ndarray]:
    """uint8 (N, 28, 28) images and int64 (N,) labels in 0..9 of one pair of files."""
    images_path, labels_path = (os.path.join(folder, FILES[key]) for key in (images_key, labels_key))
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC).astype(np.int64)
    if images.shape[1:] != INPUT_SHAPE[1:]:
        raise ValueError(f"{images_path}: expected 28x28 images, got {images.shape[1]}x{images.shape[2]}.")
    if len(labels) != len(images):
        raise ValueError(f"{labels_path} holds {len(labels)} labels for the {len(images)} images of {images_path}.")
    if len(labels) and labels.max() >= NUM_CLASSES:
        raise ValueError(f"{labels_path}: labels must be in 0..{NUM_CLASSES - 1}, got {labels.max()}.")
    return images, labels


def stratified_split_indices(
    labels: np.ndarray, val_size: int = VAL_SIZE, seed: int = SPLIT_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices into ``labels``, both ascending: validation is the stratified sample
    of ``val_size`` images that :func:`calib.datasets.subsets.stratified_sample` draws with ``seed``
    (largest remainders; on Fashion-MNIST's 6,000 a class, 500 a class)."""
    val_idx, train_idx = stratified_sample(labels, val_size, seed, key="val_size")
    return train_idx, val_idx


class GrayImageDataset(Dataset):
    """``(transform(image), label)`` over uint8 (N, H, W) images in memory, each as a mode-"L" PIL image
    (what torchvision's ``FashionMNIST`` gives); ``targets`` are the labels, named as torchvision's."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Any = None) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels.")
        self.images = images
        self.targets = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        # lazy: PIL only where images are decoded
        from PIL import Image

        image = Image.fromarray(self.images[index])  # 2-D uint8: mode "L"
        return (self.transform(image) if self.transform is not None else image), int(self.targets[index])


def fashion_mnist_tensor_data(
    train_images: np.ndarray,
    train_labels: np.ndarray,
    train_idx: np.ndarray,
    val_idx: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
) -> TensorData:
    """The tensor view: rows ``train_idx`` / ``val_idx`` of the training arrays and every test row, as
    uint8 (N, 1, 28, 28) copies with the Fashion-MNIST statistics; augmentation :data:`AUGMENTATION`."""

    def split(images: np.ndarray, labels: np.ndarray, indices: np.ndarray) -> TensorSplit:
        rows = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        return TensorSplit(
            images=torch.from_numpy(images)[rows].unsqueeze(1).contiguous(),
            labels=torch.from_numpy(np.asarray(labels, dtype=np.int64))[rows],
            mean=FASHION_MNIST_MEAN,
            std=FASHION_MNIST_STD,
        )

    return TensorData(
        train=split(train_images, train_labels, train_idx),
        val=split(train_images, train_labels, val_idx),
        test=split(test_images, test_labels, np.arange(len(test_images))),
        augmentation=AUGMENTATION,
    )


def _has_files(folder: str) -> bool:
    return all(os.path.isfile(os.path.join(folder, name)) for name in FILES.values())


def fashion_mnist_folder(root: str) -> str | None:
    """The folder the files are read from: ``<root>/FashionMNIST/raw`` when it holds all four, else
    :data:`SYSTEM_FOLDER` when that does, else None."""
    for folder in (os.path.join(os.path.abspath(root), RAW_FOLDER), SYSTEM_FOLDER):
        if _has_files(folder):
            return folder
    return None


def require_fashion_mnist(root: str) -> None:
    """Raise :class:`DatasetNotFoundError` unless one of the two folders holds the four files (cheap)."""
    if fashion_mnist_folder(root) is None:
        abs_root = os.path.abspath(root)
        raw = os.path.join(abs_root, RAW_FOLDER)
        raise DatasetNotFoundError(
            f"Fashion-MNIST not found: expected the files {', '.join(FILES.values())} in {raw} (torchvision's "
            f"layout) or in {SYSTEM_FOLDER} (Debian package dataset-fashion-mnist). Pass --download to fetch "
            f"them into {raw}, or point --data-root at the directory that holds FashionMNIST/raw."
        )


def load_fashion_mnist(root: str, download: bool = False, *, val_size: int = VAL_SIZE) -> DatasetSplits:
    """Fashion-MNIST split 55,000 / 5,000 / 10,000 (train / validation / test), stratified validation.

    Args:
        root: directory holding ``FashionMNIST/raw/`` (or none: :data:`SYSTEM_FOLDER` is the fallback).
        download: fetch the files into ``<root>/FashionMNIST/raw`` with torchvision when neither folder
            holds them; otherwise missing files raise :class:`DatasetNotFoundError`.
        val_size: validation images taken from the training set (5,000 in the protocol).
    """
    if download and fashion_mnist_folder(root) is None:
        # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
        from torchvision.datasets import FashionMNIST

        FashionMNIST(root, train=True, download=True)  # fetches and keeps all four .gz files
    require_fashion_mnist(root)
    folder = fashion_mnist_folder(root)
    assert folder is not None
    train_images, train_labels = _read_split(folder, "train_images", "train_labels")
    test_images, test_labels = _read_split(folder, "test_images", "test_labels")
    train_idx, val_idx = stratified_split_indices(train_labels, val_size=val_size)
    # Two views of the same training images: one with the augmentation, one with the eval transform.
    train_augmented = GrayImageDataset(train_images, train_labels, fashion_mnist_train_transform())
    train_plain = GrayImageDataset(train_images, train_labels, fashion_mnist_eval_transform())
    return DatasetSplits(
        train=Subset(train_augmented, train_idx.tolist()),
        train_eval=Subset(train_plain, train_idx.tolist()),
        val=Subset(train_plain, val_idx.tolist()),
        test=GrayImageDataset(test_images, test_labels, fashion_mnist_eval_transform()),
        num_classes=NUM_CLASSES,
        input_shape=INPUT_SHAPE,
        tensor_loader=partial(fashion_mnist_tensor_data, train_images, train_labels, train_idx, val_idx,
                              test_images, test_labels),
    )


DATASETS.register("fashion-mnist")(
    DatasetInfo(
        load=load_fashion_mnist,
        require=require_fashion_mnist,
        num_classes=NUM_CLASSES,
        input_shape=INPUT_SHAPE,
        train_images=60_000 - VAL_SIZE,
        val_images=VAL_SIZE,
        test_images=10_000,
        description="Fashion-MNIST (IDX files in FashionMNIST/raw or the Debian package's folder), stratified "
        "split 55k/5k/10k (fixed seed), crop (padding 2) without flip, its own statistics.",
    )
)
