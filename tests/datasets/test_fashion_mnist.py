"""Tests for calib/datasets/fashion_mnist.py on tiny IDX files written in torchvision's raw layout and in a fake
system folder."""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from test_tensor_views import assert_contract, assert_same_bits
from torchvision import transforms

from calib.datasets import DATASETS, Augmentation, DatasetNotFoundError, load_dataset, require_dataset
from calib.datasets import fashion_mnist as fm
from calib.training.augment import AugmentationDraws, apply_augmentation, to_model_input

# 200 training images with unequal classes (the proportional split rule), 50 test images.
TRAIN_COUNTS = (30, 25, 20, 20, 20, 20, 20, 15, 15, 15)
NUM_TRAIN = sum(TRAIN_COUNTS)
NUM_TEST = 50
TINY_VAL_SIZE = 20
# val_size · n_k / N = 3, 2.5, 2, 2, 2, 2, 2, 1.5, 1.5, 1.5: floors sum to 18; the two left over go to the
# largest remainders (0.5 for classes 1, 7, 8, 9), ties to the smaller classes, 1 and 7.
TINY_QUOTAS = (3, 3, 2, 2, 2, 2, 2, 2, 1, 1)
MEAN, STD = 0.2860, 0.3530


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    """An IDX file as the release ships it: big-endian int32 magic and dimensions, uint8 values, gzip."""
    header = magic.to_bytes(4, "big") + b"".join(size.to_bytes(4, "big") for size in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def write_files(folder: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """The four files in ``folder``: random pixels, shuffled labels, two known test pixels."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    train_labels = rng.permutation(np.repeat(np.arange(10), TRAIN_COUNTS)).astype(np.uint8)
    test_labels = rng.permutation(np.repeat(np.arange(10), NUM_TEST // 10)).astype(np.uint8)
    train_images = rng.integers(0, 256, size=(NUM_TRAIN, 28, 28), dtype=np.uint8)
    test_images = rng.integers(0, 256, size=(NUM_TEST, 28, 28), dtype=np.uint8)
    test_images[0, 0, 0], test_images[0, 27, 27] = 255, 0
    arrays = {"train_images": train_images, "train_labels": train_labels,
              "test_images": test_images, "test_labels": test_labels}
    for key, array in arrays.items():
        write_idx(folder / fm.FILES[key], array, fm.IMAGES_MAGIC if key.endswith("images") else fm.LABELS_MAGIC)
    return arrays


@pytest.fixture()
def no_system_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system folder points at an empty directory (the real Debian files, if installed, stay out)."""
    folder = tmp_path / "system"
    folder.mkdir()
    monkeypatch.setattr(fm, "SYSTEM_FOLDER", str(folder))
    return folder


@pytest.fixture()
def tiny_fashion_mnist(tmp_path: Path, no_system_folder: Path) -> dict:
    """A data root holding FashionMNIST/raw/ with the four files (torchvision's layout)."""
    root = tmp_path / "data"
    return {"root": str(root), **write_files(root / "FashionMNIST" / "raw")}


def _normalised(image: np.ndarray) -> torch.Tensor:
    """ToTensor + Normalize by hand from uint8 (28, 28) pixels."""
    return torch.from_numpy((image.astype(np.float64) / 255.0 - MEAN) / STD).float()[None]


def _expected_split(labels: np.ndarray, quotas: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """The documented rule: one RandomState(1), a permutation a class in class order, the first quota validate."""
    rng = np.random.RandomState(1)
    val = sorted(i for k in range(10) for i in rng.permutation(np.flatnonzero(labels == k))[:quotas[k]].tolist())
    return sorted(set(range(len(labels))) - set(val)), val


class TestReadIdx:
    def test_main(self, tmp_path: Path) -> None:
        images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
        write_idx(tmp_path / "images.gz", images, 2051)
        write_idx(tmp_path / "labels.gz", np.array([7, 0, 9], dtype=np.uint8), 2049)
        parsed = fm.read_idx(str(tmp_path / "images.gz"), fm.IMAGES_MAGIC)
        assert parsed.dtype == np.uint8 and parsed.shape == (2, 3, 4) and parsed.flags.writeable
        assert np.array_equal(parsed, images) and parsed[1, 2, 3] == 23
        assert fm.read_idx(str(tmp_path / "labels.gz"), fm.LABELS_MAGIC).tolist() == [7, 0, 9]

    def test_errors(self, tmp_path: Path) -> None:
        labels = tmp_path / "labels.gz"
        write_idx(labels, np.zeros(3, dtype=np.uint8), 2049)
        with pytest.raises(ValueError, match=re.escape(f"{labels}: not an IDX file of the expected kind: the magic "
                                                       "number must be 2051, got 2049.")):
            fm.read_idx(str(labels), fm.IMAGES_MAGIC)
        short = tmp_path / "short.gz"
        with gzip.open(short, "wb") as handle:
            handle.write((2049).to_bytes(4, "big") + (5).to_bytes(4, "big") + bytes(4))
        with pytest.raises(ValueError, match=re.escape(f"{short}: an IDX file of shape (5,) has 13 bytes, got 12.")):
            fm.read_idx(str(short), fm.LABELS_MAGIC)
        plain = tmp_path / "plain.gz"
        plain.write_bytes(b"not gzip")
        with pytest.raises(ValueError, match=re.escape(f"{plain}: not a readable gzip file")):
            fm.read_idx(str(plain), fm.LABELS_MAGIC)


class TestStratifiedSplitIndices:
    def test_main(self) -> None:
        labels = np.random.default_rng(3).permutation(np.repeat(np.arange(10), TRAIN_COUNTS))
        train_idx, val_idx = fm.stratified_split_indices(labels, val_size=TINY_VAL_SIZE)
        assert np.bincount(labels[val_idx], minlength=10).tolist() == list(TINY_QUOTAS)
        expected_train, expected_val = _expected_split(labels, TINY_QUOTAS)
        assert val_idx.tolist() == expected_val and train_idx.tolist() == expected_train
        again = fm.stratified_split_indices(labels, val_size=TINY_VAL_SIZE)
        assert np.array_equal(again[0], train_idx) and np.array_equal(again[1], val_idx)
        other_seed = fm.stratified_split_indices(labels, val_size=TINY_VAL_SIZE, seed=2)[1]
        assert not np.array_equal(other_seed, val_idx)

    def test_balanced_classes_give_equal_shares(self) -> None:
        labels = np.tile(np.arange(10), 6000)  # Fashion-MNIST's 6,000 a class
        train_idx, val_idx = fm.stratified_split_indices(labels)
        assert len(train_idx) == 55_000 and len(val_idx) == 5_000
        assert np.bincount(labels[val_idx]).tolist() == [500] * 10

    def test_errors(self) -> None:
        labels = np.zeros(10, dtype=np.int64)
        for bad in (0, 10, True, 2.0):
            with pytest.raises(ValueError, match=re.escape(f"`val_size` must be an integer in [1, 10) for 10 "
                                                           f"labels, got val_size={bad!r}.")):
                fm.stratified_split_indices(labels, val_size=bad)  # type: ignore[arg-type]


class TestLoadFashionMnist:
    def test_main(self, tiny_fashion_mnist: dict) -> None:
        splits = fm.load_fashion_mnist(tiny_fashion_mnist["root"], val_size=TINY_VAL_SIZE)
        assert splits.num_classes == 10 and splits.input_shape == (1, 28, 28)
        assert len(splits.train) == len(splits.train_eval) == NUM_TRAIN - TINY_VAL_SIZE
        assert len(splits.val) == TINY_VAL_SIZE and len(splits.test) == NUM_TEST
        expected_train, expected_val = _expected_split(tiny_fashion_mnist["train_labels"], TINY_QUOTAS)
        assert list(splits.train.indices) == list(splits.train_eval.indices) == expected_train
        assert list(splits.val.indices) == expected_val

        image, label = splits.test[0]
        assert image.shape == (1, 28, 28) and image.dtype == torch.float32
        assert label == tiny_fashion_mnist["test_labels"][0]
        assert image[0, 0, 0].item() == pytest.approx(2.022663, abs=1e-5)  # (1 − 0.2860) / 0.3530
        assert image[0, 27, 27].item() == pytest.approx(-0.810198, abs=1e-5)  # (0 − 0.2860) / 0.3530
        for position, source in ((0, expected_train[0]), (-1, expected_train[-1])):
            image, label = splits.train_eval[position]
            torch.testing.assert_close(image, _normalised(tiny_fashion_mnist["train_images"][source]))
            assert label == tiny_fashion_mnist["train_labels"][source]
        for position, source in enumerate(expected_val):
            image, label = splits.val[position]
            torch.testing.assert_close(image, _normalised(tiny_fashion_mnist["train_images"][source]))
            assert label == tiny_fashion_mnist["train_labels"][source]
        assert [splits.test[i][1] for i in range(NUM_TEST)] == tiny_fashion_mnist["test_labels"].tolist()

    def test_system_folder(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        system = tmp_path / "usr-share"
        arrays = write_files(system, seed=1)
        monkeypatch.setattr(fm, "SYSTEM_FOLDER", str(system))
        root = tmp_path / "empty"
        root.mkdir()
        require_dataset("fashion-mnist", str(root))
        assert fm.fashion_mnist_folder(str(root)) == str(system)
        splits = fm.load_fashion_mnist(str(root), val_size=TINY_VAL_SIZE)
        torch.testing.assert_close(splits.test[3][0], _normalised(arrays["test_images"][3]))
        # Files in torchvision's layout come first.
        raw = write_files(root / "FashionMNIST" / "raw", seed=2)
        assert fm.fashion_mnist_folder(str(root)) == str(root / "FashionMNIST" / "raw")
        splits = fm.load_fashion_mnist(str(root), val_size=TINY_VAL_SIZE)
        torch.testing.assert_close(splits.test[3][0], _normalised(raw["test_images"][3]))

    def test_train_is_a_random_crop_without_flip(self, tiny_fashion_mnist: dict) -> None:
        splits = fm.load_fashion_mnist(tiny_fashion_mnist["root"], val_size=TINY_VAL_SIZE)
        steps = splits.train.dataset.transform.transforms
        assert [type(step).__name__ for step in steps] == ["RandomCrop", "ToTensor", "Normalize"]
        assert steps[0].size == (28, 28) and steps[0].padding == 2 and steps[0].fill == 0
        assert (tuple(steps[2].mean), tuple(steps[2].std)) == (fm.FASHION_MNIST_MEAN, fm.FASHION_MNIST_STD)
        tensors = splits.tensors
        assert tensors.augmentation == Augmentation(crop_padding=2, horizontal_flip=False) == fm.AUGMENTATION
        # torchvision's draws replayed (RandomCrop.get_params on the padded image), then the device pipeline's crop.
        offsets = set()
        padded = torch.zeros(1, 32, 32)
        for i in range(len(splits.train)):
            torch.manual_seed(i)
            top, left, _, _ = transforms.RandomCrop.get_params(padded, (28, 28))
            torch.manual_seed(i)
            image, label = splits.train[i]
            draws = AugmentationDraws(torch.tensor([top]), torch.tensor([left]), torch.tensor([False]))
            expected = to_model_input(apply_augmentation(tensors.train.images[i:i + 1], tensors.augmentation, draws),
                                      tensors.train)[0]
            assert_same_bits(image, expected)
            assert label == tensors.train.labels[i].item()
            offsets.add((top, left))
        assert len(offsets) > 5  # several crops were compared
        # A crop shifts the image: offset (0, 0) puts the original pixel (0, 0) at (2, 2), zeros above and left.
        pixels = tensors.train.images[:1]
        shifted = apply_augmentation(pixels, tensors.augmentation, AugmentationDraws(
            torch.tensor([0]), torch.tensor([0]), torch.tensor([False])))
        assert torch.equal(shifted[0, 0, 2:, 2:], pixels[0, 0, :26, :26]) and shifted[0, 0, :2].eq(0).all()

    def test_tensors_equal_the_datasets(self, tiny_fashion_mnist: dict, monkeypatch: pytest.MonkeyPatch) -> None:
        splits = fm.load_fashion_mnist(tiny_fashion_mnist["root"], val_size=TINY_VAL_SIZE)
        import builtins

        def no_open(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"a file was opened: {args}")

        with monkeypatch.context() as patch:  # the tensors come from the arrays in memory
            patch.setattr(builtins, "open", no_open)
            patch.setattr(gzip, "open", no_open)
            tensors = splits.tensors
        assert_contract(splits)
        for split in (tensors.train, tensors.val, tensors.test):
            assert split.images.dtype == torch.uint8 and split.images.shape[1:] == (1, 28, 28)
            assert (split.mean, split.std) == ((0.2860,), (0.3530,))
        expected_train, expected_val = _expected_split(tiny_fashion_mnist["train_labels"], TINY_QUOTAS)
        pixels = torch.from_numpy(tiny_fashion_mnist["train_images"])[:, None]
        assert torch.equal(tensors.train.images, pixels[expected_train])
        assert torch.equal(tensors.val.images, pixels[expected_val])
        assert torch.equal(tensors.test.images[:, 0], torch.from_numpy(tiny_fashion_mnist["test_images"]))
        assert splits.tensors is tensors

    def test_download_goes_through_torchvision(self, tmp_path: Path, no_system_folder: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
        calls = []

        class FakeFashionMNIST:  # what torchvision's download leaves in <root>/FashionMNIST/raw
            def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
                calls.append((root, train, download))
                write_files(Path(root) / "FashionMNIST" / "raw")

        monkeypatch.setattr("torchvision.datasets.FashionMNIST", FakeFashionMNIST)
        root = str(tmp_path / "fresh")
        splits = fm.load_fashion_mnist(root, download=True, val_size=TINY_VAL_SIZE)
        assert calls == [(root, True, True)] and len(splits.test) == NUM_TEST
        fm.load_fashion_mnist(root, download=True, val_size=TINY_VAL_SIZE)
        assert len(calls) == 1  # present: nothing is fetched

    def test_registry_entry(self, tiny_fashion_mnist: dict) -> None:
        info = DATASETS.get("fashion-mnist")
        assert info.load is fm.load_fashion_mnist and info.require is fm.require_fashion_mnist
        assert info.num_classes == 10 and info.input_shape == (1, 28, 28)
        # The registry entry holds out the protocol's 5,000 validation images: too many for 200.
        with pytest.raises(ValueError, match=r"got val_size=5000\."):
            load_dataset("fashion-mnist", tiny_fashion_mnist["root"])

    def test_errors(self, tmp_path: Path, no_system_folder: Path) -> None:
        missing = tmp_path / "empty"
        missing.mkdir()
        raw = missing / "FashionMNIST" / "raw"
        message = (
            f"Fashion-MNIST not found: expected the files train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
            f"t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz in {raw} (torchvision's layout) or in "
            f"{no_system_folder} (Debian package dataset-fashion-mnist). Pass --download to fetch them into {raw}, "
            f"or point --data-root at the directory that holds FashionMNIST/raw."
        )
        with pytest.raises(DatasetNotFoundError, match=re.escape(message)):
            fm.load_fashion_mnist(str(missing))
        with pytest.raises(DatasetNotFoundError, match=re.escape(message)):
            require_dataset("fashion-mnist", str(missing))
        # Three of the four files are not enough.
        arrays = write_files(raw)
        (raw / fm.FILES["test_labels"]).unlink()
        with pytest.raises(DatasetNotFoundError, match=re.escape(message)):
            fm.load_fashion_mnist(str(missing))
        # A bad file is named.
        write_idx(raw / fm.FILES["test_labels"], arrays["test_labels"][:-1], fm.LABELS_MAGIC)
        with pytest.raises(ValueError, match=re.escape(f"{raw / fm.FILES['test_labels']} holds 49 labels for the 50 "
                                                       f"images of {raw / fm.FILES['test_images']}.")):
            fm.load_fashion_mnist(str(missing), val_size=TINY_VAL_SIZE)
        write_idx(raw / fm.FILES["train_images"], arrays["train_labels"], fm.LABELS_MAGIC)
        with pytest.raises(ValueError, match=re.escape(f"{raw / fm.FILES['train_images']}: not an IDX file of the "
                                                       "expected kind: the magic number must be 2051, got 2049.")):
            fm.load_fashion_mnist(str(missing), val_size=TINY_VAL_SIZE)

    def test_relative_root_is_reported_absolute(self, tmp_path: Path, no_system_folder: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.chdir(tmp_path)
        expected = os.path.join(os.path.abspath("data"), "FashionMNIST", "raw")
        with pytest.raises(DatasetNotFoundError, match=re.escape(f"in {expected} (torchvision's layout)")):
            fm.require_fashion_mnist("data")


@pytest.mark.skipif(not os.path.isdir(fm.SYSTEM_FOLDER), reason="the dataset-fashion-mnist package is not installed")
def test_real_files_split_and_statistics() -> None:
    """On the real files: 500 validation images a class, and the normalisation constants (pixel mean and
    standard deviation of the 55,000 training-split images, to 4 decimals)."""
    labels = fm.read_idx(os.path.join(fm.SYSTEM_FOLDER, fm.FILES["train_labels"]), fm.LABELS_MAGIC)
    train_idx, val_idx = fm.stratified_split_indices(labels)
    assert np.bincount(labels[val_idx]).tolist() == [500] * 10 and len(train_idx) == 55_000
    images = fm.read_idx(os.path.join(fm.SYSTEM_FOLDER, fm.FILES["train_images"]), fm.IMAGES_MAGIC)
    pixels = images[train_idx].astype(np.float32) / 255
    assert round(float(pixels.mean(dtype=np.float64)), 4) == fm.FASHION_MNIST_MEAN[0]
    assert round(float(pixels.std(dtype=np.float64)), 4) == fm.FASHION_MNIST_STD[0]
