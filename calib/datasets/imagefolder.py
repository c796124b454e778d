"""``imagefolder``: a dataset of your own images, in torchvision's ``ImageFolder`` layout.

Layout under ``root`` (``--data-root``)::

    train/<class>/<image>     the training images, one folder a class (sub-folders are read too)
    test/<class>/<image>      the test images, the same class folders
    val/<class>/<image>       optional: the validation images, the same class folders

Image files are those torchvision's ``ImageFolder`` reads (``.jpg .jpeg .png .ppm .bmp .pgm .tif
.tiff .webp``, any case); other files are skipped. Every split must have the same class folder
names, and every class folder at least one image (else a :class:`ConfigError` naming them); labels
are the indices of the class names in sorted order. Nothing is downloaded: ``download`` is ignored.

Channels: the mode of the first training image (in ``ImageFolder``'s order) decides for every image:
a grayscale mode (``1``, ``L``, ``LA``, ``I``, ``I;16``, ``F``, …) gives 1 channel, every image
converted to ``L``; any other mode 3 channels, every image converted to ``RGB``.

Options (:class:`ImageFolderOptions`, the trial config's ``dataset_options``):

- ``image_size`` (default None): the side of the square image the model sees. Evaluation transform
  (``train_eval``, ``val``, ``test``): ``Resize(resize)`` (shorter side to ``resize``), then
  ``CenterCrop(image_size)``; training transform: ``Resize(resize)``,
  ``RandomCrop(image_size, padding=image_size // 8)``, ``RandomHorizontalFlip()``, as CIFAR's.
  None: every image (all splits) must have the same size W×H, which the model sees as it is (a
  :class:`ConfigError` names two files of different sizes otherwise); the training transform is then
  ``RandomCrop((H, W), padding=min(H, W) // 8)``, ``RandomHorizontalFlip()``.
- ``resize`` (default None: ``image_size``): the shorter side images are resized to before the crop;
  at least ``image_size``, and only with ``image_size``.
- ``mean``, ``std`` (default None): the per-channel normalisation, one value a channel, both or
  neither. None: computed from the training images (the ``train_eval`` split) after the evaluation
  transform, with pixels scaled to [0, 1] as ``ToTensor`` does; ``std`` is the population standard
  deviation over every pixel of every image. More than 10,000 training images: a sample of 10,000
  drawn with a fixed seed (:data:`STATS_SEED`).
- ``val_fraction`` (default 0.1), in (0, 1): without ``val/``, ``round(val_fraction · N)`` of the N
  training images are held out for validation, a stratified sample drawn with the fixed seed 1
  (:func:`calib.datasets.subsets.stratified_sample`), whatever the trial seed; ignored when ``val/``
  exists.

The splits have no tensor view (``tensor_loader`` None). torchvision is imported when the loader
runs, not with this module.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Dataset, Subset

if TYPE_CHECKING:
    from PIL import Image
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

from calib._config import ConfigError, check
from calib.datasets import DATASETS
from calib.datasets._base import DatasetInfo, DatasetNotFoundError, DatasetSplits
from calib.datasets.subsets import stratified_sample

__all__ = [
    "GRAYSCALE_MODES",
    "IMAGE_EXTENSIONS",
    "MAX_STATS_IMAGES",
    "SPLIT_SEED",
    "STATS_SEED",
    "ImageFolderOptions",
    "channel_stats",
    "load_imagefolder",
    "require_imagefolder",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""The file endings (any case) ``ImageFolder`` reads: torchvision's ``IMG_EXTENSIONS``, copied so that
:func:`require_imagefolder` need not import torchvision."""
GRAYSCALE_MODES = frozenset({"1", "L", "LA", "La", "I", "F", "I;16", "I;16L", "I;16B", "I;16N"})
"""PIL modes of one (grey) channel: a first training image in one of them makes the dataset grayscale."""
SPLIT_SEED = 1
"""Seed of the stratified validation sample (as the other datasets' fixed validation splits)."""
STATS_SEED = 1
"""Seed of the sample of training images the mean and std are computed from, when there are more."""
MAX_STATS_IMAGES = 10_000
"""Training images the mean and std are computed from, at most."""

SPLITS = ("train", "val", "test")
LAYOUT = ("<root>/train/<class>/<image>, <root>/test/<class>/<image> and, optionally, "
          "<root>/val/<class>/<image> (torchvision's ImageFolder layout)")


