"""``synthetic-cifar10``: a CIFAR-10-shaped dataset generated in memory, for GPU benchmarks and smoke
runs without a download.

The sizes and layout are CIFAR-10's: 50,000 training images split 45,000 / 5,000 (train / validation)
by FOCAL-R's indices (:func:`calib.datasets.cifar.focal_split_indices`), 10,000 test images, uint8
32×32 RGB, 10 classes (5,000 training and 1,000 test images a class), with CIFAR-10's transforms and
statistics (:func:`~calib.datasets.cifar.cifar_train_transform`, crop + flip, and
:func:`~calib.datasets.cifar.cifar_eval_transform`) and tensor view.

Recipe (:func:`synthetic_cifar10_arrays`: NumPy, seed :data:`SEED`, vectorised, 2-3 s on one CPU
core; the same bytes in every call). A *smooth pattern* is N(0, 1) values on a grid of one point
every few pixels, per channel, upsampled bilinearly.

- Each class has a template: a smooth pattern with a point every :data:`CELL` = 8 pixels over 40×40
  pixels, times :data:`TEMPLATE_AMPLITUDE`, plus a class colour (uniform in ±:data:`COLOUR_AMPLITUDE`
  per channel).
- An image of class k is 128 + the 32×32 window of k's template at a random offset (uniform in
  0..:data:`MAX_SHIFT` on each axis: a random translation) + a distractor drawn for this image alone
  (smooth patterns with a point every 8 and every 4 pixels, times :data:`DISTRACTOR_AMPLITUDE` and
  :data:`FINE_DISTRACTOR_AMPLITUDE`: larger than the templates, it is what makes the classes
  confusable) + a brightness offset N(0, :data:`BRIGHTNESS_STD`) + per-pixel Gaussian noise
  N(0, :data:`NOISE_STD`) (256 levels), rounded and clipped to 0..255 (about 2% of the pixels clip).

The distractors set an irreducible error: a classifier that knows the templates (the most likely
class and shift under the Gaussian terms) is right on about 95% of the test images, so no model is
perfect, and one that memorises the training images' distractors (trained long) is expected to grow
overconfident. ``small_cnn`` (its receptive field is local: it relies mostly on the class colours)
reaches about 68% test accuracy after 6 epochs on 10,000 training images (CPU).

``root`` and ``download`` are accepted for the common loader signature and ignored; ``require``
never raises.
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import NormalDist
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from calib.datasets import DATASETS
from calib.datasets._base import DatasetInfo, DatasetSplits
from calib.datasets.cifar import INPUT_SHAPE, VAL_SIZE, cifar_eval_transform, cifar_splits, cifar_train_transform

__all__ = [
    "BRIGHTNESS_STD",
    "CELL",
    "COLOUR_AMPLITUDE",
    "DISTRACTOR_AMPLITUDE",
    "FINE_DISTRACTOR_AMPLITUDE",
    "MAX_SHIFT",
    "NOISE_STD",
    "NUM_CLASSES",
    "NUM_TEST",
    "NUM_TRAIN",
    "SEED",
    "TEMPLATE_AMPLITUDE",
    "ArrayImageDataset",
    "load_synthetic_cifar10",
    "require_synthetic",
    "synthetic_cifar10_arrays",
]

NUM_CLASSES = 10
NUM_TRAIN = 50_000
NUM_TEST = 10_000
SEED = 20_240_601
"""Seed of the ``numpy.random.default_rng`` drawing everything: the dataset is fixed."""

CELL = 8
"""Grid spacing, in pixels, of the templates and the coarse distractor; the fine distractor's is CELL / 2."""
MAX_SHIFT = 8
"""Translations are uniform in 0..MAX_SHIFT pixels on each axis (templates are 32 + MAX_SHIFT wide)."""
TEMPLATE_AMPLITUDE = 14
COLOUR_AMPLITUDE = 34
DISTRACTOR_AMPLITUDE = 18
FINE_DISTRACTOR_AMPLITUDE = 60
BRIGHTNESS_STD = 15
NOISE_STD = 20
"""Pixel-scale (0..255) amplitudes of the recipe's terms (module docstring). The pattern amplitudes are
integers below 64, which keeps the upsampling exact (:func:`_smooth_patterns`)."""

