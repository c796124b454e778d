"""Tests for calib/datasets/cifar.py on tiny CIFAR directories written in the real on-disk format."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets.cifar

from calib.datasets import DATASETS, DatasetNotFoundError, load_dataset, require_dataset
from calib.datasets import cifar as cifar_module

IMAGES_PER_BATCH = 10
NUM_TRAIN = 5 * IMAGES_PER_BATCH  # CIFAR-10 has five training batches
NUM_TEST = IMAGES_PER_BATCH
TINY_VAL_SIZE = 5


def _pickle(path: Path, entry: dict) -> None:
    with open(path, "wb") as handle:
        pickle.dump(entry, handle)


def _random_rows(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` images as CIFAR stores them: uint8 rows of 3072 = 3 channels × 32 × 32, channel-major."""
    return rng.integers(0, 256, size=(count, 3072), dtype=np.uint8)


@pytest.fixture()
def skip_md5_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    # torchvision compares the md5 of every CIFAR file (batches and meta) with the official archive's.
    # The tiny files below cannot match, so, in these tests only, the checksum function used by
    # CIFAR10._check_integrity, CIFAR100._check_integrity and their _load_meta reports success.
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args, **kwargs: True)


@pytest.fixture()
def tiny_cifar10(tmp_path: Path, skip_md5_checks: None) -> dict:
    """A CIFAR-10 root with data_batch_1..5 and test_batch of 10 images each, and batches.meta."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    train_rows, train_labels = [], []
    for batch in range(1, 6):
        rows = _random_rows(rng, IMAGES_PER_BATCH)
        labels = rng.integers(0, 10, size=IMAGES_PER_BATCH).tolist()
        _pickle(
            folder / f"data_batch_{batch}", {"data": rows, "labels": labels, "batch_label": f"batch {batch}"}
        )
        train_rows.append(rows)
        train_labels += labels
    test_rows = _random_rows(rng, NUM_TEST)
    test_rows[0, 0] = 255  # channel 0 (red), pixel (0, 0)
    test_rows[0, 3071] = 0  # channel 2 (blue), pixel (31, 31)
    test_labels = rng.integers(0, 10, size=NUM_TEST).tolist()
    _pickle(folder / "test_batch", {"data": test_rows, "labels": test_labels})
    _pickle(folder / "batches.meta", {"label_names": [f"class_{k}" for k in range(10)], "num_vis": 3072})
    return {
        "root": str(tmp_path),
        "train_rows": np.concatenate(train_rows),
        "train_labels": train_labels,
        "test_rows": test_rows,
        "test_labels": test_labels,
    }


@pytest.fixture()
def tiny_cifar100(tmp_path: Path, skip_md5_checks: None) -> dict:
    """A CIFAR-100 root with train (50 images), test (10 images) and meta."""
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    entries = {}
    for name, count in (("train", NUM_TRAIN), ("test", NUM_TEST)):
        fine = rng.integers(0, 100, size=count).tolist()
        entries[name] = {
            "data": _random_rows(rng, count),
            "fine_labels": fine,
            "coarse_labels": [label // 5 for label in fine],
        }
        _pickle(folder / name, entries[name])
    _pickle(
        folder / "meta",
        {
            "fine_label_names": [f"fine_{k}" for k in range(100)],
            "coarse_label_names": [f"c{k}" for k in range(20)],
        },
    )
    return {"root": str(tmp_path), **{f"{name}_entry": entry for name, entry in entries.items()}}


def _normalised(row: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """What ToTensor + Normalize should give, computed by hand from a channel-major uint8 row."""
    pixels = row.reshape(3, 32, 32).astype(np.float64) / 255.0
    return torch.from_numpy((pixels - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]).float()


def _expected_split(num_train: int, val_size: int) -> tuple[list[int], list[int]]:
    """FOCAL-R's code path: seed the global NumPy generator with 1, shuffle a list, validation first."""
    indices = list(range(num_train))
    state = np.random.get_state()
    try:
        np.random.seed(1)
        np.random.shuffle(indices)
    finally:
        np.random.set_state(state)
    return indices[val_size:], indices[:val_size]


class TestFocalSplitIndices:
    def test_main(self) -> None:
        train_idx, val_idx = cifar_module.focal_split_indices(50_000)
        assert len(train_idx) == 45_000 and len(val_idx) == 5_000
        assert set(train_idx.tolist()).isdisjoint(val_idx.tolist())
        expected_train, expected_val = _expected_split(50_000, 5_000)
        assert val_idx.tolist() == expected_val
        assert train_idx.tolist() == expected_train

    def test_errors(self) -> None:
        with pytest.raises(ValueError, match=r"`val_size` must be in \[1, 50\).*got val_size=50\."):
            cifar_module.focal_split_indices(50, val_size=50)
        with pytest.raises(ValueError, match=r"got val_size=0\."):
            cifar_module.focal_split_indices(50, val_size=0)