@dataclass(frozen=True, kw_only=True)
class ImageFolderOptions:
    """The options of the ``imagefolder`` dataset (``dataset_options``); see the module docstring.

    Attributes:
        image_size: side of the square crop the model sees; None: the images' own size (every image
            must then have the same size).
        resize: shorter side the images are resized to before the crop (None: ``image_size``); at
            least ``image_size``, and only with ``image_size``.
        mean: per-channel normalisation mean, one value a channel; None: computed from the training
            images. Give ``std`` with it.
        std: per-channel normalisation standard deviation (positive), one value a channel; None:
            computed from the training images. Give ``mean`` with it.
        val_fraction: share of the training images held out for validation (a stratified sample, fixed
            seed) when there is no ``val/`` folder; ignored when there is one.
    """

    image_size: int | None = None
    resize: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        check(self.image_size is None or self.image_size >= 1, "image_size", self.image_size,
              "be a positive integer or null")
        check(self.resize is None or self.image_size is not None, "resize", self.resize,
              "be given with image_size", "Set image_size (`--image-size`) too, or leave resize out.")
        check(self.resize is None or self.image_size is None or self.resize >= self.image_size, "resize",
              self.resize, f"be at least image_size={self.image_size} (the crop is taken from the resized image)")
        check((self.mean is None) == (self.std is None), "mean" if self.std is None else "std",
              self.mean if self.std is None else self.std, "be given together with "
              + ("std" if self.std is None else "mean"), "Give both mean and std, or neither (computed then).")
        if self.mean is not None and self.std is not None:
            check(len(self.mean) in (1, 3), "mean", self.mean, "have one value a channel (1 or 3 values)")
            check(len(self.std) == len(self.mean), "std", self.std,
                  f"have as many values as mean ({len(self.mean)})")
            check(all(s > 0 for s in self.std), "std", self.std, "hold positive values only")
        check(0 < self.val_fraction < 1, "val_fraction", self.val_fraction, "be in (0, 1)")


# ----------------------------------------------------------------------------------------- layout


def _class_folders(directory: str) -> list[str]:
    """The class folder names in ``directory``, sorted, as ``ImageFolder``'s ``find_classes`` lists them."""
    return sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())


def _has_image(directory: str) -> bool:
    """Whether ``directory`` (or a folder in it) holds a file ``ImageFolder`` reads; stops at the first."""
    for _folder, _dirs, files in os.walk(directory, followlinks=True):
        if any(name.lower().endswith(IMAGE_EXTENSIONS) for name in files):
            return True
    return False


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(repr(name) for name in names)


def _check_layout(root: str) -> dict[str, list[str]]:
    """Split name → its class folders, for the splits present; every error of the layout raised."""
    abs_root = os.path.abspath(root)
    for path in (abs_root, os.path.join(abs_root, "train"), os.path.join(abs_root, "test")):
        if not os.path.isdir(path):
            raise DatasetNotFoundError(
                f"ImageFolder dataset not found: expected the directory {path}. The layout is {LAYOUT}; "
                f"point --data-root at the directory that holds train/ and test/."
            )
    classes = {split: _class_folders(os.path.join(abs_root, split))
               for split in SPLITS if os.path.isdir(os.path.join(abs_root, split))}
    for split in ("train", "test"):
        if not classes[split]:
            raise DatasetNotFoundError(
                f"ImageFolder dataset not found: {os.path.join(abs_root, split)} holds no class folder. "
                f"The layout is {LAYOUT}."
            )
    reference = set(classes["train"])
    problems = []
    for split in ("test", "val"):
        names = classes.get(split)
        if names is None:
            continue
        lacks = sorted(reference - set(names))
        adds = sorted(set(names) - reference)
        if lacks:
            problems.append(f"{split}/ lacks {_quoted(lacks)}")
        if adds:
            problems.append(f"{split}/ has {_quoted(adds)}, which train/ lacks")
    if problems:
        raise ConfigError(
            f"ImageFolder splits disagree on the classes: {'; '.join(problems)}. Every split folder under "
            f"{abs_root} (train/, test/ and val/ where present) must hold the same class folders."
        )
    for split, names in classes.items():
        for name in names:
            folder = os.path.join(abs_root, split, name)
            if not _has_image(folder):
                raise ConfigError(
                    f"ImageFolder class folder {folder} holds no image file (endings: "
                    f"{' '.join(IMAGE_EXTENSIONS)}). Put its images there or remove the class from every split."
                )
    return classes