_SIZE = 32
_CHUNK = 5_000
"""Images generated at a time (bounds the float32 working memory); part of the recipe: the draws
are taken chunk by chunk."""


def _upsampling(size: int, cell: int) -> np.ndarray:
    """(grid², size²) float32 with grid = size / cell: a (grid, grid) array flattened times this is its
    bilinear upsampling to (size, size) (half-pixel centres, edges clamped), flattened. With cells of 4
    or 8 pixels every entry is a multiple of 1/256."""
    grid = size // cell
    position = np.clip((np.arange(size) + 0.5) / cell - 0.5, 0, grid - 1)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, grid - 1)
    weights = np.zeros((size, grid))
    np.add.at(weights, (np.arange(size), low), 1 - (position - low))
    np.add.at(weights, (np.arange(size), high), position - low)
    basis = np.einsum("yi,xj->ijyx", weights, weights).reshape(grid * grid, size * size)
    return basis.astype(np.float32)


def _smooth_patterns(
    rng: np.random.Generator, count: int, size: int, scales: tuple[tuple[int, float], ...]
) -> np.ndarray:
    """``count`` smooth random RGB patterns (count, 3, size, size), float32: for each ``(cell, amplitude)``
    of ``scales``, N(0, 1) values on a grid of one point every ``cell`` pixels, quantised to 1/16, times
    ``amplitude``, upsampled bilinearly; summed over the scales (one matrix product).

    With integer amplitudes below 64 and cells of 4 or 8 pixels every product and sum of that matrix
    product is exact in float32 (at most 24 significant bits): the same bits whatever the BLAS, its
    threads or the CPU.
    """
    bases = [_upsampling(size, cell) for cell, _ in scales]
    amplitude = np.concatenate([np.full(len(basis), amp / 16, dtype=np.float32)
                                for basis, (_, amp) in zip(bases, scales, strict=True)])
    grid = np.rint(rng.standard_normal((count * 3, len(amplitude))) * 16).astype(np.float32) * amplitude
    return (grid @ np.concatenate(bases)).reshape(count, 3, size, size)


def _noise_table() -> np.ndarray:
    """256 float32 values: N(0, NOISE_STD)'s quantiles at (k + 1/2) / 256; a uniform random byte looked up
    here is Gaussian noise in 256 levels (|noise| < 2.9 NOISE_STD), far cheaper to draw than normals."""
    normal = NormalDist(0.0, NOISE_STD)
    return np.array([normal.inv_cdf((k + 0.5) / 256) for k in range(256)], dtype=np.float32)


