"""Tests for calib/datasets/synthetic.py: synthetic-cifar10's sizes, determinism, registration, transforms
and tensor view."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from test_tensor_views import CROP_FLIP, assert_contract, assert_train_view_augmentation

from calib.datasets import DATASETS, DatasetSplits, load_dataset, require_dataset, synthetic
from calib.datasets import cifar as cifar_module

SAMPLE = 60
"""Indices of each split compared item by item (seeded sample)."""
SHA256 = "9903d5184b023b200e376ea7b8926e9a0c77d08ef0547783475d4dc7c28ddbaf"
"""sha256 of ``synthetic_cifar10_arrays()`` (train images, train labels, test images, test labels, each
``.tobytes()``). Change it only on purpose: a different value means a different dataset (a change of the
recipe, or of NumPy's random streams), and numbers measured on the old one no longer compare."""


def _sha256(arrays: tuple[np.ndarray, ...]) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def splits() -> DatasetSplits:
    return load_dataset("synthetic-cifar10", "")


def test_registration() -> None:
    assert "synthetic-cifar10" in DATASETS.names()
    info = DATASETS.get("synthetic-cifar10")
    assert info.load is synthetic.load_synthetic_cifar10
    assert info.num_classes == 10 and info.input_shape == (3, 32, 32)
    assert "benchmark" in info.description and "download" in info.description
    require_dataset("synthetic-cifar10", "/nonexistent")  # never raises: nothing on disk


def test_sizes_and_layout(splits: DatasetSplits) -> None:
    assert splits.num_classes == 10 and splits.input_shape == (3, 32, 32)
    assert len(splits.train) == len(splits.train_eval) == 45_000
    assert len(splits.val) == 5_000 and len(splits.test) == 10_000
    train_idx, val_idx = cifar_module.focal_split_indices(50_000)
    assert splits.train.indices == splits.train_eval.indices == train_idx.tolist()
    assert splits.val.indices == val_idx.tolist()
    data = splits.train_eval.dataset.data
    assert data.shape == (50_000, 32, 32, 3) and data.dtype == np.uint8
    assert splits.test.data.shape == (10_000, 32, 32, 3)
    # Balanced classes: 5,000 training and 1,000 test images each.
    assert np.bincount(splits.train_eval.dataset.targets).tolist() == [5_000] * 10
    assert np.bincount(splits.test.targets).tolist() == [1_000] * 10
    image, label = splits.test[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and type(label) is int
    tensors = splits.tensors
    assert tensors.train.images.shape == (45_000, 3, 32, 32) and tensors.train.images.dtype == torch.uint8
    assert tensors.val.images.shape == (5_000, 3, 32, 32) and tensors.test.images.shape == (10_000, 3, 32, 32)
    assert tensors.nbytes == 60_000 * (3 * 32 * 32 + 8)


def test_pixels_use_the_range(splits: DatasetSplits) -> None:
    # Not a constant or saturated image set: the values spread over 0..255, few clipped.
    data = splits.test.data
    assert 110 < data.mean() < 150 and 40 < data.std() < 70
    assert (data == 0).mean() < 0.05 and (data == 255).mean() < 0.05


def test_deterministic() -> None:
    first = synthetic.synthetic_cifar10_arrays()
    np.random.seed(123)  # the global generators play no part
    torch.manual_seed(123)
    second = synthetic.synthetic_cifar10_arrays()
    # The same bytes in both calls, and as when SHA256 was taken (in another process).
    assert _sha256(first) == _sha256(second) == SHA256


def test_upsampling_is_exact() -> None:
    # The float32 matrix product equals the float64 one: no rounding, so no dependence on the BLAS.
    scales = ((synthetic.CELL, synthetic.DISTRACTOR_AMPLITUDE),
              (synthetic.CELL // 2, synthetic.FINE_DISTRACTOR_AMPLITUDE))
    patterns = synthetic._smooth_patterns(np.random.default_rng(0), 500, 32, scales)
    rng = np.random.default_rng(0)
    bases = [synthetic._upsampling(32, cell).astype(np.float64) for cell, _ in scales]
    grid = np.rint(rng.standard_normal((1500, sum(len(b) for b in bases))) * 16)
    amplitude = np.concatenate([np.full(len(b), amp / 16) for b, (_, amp) in zip(bases, scales, strict=True)])
    exact = ((grid * amplitude) @ np.concatenate(bases)).reshape(500, 3, 32, 32)
    assert patterns.dtype == np.float32 and np.array_equal(patterns.astype(np.float64), exact)


def test_classes_differ(splits: DatasetSplits) -> None:
    # Class means (the templates seen through noise and shifts) are farther apart than a pixel's noise.
    data = splits.train_eval.dataset.data.astype(np.float32)
    labels = np.asarray(splits.train_eval.dataset.targets)
    means = np.stack([data[labels == k].mean(0) for k in range(10)])
    distances = np.sqrt(((means[:, None] - means[None]) ** 2).mean(axis=(2, 3, 4)))
    assert distances[~np.eye(10, dtype=bool)].min() > 5


def test_contract(splits: DatasetSplits) -> None:
    assert_contract(splits, sample=SAMPLE)
    assert splits.tensors.augmentation == CROP_FLIP
    for split in (splits.tensors.train, splits.tensors.val, splits.tensors.test):
        assert (split.mean, split.std) == (cifar_module.CIFAR_MEAN, cifar_module.CIFAR_STD)


def test_train_view_augmentation(splits: DatasetSplits) -> None:
    indices = np.random.default_rng(1).choice(45_000, size=SAMPLE, replace=False).tolist()
    assert_train_view_augmentation(splits, indices)