def require_imagefolder(root: str) -> None:
    """Check, cheaply (paths only), that ``root`` holds an ImageFolder dataset.

    ``root``, ``root/train`` and ``root/test`` must be directories with at least one class folder
    (else :class:`DatasetNotFoundError`, naming the missing path and the layout); the splits present
    (``val/`` too) must have the same class folder names, and each class folder an image file (else
    :class:`ConfigError`, naming the classes each split lacks or adds, or the empty folder).
    """
    _check_layout(root)


# ----------------------------------------------------------------------------------------- images


def _load_image(path: str, mode: str) -> Image.Image:
    """The image at ``path`` converted to ``mode`` (as torchvision's ``pil_loader`` reads it)."""
    # lazy: PIL only where images are decoded
    from PIL import Image

    with open(path, "rb") as handle:
        return Image.open(handle).convert(mode)


def _image_size(path: str) -> tuple[int, int]:
    """(width, height) of the image at ``path``, read from its header (no pixels decoded)."""
    # lazy: PIL only where images are decoded
    from PIL import Image

    with Image.open(path) as image:
        return image.size


def _common_size(paths: Sequence[str], root: str) -> tuple[int, int]:
    """The (width, height) every image at ``paths`` has; two sizes are a :class:`ConfigError` naming them."""
    first = paths[0]
    size = _image_size(first)
    for path in paths[1:]:
        other = _image_size(path)
        if other != size:
            raise ConfigError(
                f"ImageFolder images differ in size: {os.path.relpath(first, root)} is {size[0]}x{size[1]}, "
                f"{os.path.relpath(path, root)} is {other[0]}x{other[1]} (width x height). Set image_size "
                f"(`--image-size`) to resize and crop every image to one square size."
            )
    return size