def _balanced_labels(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.permutation(np.repeat(np.arange(NUM_CLASSES, dtype=np.int64), count // NUM_CLASSES))


def _images(rng: np.random.Generator, shifted: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """uint8 (N, 3, 32, 32) images of ``labels``; ``shifted[k, dy, dx]`` is class k's template window."""
    out = np.empty((len(labels), 3, _SIZE, _SIZE), dtype=np.uint8)
    noise_table = _noise_table()
    for start in range(0, len(labels), _CHUNK):
        chunk = labels[start:start + _CHUNK]
        n = len(chunk)
        dy = rng.integers(0, MAX_SHIFT + 1, size=n)
        dx = rng.integers(0, MAX_SHIFT + 1, size=n)
        distractor = _smooth_patterns(
            rng, n, _SIZE, ((CELL, DISTRACTOR_AMPLITUDE), (CELL // 2, FINE_DISTRACTOR_AMPLITUDE)))
        brightness = rng.standard_normal(n).astype(np.float32)[:, None, None, None]
        noise = noise_table[np.frombuffer(rng.bytes(n * 3 * _SIZE * _SIZE), dtype=np.uint8)]
        x = shifted[chunk, dy, dx]
        x += distractor
        x += np.float32(BRIGHTNESS_STD) * brightness + np.float32(128)
        x += noise.reshape(n, 3, _SIZE, _SIZE)
        np.rint(x, out=x)
        np.clip(x, 0, 255, out=x)
        out[start:start + n] = x
    return out


def synthetic_cifar10_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(train_images, train_labels, test_images, test_labels)``: uint8 (50,000, 32, 32, 3) and
    (10,000, 32, 32, 3) images (channels last, as torchvision's ``CIFAR10.data``) and int64 labels, by
    the module's recipe from :data:`SEED`; the same bytes in every call."""
    rng = np.random.default_rng(SEED)
    size = _SIZE + MAX_SHIFT
    templates = _smooth_patterns(rng, NUM_CLASSES, size, ((CELL, TEMPLATE_AMPLITUDE),))
    templates += rng.uniform(-COLOUR_AMPLITUDE, COLOUR_AMPLITUDE, size=(NUM_CLASSES, 3, 1, 1)).astype(np.float32)
    # Every class's template at every translation: (classes, dy, dx, 3, 32, 32), 10 MB.
    windows = np.lib.stride_tricks.sliding_window_view(templates, (_SIZE, _SIZE), axis=(2, 3))
    shifted = np.ascontiguousarray(windows.transpose(0, 2, 3, 1, 4, 5))
    train_labels = _balanced_labels(rng, NUM_TRAIN)
    test_labels = _balanced_labels(rng, NUM_TEST)
    train_images = _images(rng, shifted, train_labels)
    test_images = _images(rng, shifted, test_labels)
    # Channels-last views of the channels-first arrays, as torchvision's CIFAR10 holds its data.
    return train_images.transpose(0, 2, 3, 1), train_labels, test_images.transpose(0, 2, 3, 1), test_labels


class ArrayImageDataset(Dataset):
    """``(transform(image), label)`` over uint8 (N, H, W, C) images held in memory, item by item as
    torchvision's ``CIFAR10`` gives them: each image as a PIL image, then ``transform``.

    ``data`` and ``targets`` are named as ``CIFAR10``'s.
    """

    def __init__(self, data: np.ndarray, targets: list[int], transform: Callable | None = None) -> None:
        if len(data) != len(targets):
            raise ValueError(f"{len(data)} images but {len(targets)} labels.")
        self.data = data
        self.targets = targets
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        # lazy: PIL only where images are decoded
        from PIL import Image

        image = Image.fromarray(self.data[index])
        return (self.transform(image) if self.transform is not None else image), self.targets[index]


def load_synthetic_cifar10(root: str = "", download: bool = False, *, val_size: int = VAL_SIZE) -> DatasetSplits:
    """synthetic-cifar10 split 45,000 / 5,000 / 10,000 (train / validation / test) as CIFAR-10 is.

    ``root`` and ``download`` are ignored: the images are generated (a few seconds).
    """
    train_images, train_labels, test_images, test_labels = synthetic_cifar10_arrays()
    train_targets, test_targets = train_labels.tolist(), test_labels.tolist()
    return cifar_splits(
        ArrayImageDataset(train_images, train_targets, cifar_train_transform()),
        ArrayImageDataset(train_images, train_targets, cifar_eval_transform()),
        ArrayImageDataset(test_images, test_targets, cifar_eval_transform()),
        val_size=val_size,
        num_classes=NUM_CLASSES,
    )


def require_synthetic(root: str = "") -> None:
    """Never raises: the images are generated."""


DATASETS.register("synthetic-cifar10")(
    DatasetInfo(
        load=load_synthetic_cifar10,
        require=require_synthetic,
        num_classes=NUM_CLASSES,
        input_shape=INPUT_SHAPE,
        train_images=NUM_TRAIN - VAL_SIZE,
        val_images=VAL_SIZE,
        test_images=NUM_TEST,
        description=(
            "CIFAR-10-shaped synthetic images generated in memory (fixed seed; no files): 10 classes of "
            "smooth random colour templates, randomly shifted, plus per-image distractor patterns, "
            "brightness and pixel noise; split 45k/5k/10k, crop+flip, CIFAR statistics. For GPU "
            "benchmarks and smoke runs without a download."
        ),
    )
)
