"""Tests for calib/datasets/digits.py: split sizes, stratification, determinism, the fixed noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from calib.datasets import DATASETS, DatasetSplits, load_dataset, require_dataset
from calib.datasets import digits as digits_module

NUM_IMAGES = 1797  # sklearn's bundled digits
SPLIT_SIZES = {"train": 898, "val": 269, "test": 630}  # 50% (floor) / 15% / 35% of 1,797


def _arrays(dataset: TensorDataset) -> tuple[np.ndarray, np.ndarray]:
    images, labels = dataset.tensors
    return images.numpy(), labels.numpy()


@pytest.fixture(scope="module", params=["digits", "digits-noisy"])
def splits(request: pytest.FixtureRequest) -> DatasetSplits:
    return load_dataset(request.param, root="/nonexistent/ignored")


class TestDigits:
    def test_main(self, splits: DatasetSplits) -> None:
        assert splits.num_classes == 10
        assert splits.input_shape == (1, 8, 8)
        assert splits.train is splits.train_eval  # no augmentation
        for name, size in SPLIT_SIZES.items():
            dataset = getattr(splits, name)
            assert len(dataset) == size
            image, label = dataset[0]
            assert image.shape == (1, 8, 8) and image.dtype == torch.float32
            assert type(label) is int and 0 <= label < 10
        assert sum(SPLIT_SIZES.values()) == NUM_IMAGES

    def test_pixel_range_of_clean_digits(self) -> None:
        images, _ = _arrays(load_dataset("digits", root="").train)
        assert images.min() == 0.0 and images.max() == 1.0

    def test_stratified(self, splits: DatasetSplits) -> None:
        _, all_labels = digits_module.digits_arrays()
        overall = np.bincount(all_labels, minlength=10) / len(all_labels)
        for name, size in SPLIT_SIZES.items():
            _, labels = _arrays(getattr(splits, name))
            counts = np.bincount(labels, minlength=10)
            # Stratified: each class count within one image of its share of the split.
            assert np.all(np.abs(counts - overall * size) <= 1.0), (name, counts)

    def test_split_indices_disjoint_and_cover_all(self) -> None:
        _, labels = digits_module.digits_arrays()
        train_idx, val_idx, test_idx = digits_module.digits_split_indices(labels)
        joined = np.concatenate([train_idx, val_idx, test_idx])
        assert len(joined) == NUM_IMAGES and set(joined.tolist()) == set(range(NUM_IMAGES))

    @pytest.mark.parametrize("name", ["digits", "digits-noisy"])
    def test_deterministic_across_calls(self, name: str) -> None:
        first, second = load_dataset(name, root=""), load_dataset(name, root="")
        for split in ("train", "val", "test"):
            images_a, labels_a = _arrays(getattr(first, split))
            images_b, labels_b = _arrays(getattr(second, split))
            np.testing.assert_array_equal(images_a, images_b)
            np.testing.assert_array_equal(labels_a, labels_b)

    def test_split_independent_of_global_seed(self) -> None:
        torch.manual_seed(0)
        np.random.seed(0)
        first = _arrays(load_dataset("digits-noisy", root="").test)[0]
        torch.manual_seed(99)
        np.random.seed(99)
        second = _arrays(load_dataset("digits-noisy", root="").test)[0]
        np.testing.assert_array_equal(first, second)

    def test_noisy_is_clean_plus_fixed_gaussian_noise(self) -> None:
        clean = load_dataset("digits", root="")
        noisy = load_dataset("digits-noisy", root="")
        differences = []
        for split in ("train", "val", "test"):
            clean_images, clean_labels = _arrays(getattr(clean, split))
            noisy_images, noisy_labels = _arrays(getattr(noisy, split))
            np.testing.assert_array_equal(clean_labels, noisy_labels)  # same split, same order
            differences.append((noisy_images - clean_images).ravel())
        noise = np.concatenate(differences)
        assert noise.size == NUM_IMAGES * 64
        # σ = 0.3 over 115,008 draws: the sample std is within ±0.003 with overwhelming probability.
        assert noise.std() == pytest.approx(digits_module.NOISE_STD, abs=0.003)
        assert abs(noise.mean()) < 0.003
        # Not clipped: noisy pixels leave [0, 1].
        noisy_train = _arrays(noisy.train)[0]
        assert noisy_train.min() < 0.0 and noisy_train.max() > 1.0

    def test_noise_matches_documented_seed(self) -> None:
        images, _ = digits_module.digits_arrays()
        expected = images + np.random.default_rng(digits_module.NOISE_SEED).normal(
            0.0, digits_module.NOISE_STD, size=images.shape
        )
        _, labels = digits_module.digits_arrays()
        train_idx, _, _ = digits_module.digits_split_indices(labels)
        noisy_train = _arrays(load_dataset("digits-noisy", root="").train)[0]
        np.testing.assert_allclose(noisy_train, expected[train_idx].astype(np.float32), rtol=0, atol=1e-6)

    def test_registry_entries(self) -> None:
        for name in ("digits", "digits-noisy"):
            info = DATASETS.get(name)
            assert info.num_classes == 10 and info.input_shape == (1, 8, 8)
            assert info.description
            require_dataset(name, root="/nonexistent")  # never raises: ships with scikit-learn

    def test_errors(self) -> None:
        with pytest.raises(KeyError, match=r"Unknown dataset 'digits_noisy'\. Did you mean 'digits-noisy'"):
            load_dataset("digits_noisy", root="")
