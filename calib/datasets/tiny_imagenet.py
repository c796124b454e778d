"""Tiny-ImageNet-200 with the ACLS/FeDLaS protocol (docs/methods.md §7.3, §8).

Files: the official archive's layout, ``<root>/tiny-imagenet-200/`` with ``wnids.txt`` (200 class
ids, one a line), ``train/<wnid>/images/*.JPEG`` (500 a class), ``val/images/*.JPEG`` with
``val/val_annotations.txt`` (tab-separated: file name, wnid, box). ``words.txt``, ``test/`` and the
``train/<wnid>/<wnid>_boxes.txt`` files are not read. A few images are grayscale JPEGs; every image
is converted to RGB on reading.

- Labels: class index = 0-based line number in ``wnids.txt``. (ACLS, FeDLaS and FOCAL-R index the
  *sorted* wnids instead; the two numberings are a permutation of each other.)
- ``test``: the official labelled validation set (10,000 images, 50 a class), in file-name order,
  labels from ``val_annotations.txt``.
- ``val`` / ``train``: ``val_per_class`` (50) training images of each class are held out for
  validation, the other 450 a class are ``train`` and ``train_eval``. The held-out images are the
  ones ACLS's and FeDLaS's ``get_train_val_loader`` pick with their default seed 1, whatever the
  trial seed: one ``np.random.RandomState(1)``; the classes are visited in *sorted*-wnid order; each
  class's training file names, sorted, are shuffled in turn with that generator (so the draws
  continue from one class to the next); the *last* ``val_per_class`` shuffled files are validation,
  the rest train. The splits list the images class by class in that order, each class in its
  shuffled order. (ACLS/FeDLaS seed this shuffle with the trial seed; here the split is fixed.)
- ``train``: RandomCrop(64, padding=4), RandomHorizontalFlip, ToTensor, Normalize.
  ``train_eval``, ``val``, ``test``: ToTensor, Normalize.
- Normalize uses the ImageNet statistics, mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225),
  as FOCAL-R's ``Data/tiny_imagenet.py`` and ACLS's/FeDLaS's ``calibrate/data/tiny_imagenet.py`` do.
- ``tensors``: every image decoded once (as the datasets decode it) into uint8 (N, 3, 64, 64)
  tensors, 1.35 GB for the 110,000 images; built on the first read of ``tensors`` only (a thread
  pool decodes the files). Augmentation: crop padding 4, horizontal flip.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

if TYPE_CHECKING:
    from torchvision import transforms

from calib.datasets import DATASETS
from calib.datasets._base import Augmentation, DatasetInfo, DatasetNotFoundError, DatasetSplits, TensorData, TensorSplit

__all__ = [
    "ARCHIVE_MD5",
    "ARCHIVE_URL",
    "AUGMENTATION",
    "FOLDER",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "INPUT_SHAPE",
    "SPLIT_SEED",
    "VAL_PER_CLASS",
    "ImageList",
    "decode_images",
    "load_tiny_imagenet",
    "require_tiny_imagenet",
    "split_train_files",
    "tiny_imagenet_eval_transform",
    "tiny_imagenet_train_transform",
]

FOLDER = "tiny-imagenet-200"
ARCHIVE_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
ARCHIVE_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"
"""md5 of the official ``tiny-imagenet-200.zip`` (248,100,043 bytes)."""

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INPUT_SHAPE = (3, 64, 64)
VAL_PER_CLASS = 50
"""Training images a class held out for validation (ACLS/FeDLaS ``val_samples_per_class``)."""
SPLIT_SEED = 1
"""Seed of the ``np.random.RandomState`` choosing the held-out images (ACLS/FeDLaS default seed)."""
AUGMENTATION = Augmentation(crop_padding=4, horizontal_flip=True)
"""What :func:`tiny_imagenet_train_transform` adds, as the device pipeline applies it."""

EXTENSION = ".JPEG"
WNIDS_FILE = "wnids.txt"
VAL_ANNOTATIONS = os.path.join("val", "val_annotations.txt")


def tiny_imagenet_train_transform() -> transforms.Compose:
    """Training augmentation: random 64×64 crop of the 4-pixel zero-padded image, horizontal flip."""
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.RandomCrop(64, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def tiny_imagenet_eval_transform() -> transforms.Compose:
    """Evaluation transform: ToTensor (pixels / 255) then per-channel (x − mean) / std, ImageNet statistics."""
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision import transforms

    return transforms.Compose([transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


class ImageList(Dataset):
    """``(transform(image), label)`` for a list of ``(path, label)``; images are read as RGB. ``samples``
    and ``targets`` are named as torchvision's ``ImageFolder``'s."""

    def __init__(self, samples: list[tuple[str, int]], transform: Callable | None = None) -> None:
        self.samples = samples
        self.targets = [label for _, label in samples]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
        from torchvision.datasets.folder import default_loader

        path, label = self.samples[index]
        image = default_loader(path)  # PIL, converted to RGB
        return (self.transform(image) if self.transform is not None else image), label


def decode_images(paths: Sequence[str], shape: tuple[int, int, int] = INPUT_SHAPE) -> torch.Tensor:
    """The images at ``paths`` decoded as :class:`ImageList` decodes them (RGB), stacked into one uint8
    (N, C, H, W) tensor of ``shape`` per image; decoded in a thread pool. An image of another size is a
    ``ValueError``."""
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision.datasets.folder import default_loader

    channels, height, width = shape
    out = torch.empty((len(paths), channels, height, width), dtype=torch.uint8)
    pixels_out = out.numpy()  # the same memory

    def decode(index: int) -> None:
        pixels = np.asarray(default_loader(paths[index]))
        if pixels.shape != (height, width, channels):
            raise ValueError(f"{paths[index]}: expected a {width}x{height} image with {channels} channels, "
                             f"got the shape {pixels.shape} (height, width, channels).")
        pixels_out[index] = pixels.transpose(2, 0, 1)

    with ThreadPoolExecutor() as pool:
        for _ in pool.map(decode, range(len(paths))):
            pass
    return out


def _tensor_data(samples: list[tuple[str, int]], num_train: int, test_samples: list[tuple[str, int]]) -> TensorData:
    """Train = the first ``num_train`` of ``samples``, validation the rest (views of one tensor), test."""
    images = decode_images([path for path, _ in samples])
    labels = torch.tensor([label for _, label in samples], dtype=torch.int64)
    test_images = decode_images([path for path, _ in test_samples])
    test_labels = torch.tensor([label for _, label in test_samples], dtype=torch.int64)
    return TensorData(
        train=TensorSplit(images[:num_train], labels[:num_train], IMAGENET_MEAN, IMAGENET_STD),
        val=TensorSplit(images[num_train:], labels[num_train:], IMAGENET_MEAN, IMAGENET_STD),
        test=TensorSplit(test_images, test_labels, IMAGENET_MEAN, IMAGENET_STD),
        augmentation=AUGMENTATION,
    )


def _not_found(what: str, path: str, abs_root: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"Tiny-ImageNet not found: expected the {what} {path} (the layout of the official "
        f"tiny-imagenet-200.zip). Pass --download to fetch it into {abs_root}, or point --data-root at "
        f"the directory that holds {FOLDER}."
    )


def require_tiny_imagenet(root: str) -> None:
    """Raise :class:`DatasetNotFoundError` unless ``<root>/tiny-imagenet-200`` holds ``wnids.txt`` and
    ``val/val_annotations.txt`` (paths only: cheap)."""
    abs_root = os.path.abspath(root)
    folder = os.path.join(abs_root, FOLDER)
    if not os.path.isdir(folder):
        raise _not_found("directory", folder, abs_root)
    for name in (WNIDS_FILE, VAL_ANNOTATIONS):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise _not_found("file", path, abs_root)


def _is_complete(root: str) -> bool:
    try:
        require_tiny_imagenet(root)
    except DatasetNotFoundError:
        return False
    return True


def _read_wnids(folder: str) -> list[str]:
    path = os.path.join(folder, WNIDS_FILE)
    with open(path) as handle:
        wnids = [line.strip() for line in handle if line.strip()]
    if not wnids:
        raise ValueError(f"{path} lists no class ids.")
    if len(set(wnids)) != len(wnids):
        raise ValueError(f"{path} lists a class id more than once.")
    return wnids


def _train_files(folder: str, wnid: str) -> list[str]:
    images = os.path.join(folder, "train", wnid, "images")
    if not os.path.isdir(images):
        raise DatasetNotFoundError(
            f"Tiny-ImageNet is incomplete: expected the directory {images} for class {wnid} of {WNIDS_FILE}."
        )
    return sorted(name for name in os.listdir(images) if name.endswith(EXTENSION))


def split_train_files(
    files_by_wnid: dict[str, list[str]], val_per_class: int = VAL_PER_CLASS, seed: int = SPLIT_SEED
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """ACLS/FeDLaS's held-out split: (train, validation) lists of ``(wnid, file name)``.

    Classes in sorted-wnid order; each class's sorted file names shuffled in turn by one
    ``np.random.RandomState(seed)``; the last ``val_per_class`` go to validation. This draws what
    ACLS's ``np.random.seed(seed)`` followed by one ``np.random.shuffle`` a class draws.
    """
    if isinstance(val_per_class, bool) or not isinstance(val_per_class, (int, np.integer)) or val_per_class < 1:
        raise ValueError(f"`val_per_class` must be an integer >= 1, got val_per_class={val_per_class!r}.")
    smallest = min(files_by_wnid, key=lambda wnid: (len(files_by_wnid[wnid]), wnid))
    if val_per_class >= len(files_by_wnid[smallest]):
        raise ValueError(
            f"`val_per_class` must be smaller than every class's number of training images "
            f"(class {smallest} has {len(files_by_wnid[smallest])}), got val_per_class={val_per_class}."
        )
    rng = np.random.RandomState(seed)
    train: list[tuple[str, str]] = []
    val: list[tuple[str, str]] = []
    for wnid in sorted(files_by_wnid):
        files = sorted(files_by_wnid[wnid])
        rng.shuffle(files)
        train += [(wnid, name) for name in files[:-val_per_class]]
        val += [(wnid, name) for name in files[-val_per_class:]]
    return train, val


def _test_samples(folder: str, label_of: dict[str, int]) -> list[tuple[str, int]]:
    annotations = os.path.join(folder, VAL_ANNOTATIONS)
    wnid_of: dict[str, str] = {}
    with open(annotations) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 2:
                raise ValueError(f"{annotations}, line {number}: expected tab-separated file name and wnid.")
            if fields[1] not in label_of:
                raise ValueError(f"{annotations}, line {number}: class {fields[1]!r} is not in {WNIDS_FILE}.")
            wnid_of[fields[0]] = fields[1]
    images = os.path.join(folder, "val", "images")
    if not os.path.isdir(images):
        raise DatasetNotFoundError(f"Tiny-ImageNet is incomplete: expected the directory {images}.")
    samples = []
    for name in sorted(name for name in os.listdir(images) if name.endswith(EXTENSION)):
        if name not in wnid_of:
            raise ValueError(f"{os.path.join(images, name)} has no line in {annotations}.")
        samples.append((os.path.join(images, name), label_of[wnid_of[name]]))
    return samples


def load_tiny_imagenet(root: str, download: bool = False, *, val_per_class: int = VAL_PER_CLASS) -> DatasetSplits:
    """Tiny-ImageNet-200 split 90,000 / 10,000 / 10,000 (train / validation / test), ACLS/FeDLaS protocol.

    Args:
        root: directory holding ``tiny-imagenet-200``.
        download: fetch and extract the official archive into ``root`` when the files are missing;
            otherwise missing files raise :class:`DatasetNotFoundError`.
        val_per_class: training images of each class held out for validation (50 in the protocol).

    ``num_classes`` is the number of ids in ``wnids.txt`` (200 in the official files).
    """
    if download and not _is_complete(root):
        # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
        from torchvision.datasets.utils import download_and_extract_archive

        download_and_extract_archive(ARCHIVE_URL, root, filename=f"{FOLDER}.zip", md5=ARCHIVE_MD5)
    require_tiny_imagenet(root)
    folder = os.path.join(os.path.abspath(root), FOLDER)
    wnids = _read_wnids(folder)
    label_of = {wnid: index for index, wnid in enumerate(wnids)}
    train_names, val_names = split_train_files(
        {wnid: _train_files(folder, wnid) for wnid in wnids}, val_per_class=val_per_class
    )
    names = train_names + val_names
    samples = [(os.path.join(folder, "train", wnid, "images", name), label_of[wnid]) for wnid, name in names]
    train_idx, val_idx = list(range(len(train_names))), list(range(len(train_names), len(names)))
    # Two views of the same training images: one with the augmentation, one with the eval transform.
    train_augmented = ImageList(samples, tiny_imagenet_train_transform())
    train_plain = ImageList(samples, tiny_imagenet_eval_transform())
    test_samples = _test_samples(folder, label_of)
    return DatasetSplits(
        train=Subset(train_augmented, train_idx),
        train_eval=Subset(train_plain, train_idx),
        val=Subset(train_plain, val_idx),
        test=ImageList(test_samples, tiny_imagenet_eval_transform()),
        num_classes=len(wnids),
        input_shape=INPUT_SHAPE,
        tensor_loader=partial(_tensor_data, samples, len(train_names), test_samples),
    )


DATASETS.register("tiny-imagenet")(
    DatasetInfo(
        load=load_tiny_imagenet,
        require=require_tiny_imagenet,
        num_classes=200,
        input_shape=INPUT_SHAPE,
        description="Tiny-ImageNet-200, ACLS/FeDLaS split 90k/10k (50 a class held out of train)/10k (official val), "
        "crop+flip, ImageNet statistics.",
        train_images=200 * (500 - VAL_PER_CLASS),
        val_images=200 * VAL_PER_CLASS,
        test_images=10_000,
    )
)
