"""scikit-learn's bundled 8×8 digits: ``digits`` (clean) and ``digits-noisy`` (the embedded default).

Both ship with scikit-learn, so they load offline, on CPU, in milliseconds. ``root`` and
``download`` are accepted for the common loader signature and ignored; ``require`` never raises.

The split is fixed (seed :data:`SPLIT_SEED`), independent of the trial seed, so every trial of a
study sees the same train/validation/test images: 898 / 269 / 630 of the 1,797 images
(50% / 15% / 35%, stratified by class).

``tensors``: the datasets' own float32 tensors, taken as they are (no normalisation, no augmentation).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
from torch.utils.data import TensorDataset

from calib.datasets import DATASETS
from calib.datasets._base import Augmentation, DatasetInfo, DatasetSplits, TensorData, TensorSplit

__all__ = [
    "DIGITS_TRAIN_IMAGES",
    "DIGITS_VAL_IMAGES",
    "INPUT_SHAPE",
    "NOISE_SEED",
    "NOISE_STD",
    "NUM_CLASSES",
    "SPLIT_SEED",
    "TEST_FRACTION",
    "TRAIN_FRACTION",
    "VAL_FRACTION",
    "LabelledTensorDataset",
    "digits_arrays",
    "digits_split_indices",
    "load_digits_clean",
    "load_digits_noisy",
    "require_digits",
]

NUM_CLASSES = 10
INPUT_SHAPE = (1, 8, 8)

SPLIT_SEED = 0
"""Seed of the stratified train/validation/test split; fixed, independent of the trial seed."""
TRAIN_FRACTION = 0.5
VAL_FRACTION = 0.15
TEST_FRACTION = 0.35
DIGITS_TRAIN_IMAGES = 898
"""Training images of the split (of scikit-learn's 1,797), checked against the split in the tests."""
DIGITS_VAL_IMAGES = 269
"""Validation images of the split, checked the same way."""
DIGITS_TEST_IMAGES = 630
"""Test images of the split, checked the same way."""

NOISE_STD = 0.3
"""Standard deviation σ of the additive Gaussian noise of ``digits-noisy``, on the [0, 1] pixel scale.

Why: clean digits are too easy to study calibration on (a small CNN reaches 98-99% test accuracy
with ECE ≈ 1%: nothing to calibrate). With σ = 0.3 and half the data for training, the same small
CNN reaches ≈ 80% test accuracy with ECE ≈ 9-12% after 60 epochs: training accuracy clearly above
test accuracy and visibly overconfident, the regime the papers study (docs/architecture.md, "Scale").
"""
NOISE_SEED = 1234
"""Seed of ``numpy.random.default_rng`` drawing the noise once: the noisy images are fixed, the same in
every call, every trial and every epoch (the noise is part of the dataset, not an augmentation)."""


class LabelledTensorDataset(TensorDataset):
    """A ``TensorDataset`` of (images, labels) whose items are ``(image_tensor, label_int)``.

    ``tensors`` stays available for full-batch access: ``images, labels = dataset.tensors``.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().__init__(images, labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:  # type: ignore[override]
        images, labels = self.tensors
        return images[index], int(labels[index])


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 clean images as float32 (N, 1, 8, 8) in [0, 1] (pixels / 16), and int64 labels (N,)."""
    from sklearn.datasets import load_digits  # imported here: scikit-learn takes a second or more to import

    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    labels = bunch.target.astype(np.int64)
    return images, labels


def digits_split_indices(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stratified (train, validation, test) indices into ``labels`` with the fixed :data:`SPLIT_SEED`.

    Two stratified ``train_test_split`` calls: 50% train, then the rest into 15% / 35% of the whole.
    """
    # lazy: scikit-learn takes a second or more to import
    from sklearn.model_selection import train_test_split

    all_indices = np.arange(len(labels))
    train_idx, rest_idx = train_test_split(
        all_indices, train_size=TRAIN_FRACTION, stratify=labels, random_state=SPLIT_SEED
    )
    val_idx, test_idx = train_test_split(
        rest_idx,
        test_size=TEST_FRACTION / (VAL_FRACTION + TEST_FRACTION),
        stratify=labels[rest_idx],
        random_state=SPLIT_SEED,
    )
    return train_idx, val_idx, test_idx


def _tensor_data(train: LabelledTensorDataset, val: LabelledTensorDataset, test: LabelledTensorDataset) -> TensorData:
    """The datasets' float32 images and labels (the same tensors), no normalisation, no augmentation."""
    return TensorData(
        train=TensorSplit(*train.tensors),
        val=TensorSplit(*val.tensors),
        test=TensorSplit(*test.tensors),
        augmentation=Augmentation(),
    )


def _make_splits(images: np.ndarray, labels: np.ndarray) -> DatasetSplits:
    train_idx, val_idx, test_idx = digits_split_indices(labels)

    def subset(indices: np.ndarray) -> LabelledTensorDataset:
        return LabelledTensorDataset(torch.from_numpy(images[indices]), torch.from_numpy(labels[indices]))

    train, val, test = subset(train_idx), subset(val_idx), subset(test_idx)
    return DatasetSplits(
        train=train,
        train_eval=train,  # no augmentation: the same dataset object
        val=val,
        test=test,
        num_classes=NUM_CLASSES,
        input_shape=INPUT_SHAPE,
        tensor_loader=partial(_tensor_data, train, val, test),
    )


def load_digits_clean(root: str = "", download: bool = False) -> DatasetSplits:
    """Clean digits split 50/15/35 (``root`` and ``download`` are ignored: the data ship with sklearn)."""
    images, labels = digits_arrays()
    return _make_splits(images, labels)


def load_digits_noisy(root: str = "", download: bool = False) -> DatasetSplits:
    """Digits plus fixed Gaussian noise (σ = :data:`NOISE_STD`, seed :data:`NOISE_SEED`), not clipped.

    The noise is drawn once over all 1,797 images (in scikit-learn's order), then the same split as
    ``digits`` is taken, so image i of a split is the clean image i plus its own fixed noise.
    ``root`` and ``download`` are ignored.
    """
    images, labels = digits_arrays()
    noise = np.random.default_rng(NOISE_SEED).normal(0.0, NOISE_STD, size=images.shape)
    noisy = (images + noise).astype(np.float32)
    return _make_splits(noisy, labels)


def require_digits(root: str = "") -> None:
    """Never raises: the digits ship with scikit-learn."""


DATASETS.register("digits")(
    DatasetInfo(
        load=load_digits_clean,
        require=require_digits,
        num_classes=NUM_CLASSES,
        input_shape=INPUT_SHAPE,
        description="scikit-learn 8x8 digits in [0, 1], fixed stratified split 50/15/35 (offline).",
        train_images=DIGITS_TRAIN_IMAGES,
        val_images=DIGITS_VAL_IMAGES,
        test_images=DIGITS_TEST_IMAGES,
    )
)
DATASETS.register("digits-noisy")(
    DatasetInfo(
        load=load_digits_noisy,
        require=require_digits,
        num_classes=NUM_CLASSES,
        input_shape=INPUT_SHAPE,
        train_images=DIGITS_TRAIN_IMAGES,
        val_images=DIGITS_VAL_IMAGES,
        test_images=DIGITS_TEST_IMAGES,
        description=(
            f"digits plus fixed Gaussian noise sigma={NOISE_STD} (seed {NOISE_SEED}), not clipped; "
            "the embedded default (~80% test accuracy, overconfident)."
        ),
    )
)