class TestLoadCifar10:
    def test_main(self, tiny_cifar10: dict) -> None:
        splits = cifar_module.load_cifar10(tiny_cifar10["root"], val_size=TINY_VAL_SIZE)
        assert splits.num_classes == 10 and splits.input_shape == (3, 32, 32)
        assert len(splits.train) == len(splits.train_eval) == NUM_TRAIN - TINY_VAL_SIZE
        assert len(splits.val) == TINY_VAL_SIZE and len(splits.test) == NUM_TEST

        expected_train, expected_val = _expected_split(NUM_TRAIN, TINY_VAL_SIZE)
        assert list(splits.train.indices) == expected_train
        assert list(splits.train_eval.indices) == expected_train
        assert list(splits.val.indices) == expected_val
        assert set(expected_train).isdisjoint(expected_val)
        assert sorted(expected_train + expected_val) == list(range(NUM_TRAIN))

    def test_eval_transform_round_trip(self, tiny_cifar10: dict) -> None:
        splits = cifar_module.load_cifar10(tiny_cifar10["root"], val_size=TINY_VAL_SIZE)
        mean, std = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)

        image, label = splits.test[0]
        assert image.shape == (3, 32, 32) and image.dtype == torch.float32
        assert label == tiny_cifar10["test_labels"][0]
        # Two pixels by hand: red 255 at (0, 0) and blue 0 at (31, 31).
        assert image[0, 0, 0].item() == pytest.approx((1.0 - 0.4914) / 0.2023, abs=1e-5)  # 2.514088
        assert image[0, 0, 0].item() == pytest.approx(2.514088, abs=1e-5)
        assert image[2, 31, 31].item() == pytest.approx((0.0 - 0.4465) / 0.2010, abs=1e-5)  # -2.221393
        torch.testing.assert_close(image, _normalised(tiny_cifar10["test_rows"][0], mean, std))

        expected_train, expected_val = _expected_split(NUM_TRAIN, TINY_VAL_SIZE)
        for position in (0, len(expected_train) - 1):
            image, label = splits.train_eval[position]
            source = expected_train[position]
            torch.testing.assert_close(image, _normalised(tiny_cifar10["train_rows"][source], mean, std))
            assert label == tiny_cifar10["train_labels"][source]
        for position, source in enumerate(expected_val):
            image, label = splits.val[position]
            torch.testing.assert_close(image, _normalised(tiny_cifar10["train_rows"][source], mean, std))
            assert label == tiny_cifar10["train_labels"][source]
        assert [splits.test[i][1] for i in range(NUM_TEST)] == tiny_cifar10["test_labels"]

    def test_train_is_augmented_view_of_the_same_images(self, tiny_cifar10: dict) -> None:
        splits = cifar_module.load_cifar10(tiny_cifar10["root"], val_size=TINY_VAL_SIZE)
        transform = splits.train.dataset.transform
        names = [type(step).__name__ for step in transform.transforms]
        assert names == ["RandomCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]
        assert transform.transforms[0].padding == 4 and transform.transforms[0].size == (32, 32)
        for position in range(len(splits.train)):
            image, label = splits.train[position]
            assert image.shape == (3, 32, 32)
            assert label == splits.train_eval[position][1]

    def test_download_flag_skips_require_when_files_are_present(self, tiny_cifar10: dict) -> None:
        # download=True with complete files: torchvision's integrity check passes, nothing is fetched.
        splits = cifar_module.load_cifar10(tiny_cifar10["root"], download=True, val_size=TINY_VAL_SIZE)
        assert len(splits.test) == NUM_TEST

    def test_errors(self, tmp_path: Path, tiny_cifar10: dict) -> None:
        missing = tmp_path / "empty"
        missing.mkdir()
        message = (
            f"CIFAR-10 not found: expected the directory {missing}/cifar-10-batches-py "
            f"(the python version of CIFAR-10). Pass --download to fetch it into {missing}, "
            f"or point --data-root at the directory that holds cifar-10-batches-py."
        )
        with pytest.raises(DatasetNotFoundError, match=re.escape(message)):
            cifar_module.load_cifar10(str(missing))
        with pytest.raises(DatasetNotFoundError, match=re.escape(message)):
            require_dataset("cifar10", str(missing))
        with pytest.raises(FileNotFoundError):  # DatasetNotFoundError is a FileNotFoundError
            load_dataset("cifar10", str(missing))
        # The registry entry uses the protocol's 5,000 validation images: too many for 50 images.
        with pytest.raises(ValueError, match=r"got val_size=5000\."):
            load_dataset("cifar10", tiny_cifar10["root"])

    def test_relative_root_is_reported_absolute(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.chdir(tmp_path)
        expected = os.path.join(os.path.abspath("data"), "cifar-10-batches-py")
        with pytest.raises(DatasetNotFoundError, match=re.escape(f"expected the directory {expected} ")):
            cifar_module.require_cifar10("data")


class TestLoadCifar100:
    def test_main(self, tiny_cifar100: dict) -> None:
        splits = cifar_module.load_cifar100(tiny_cifar100["root"], val_size=TINY_VAL_SIZE)
        assert splits.num_classes == 100 and splits.input_shape == (3, 32, 32)
        assert len(splits.train) == len(splits.train_eval) == NUM_TRAIN - TINY_VAL_SIZE
        assert len(splits.val) == TINY_VAL_SIZE and len(splits.test) == NUM_TEST
        expected_train, expected_val = _expected_split(NUM_TRAIN, TINY_VAL_SIZE)
        assert list(splits.train_eval.indices) == expected_train
        assert list(splits.val.indices) == expected_val

        train_entry, test_entry = tiny_cifar100["train_entry"], tiny_cifar100["test_entry"]
        image, label = splits.val[0]
        torch.testing.assert_close(
            image,
            _normalised(
                train_entry["data"][expected_val[0]], cifar_module.CIFAR_MEAN, cifar_module.CIFAR_STD
            ),
        )
        assert label == train_entry["fine_labels"][expected_val[0]]
        image, label = splits.test[3]
        torch.testing.assert_close(
            image, _normalised(test_entry["data"][3], cifar_module.CIFAR_MEAN, cifar_module.CIFAR_STD)
        )
        assert label == test_entry["fine_labels"][3]

    def test_focal_bug_normalises_only_the_test_split_with_imagenet_statistics(
        self, tiny_cifar100: dict
    ) -> None:
        splits = cifar_module.load_cifar100(
            tiny_cifar100["root"], val_size=TINY_VAL_SIZE, test_norm="focal_bug"
        )
        train_entry, test_entry = tiny_cifar100["train_entry"], tiny_cifar100["test_entry"]
        imagenet = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
        torch.testing.assert_close(splits.test[0][0], _normalised(test_entry["data"][0], *imagenet))
        _, expected_val = _expected_split(NUM_TRAIN, TINY_VAL_SIZE)
        torch.testing.assert_close(
            splits.val[0][0],
            _normalised(
                train_entry["data"][expected_val[0]], cifar_module.CIFAR_MEAN, cifar_module.CIFAR_STD
            ),
        )

    def test_registry_entry_uses_cifar_statistics(self) -> None:
        info = DATASETS.get("cifar100")
        assert info.load is cifar_module.load_cifar100
        assert info.num_classes == 100 and info.input_shape == (3, 32, 32)

    def test_errors(self, tmp_path: Path, tiny_cifar100: dict) -> None:
        missing = tmp_path / "empty"
        missing.mkdir()
        with pytest.raises(
            DatasetNotFoundError,
            match=re.escape(f"CIFAR-100 not found: expected the directory {missing}/cifar-100-python"),
        ):
            require_dataset("cifar100", str(missing))
        with pytest.raises(
            ValueError,
            match=r"`test_norm` must be one of \['cifar', 'focal_bug'\], got test_norm='imagenet'\.",
        ):
            cifar_module.load_cifar100(tiny_cifar100["root"], val_size=TINY_VAL_SIZE, test_norm="imagenet")  # type: ignore[arg-type]


def test_folder_names_are_torchvisions() -> None:
    assert cifar_module.CIFAR10_FOLDER == torchvision.datasets.CIFAR10.base_folder
    assert cifar_module.CIFAR100_FOLDER == torchvision.datasets.CIFAR100.base_folder


def test_the_registries_load_without_torchvision() -> None:
    # Every study process and Ray worker imports them; torchvision takes seconds and only the loaders need it.
    import subprocess
    import sys

    code = "import sys, calib.trial, calib.datasets.ood; assert 'torchvision' not in sys.modules, 'torchvision'"
    subprocess.run([sys.executable, "-c", code], check=True)