def channel_stats(
    paths: Sequence[str],
    loader: Callable[[str], Any],
    transform: Callable[[Any], Any],
    *,
    max_images: int = MAX_STATS_IMAGES,
    seed: int = STATS_SEED,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel of ``transform(loader(path))`` (C, H, W tensors) over the images at ``paths``.

    ``std`` is the population standard deviation over every pixel of every image (accumulated in
    float64). More than ``max_images`` paths: a sample of ``max_images``, drawn by
    ``np.random.RandomState(seed).choice`` without replacement. Images are decoded in a thread pool.
    """
    if len(paths) > max_images:
        chosen = np.sort(np.random.RandomState(seed).choice(len(paths), max_images, replace=False))
        paths = [paths[i] for i in chosen]

    def sums(path: str) -> tuple[np.ndarray, np.ndarray, int]:
        pixels = transform(loader(path)).double().flatten(1)  # (C, H·W)
        return pixels.sum(1).numpy(), (pixels * pixels).sum(1).numpy(), pixels.shape[1]

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        results = list(pool.map(sums, paths))
    count = sum(n for _, _, n in results)
    total = np.sum([s for s, _, _ in results], axis=0)
    squares = np.sum([q for _, q, _ in results], axis=0)
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def _sized(image_size: int | None, resize: int | None, size: tuple[int, int] | None) -> tuple[list, list]:
    """(evaluation, training) transforms before ToTensor: resize and crop, or nothing but the augmentation."""
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision import transforms

    if image_size is not None:
        resize_step = transforms.Resize(resize if resize is not None else image_size)
        return ([resize_step, transforms.CenterCrop(image_size)],
                [resize_step, transforms.RandomCrop(image_size, padding=image_size // 8),
                 transforms.RandomHorizontalFlip()])
    assert size is not None
    width, height = size
    return [], [transforms.RandomCrop((height, width), padding=min(height, width) // 8),
                transforms.RandomHorizontalFlip()]


def _view(base: ImageFolder, loader: Callable[[str], Any], transform: transforms.Compose) -> ImageFolder:
    """``base`` (its file list, not scanned again) reading images with ``loader`` and ``transform``."""
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision.datasets.vision import StandardTransform

    view = copy.copy(base)
    view.loader = loader
    view.transform = transform
    view.transforms = StandardTransform(transform, None)
    return view


# ----------------------------------------------------------------------------------------- loader


def load_imagefolder(
    root: str,
    download: bool = False,
    *,
    image_size: int | None = None,
    resize: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    val_fraction: float = 0.1,
) -> DatasetSplits:
    """The splits of the ImageFolder dataset under ``root`` (the layout, options and defaults: module docstring).

    Args:
        root: the directory that holds ``train/``, ``test/`` and, optionally, ``val/``.
        download: ignored: there is nothing to download (a missing ``root`` raises
            :class:`DatasetNotFoundError` either way).
        image_size, resize, mean, std, val_fraction: :class:`ImageFolderOptions` (checked as it checks
            them).

    Returns ``DatasetSplits`` with ``num_classes`` the class folders and ``input_shape``
    (C, image_size, image_size), or (C, H, W) of the images when ``image_size`` is None.
    """
    del download  # nothing to download
    options = ImageFolderOptions(
        image_size=image_size, resize=resize, val_fraction=val_fraction,
        mean=None if mean is None else tuple(float(m) for m in mean),
        std=None if std is None else tuple(float(s) for s in std),
    )
    classes = _check_layout(root)
    # lazy: torchvision takes seconds to import; only the loader that reads its data needs it
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    abs_root = os.path.abspath(root)
    base = ImageFolder(os.path.join(abs_root, "train"))
    first_mode = _load_mode(base.samples[0][0])
    mode = "L" if first_mode in GRAYSCALE_MODES else "RGB"
    channels = 1 if mode == "L" else 3
    loader = partial(_load_image, mode=mode)
    others = {split: ImageFolder(os.path.join(abs_root, split), loader=loader) for split in classes if split != "train"}

    size = None
    if options.image_size is None:
        every_path = [path for folder in (base, *others.values()) for path, _ in folder.samples]
        size = _common_size(every_path, abs_root)
    eval_steps, train_steps = _sized(options.image_size, options.resize, size)
    height, width = (options.image_size, options.image_size) if size is None else (size[1], size[0])

    labels = np.asarray(base.targets)
    if "val" in others:
        train_idx = np.arange(len(labels))
        val_idx = None
    else:
        num = len(labels)
        val_size = round(options.val_fraction * num)
        if not 1 <= val_size < num:
            raise ConfigError(
                f"`dataset_options.val_fraction` must hold out at least 1 and fewer than all {num} training images "
                f"of {os.path.join(abs_root, 'train')}, got val_fraction={options.val_fraction} "
                f"({val_size} images). Change it, or add a val/ folder."
            )
        val_idx, train_idx = stratified_sample(labels, val_size, SPLIT_SEED, key="val_size")

    if options.mean is None or options.std is None:
        stats_transform = transforms.Compose([*eval_steps, transforms.ToTensor()])
        mean_, std_ = channel_stats([base.samples[i][0] for i in train_idx], loader, stats_transform)
        if min(std_) <= 0:
            raise ConfigError(
                f"ImageFolder training images under {os.path.join(abs_root, 'train')} have a channel of one "
                f"constant value (computed std {std_}): give dataset_options.mean and dataset_options.std."
            )
    else:
        mean_, std_ = options.mean, options.std
        check(len(mean_) == channels, "dataset_options.mean", mean_,
              f"have one value a channel: the images have {channels} ({mode}, from the first training image "
              f"{os.path.relpath(base.samples[0][0], abs_root)})")
    normalize = [transforms.ToTensor(), transforms.Normalize(mean_, std_)]
    eval_transform = transforms.Compose([*eval_steps, *normalize])
    train_transform = transforms.Compose([*train_steps, *normalize])

    train_augmented = _view(base, loader, train_transform)
    train_plain = _view(base, loader, eval_transform)
    others = {split: _view(folder, loader, eval_transform) for split, folder in others.items()}
    val: Dataset
    if val_idx is None:
        train, train_eval, val = train_augmented, train_plain, others["val"]
    else:
        train = Subset(train_augmented, train_idx.tolist())
        train_eval = Subset(train_plain, train_idx.tolist())
        val = Subset(train_plain, val_idx.tolist())
    return DatasetSplits(
        train=train,
        train_eval=train_eval,
        val=val,
        test=others["test"],
        num_classes=len(classes["train"]),
        input_shape=(channels, height, width),
    )


def _load_mode(path: str) -> str:
    """The PIL mode of the image at ``path`` (from its header)."""
    # lazy: PIL only where images are decoded
    from PIL import Image

    with Image.open(path) as image:
        return image.mode


DATASETS.register("imagefolder")(
    DatasetInfo(
        load=load_imagefolder,
        require=require_imagefolder,
        num_classes=None,
        input_shape=None,
        description="Your own images in torchvision's ImageFolder layout under --data-root (train/, test/, "
                    "optional val/); options image_size, resize, mean, std, val_fraction.",
        options=ImageFolderOptions,
    )
)
