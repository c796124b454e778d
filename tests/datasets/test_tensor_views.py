"""The tensor view of every dataset (``DatasetSplits.tensors``, the device pipeline's input) against
its torch Datasets, on the tiny on-disk fakes of test_cifar.py and test_tiny_imagenet.py.

Contract: for every index i of train_eval / val / test,
``to_model_input(tensors.<split>.images[i:i+1], tensors.<split>)[0]`` is the Dataset's item i bit for
bit, with the same label; ``tensors.augmentation`` is what the ``train`` view's torchvision transform
adds, and with the same draws ``apply_augmentation`` + ``to_model_input`` give the ``train`` view's
items bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import test_cifar as cifar_fakes
import test_tiny_imagenet as tiny_imagenet_fakes
import torch
from torch.utils.data import Dataset
from torchvision import transforms

from calib.datasets import Augmentation, DatasetSplits, TensorData, TensorSplit, load_dataset
from calib.datasets import cifar as cifar_module
from calib.datasets import tiny_imagenet as tin
from calib.training.augment import AugmentationDraws, apply_augmentation, to_model_input

# The fakes' fixtures, under their own names (pytest finds fixtures among a module's attributes).
skip_md5_checks = cifar_fakes.skip_md5_checks
tiny_cifar10 = cifar_fakes.tiny_cifar10
tiny_cifar100 = cifar_fakes.tiny_cifar100
tiny_root = tiny_imagenet_fakes.tiny_root

CROP_FLIP = Augmentation(crop_padding=4, horizontal_flip=True)


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal dtype, shape and bits (``torch.equal`` alone would take -0.0 for 0.0)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if actual.is_floating_point():
        actual, expected = actual.view(torch.int32), expected.view(torch.int32)
    assert torch.equal(actual, expected)


def assert_contract(splits: DatasetSplits, sample: int | None = None, seed: int = 0) -> None:
    """Every item of train_eval / val / test (or, with ``sample``, the first, the last and ``sample``
    others drawn with ``seed``) equals its tensor view's."""
    rng = np.random.default_rng(seed)
    tensors = splits.tensors
    assert isinstance(tensors, TensorData)
    for dataset, split in ((splits.train_eval, tensors.train), (splits.val, tensors.val), (splits.test, tensors.test)):
        assert isinstance(split, TensorSplit)
        assert len(split.images) == len(split.labels) == len(dataset)
        assert split.labels.dtype == torch.int64 and split.images.dim() == 4
        assert split.images.shape[1:] == splits.input_shape
        assert split.images.is_contiguous()
        if split.images.dtype == torch.uint8:
            assert split.mean is not None and split.std is not None
        else:
            assert split.images.dtype == torch.float32 and split.mean is None and split.std is None
        indices = range(len(dataset)) if sample is None else [
            0, len(dataset) - 1, *rng.choice(len(dataset), size=sample, replace=False).tolist()]
        for i in indices:
            image, label = dataset[i]
            assert_same_bits(to_model_input(split.images[i:i + 1], split)[0], image)
            assert label == split.labels[i].item()


def train_transform(dataset: Dataset) -> transforms.Compose:
    """The torchvision transform of a ``train`` view (a Subset over a dataset with ``transform``)."""
    return dataset.dataset.transform


def assert_train_view_augmentation(splits: DatasetSplits, indices: list[int], seed: int = 0) -> None:
    """The ``train`` view's transform is crop(padding p) + flip + ToTensor + Normalize with
    ``tensors.augmentation``'s p; with torchvision's draws replayed, ``apply_augmentation`` +
    ``to_model_input`` give its items bit for bit.

    The draws: under ``torch.manual_seed(s)`` torchvision's ``RandomCrop`` draws (top, left) by
    ``RandomCrop.get_params`` on the padded image (two ``torch.randint``), then
    ``RandomHorizontalFlip`` flips when ``torch.rand(1) < 0.5``. They are replayed from the same seed
    before the item is taken, and the replayed crop is checked against what ``get_params`` returned
    for the item (a spy), so the replay is verified rather than assumed.
    """
    tensors = splits.tensors
    augmentation = tensors.augmentation
    steps = train_transform(splits.train).transforms
    assert [type(step).__name__ for step in steps] == ["RandomCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]
    assert steps[0].padding == augmentation.crop_padding and steps[0].size == splits.input_shape[1:]
    assert steps[0].fill == 0 and steps[0].padding_mode == "constant"
    assert augmentation.horizontal_flip and steps[1].p == 0.5
    assert (tuple(steps[3].mean), tuple(steps[3].std)) == (tensors.train.mean, tensors.train.std)

    height, width = splits.input_shape[1:]
    pad = augmentation.crop_padding
    padded = torch.zeros(3, height + 2 * pad, width + 2 * pad)
    get_params = transforms.RandomCrop.get_params
    crops: list[tuple[int, int, int, int]] = []

    def spy(img: object, output_size: tuple[int, int]) -> tuple[int, int, int, int]:
        crops.append(get_params(img, output_size))
        return crops[-1]

    flips, offsets = set(), set()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transforms.RandomCrop, "get_params", staticmethod(spy))
        for k, i in enumerate(indices):
            torch.manual_seed(seed + k)
            top, left, _, _ = get_params(padded, (height, width))
            flip = bool(torch.rand(1) < 0.5)
            torch.manual_seed(seed + k)
            image, label = splits.train[i]
            assert crops[-1] == (top, left, height, width)
            draws = AugmentationDraws(torch.tensor([top]), torch.tensor([left]), torch.tensor([flip]))
            augmented = apply_augmentation(tensors.train.images[i:i + 1], augmentation, draws)
            assert_same_bits(to_model_input(augmented, tensors.train)[0], image)
            assert label == tensors.train.labels[i].item()
            flips.add(flip)
            offsets.add((top, left))
    assert flips == {False, True} and len(offsets) > 1  # both branches and several crops were compared


class TestCifar:
    def test_cifar10(self, tiny_cifar10: dict) -> None:
        splits = cifar_module.load_cifar10(tiny_cifar10["root"], val_size=cifar_fakes.TINY_VAL_SIZE)
        assert splits.tensor_loader is not None
        assert_contract(splits)
        tensors = splits.tensors
        assert tensors.augmentation == CROP_FLIP
        assert tensors.train.mean == tensors.val.mean == tensors.test.mean == cifar_module.CIFAR_MEAN
        assert tensors.train.std == tensors.val.std == tensors.test.std == cifar_module.CIFAR_STD
        # The files' own pixels, in the FOCAL-R order, channels first.
        expected_train, expected_val = cifar_fakes._expected_split(cifar_fakes.NUM_TRAIN, cifar_fakes.TINY_VAL_SIZE)
        rows = torch.from_numpy(tiny_cifar10["train_rows"].reshape(-1, 3, 32, 32))
        assert torch.equal(tensors.train.images, rows[expected_train])
        assert torch.equal(tensors.val.images, rows[expected_val])
        assert torch.equal(tensors.test.images, torch.from_numpy(tiny_cifar10["test_rows"].reshape(-1, 3, 32, 32)))
        assert tensors.test.labels.tolist() == tiny_cifar10["test_labels"]
        assert splits.tensors is tensors  # built once, then kept
        assert_train_view_augmentation(splits, list(range(len(splits.train))))

    @pytest.mark.parametrize("test_norm", ["cifar", "focal_bug"])
    def test_cifar100(self, tiny_cifar100: dict, test_norm: str) -> None:
        splits = cifar_module.load_cifar100(
            tiny_cifar100["root"], val_size=cifar_fakes.TINY_VAL_SIZE, test_norm=test_norm
        )
        assert_contract(splits)
        tensors = splits.tensors
        assert tensors.augmentation == CROP_FLIP
        assert tensors.train.mean == tensors.val.mean == cifar_module.CIFAR_MEAN
        test_stats = (cifar_module.IMAGENET_MEAN, cifar_module.IMAGENET_STD) if test_norm == "focal_bug" else (
            cifar_module.CIFAR_MEAN, cifar_module.CIFAR_STD)
        assert (tensors.test.mean, tensors.test.std) == test_stats
        assert tensors.test.labels.tolist() == tiny_cifar100["test_entry"]["fine_labels"]
        assert_train_view_augmentation(splits, list(range(len(splits.train))), seed=100)


class TestTinyImageNet:
    def test_contract(self, tiny_root: Path) -> None:
        splits = tin.load_tiny_imagenet(str(tiny_root), val_per_class=tiny_imagenet_fakes.VAL_PER_CLASS)
        assert_contract(splits)
        tensors = splits.tensors
        assert tensors.augmentation == CROP_FLIP
        for split in (tensors.train, tensors.val, tensors.test):
            assert (split.mean, split.std) == (tin.IMAGENET_MEAN, tin.IMAGENET_STD)
            assert split.images.dtype == torch.uint8
        # The grayscale files are read as RGB: every channel the gray level.
        assert torch.all(tensors.test.images[2] == 200)
        assert_train_view_augmentation(splits, list(range(len(splits.train))))

    def test_tensors_are_built_on_first_read_only(self, tiny_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        calls = []
        decode = tin.decode_images
        monkeypatch.setattr(tin, "decode_images", lambda paths: calls.append(len(paths)) or decode(paths))
        splits = tin.load_tiny_imagenet(str(tiny_root), val_per_class=tiny_imagenet_fakes.VAL_PER_CLASS)
        splits.train_eval[0], splits.test[0]
        assert calls == [] and splits.tensor_loader is not None
        tensors = splits.tensors
        num_train = len(tiny_imagenet_fakes.WNIDS) * tiny_imagenet_fakes.TRAIN_PER_CLASS
        assert calls == [num_train, len(tiny_imagenet_fakes.TEST_ANNOTATIONS)]  # every file decoded once
        assert splits.tensors is tensors and len(calls) == 2
        # Train and validation are views of one decoded tensor.
        assert tensors.train.images.untyped_storage().data_ptr() == tensors.val.images.untyped_storage().data_ptr()

    def test_an_image_of_another_size_is_an_error(self, tiny_root: Path) -> None:
        from PIL import Image

        wnid = tiny_imagenet_fakes.WNIDS[0]
        Image.new("RGB", (32, 64)).save(tiny_root / tin.FOLDER / "train" / wnid / "images" / f"{wnid}_0.JPEG", "JPEG")
        splits = tin.load_tiny_imagenet(str(tiny_root), val_per_class=tiny_imagenet_fakes.VAL_PER_CLASS)
        with pytest.raises(ValueError, match=r"_0\.JPEG: expected a 64x64 image with 3 channels, got the shape "
                                             r"\(64, 32, 3\)"):
            splits.tensors  # noqa: B018


class TestDigits:
    @pytest.mark.parametrize("name", ["digits", "digits-noisy"])
    def test_contract(self, name: str) -> None:
        splits = load_dataset(name, "")
        assert_contract(splits)
        tensors = splits.tensors
        assert tensors.augmentation == Augmentation()
        assert tensors.train.images.dtype == torch.float32
        # No augmentation: the train view is train_eval, and the (empty) augmentation changes nothing.
        assert splits.train is splits.train_eval
        images = tensors.train.images[:7]
        draws = AugmentationDraws(torch.zeros(7, dtype=torch.long), torch.zeros(7, dtype=torch.long),
                                  torch.ones(7, dtype=torch.bool))
        assert_same_bits(apply_augmentation(images, tensors.augmentation, draws), images)


class TestDatasetSplitsTensors:
    def _splits(self, **kwargs: object) -> DatasetSplits:
        empty = torch.utils.data.TensorDataset(torch.zeros(0))
        return DatasetSplits(train=empty, train_eval=empty, val=empty, test=empty, num_classes=2,
                             input_shape=(1, 2, 2), **kwargs)

    def test_lazy(self) -> None:
        split = TensorSplit(torch.zeros(1, 1, 2, 2), torch.zeros(1, dtype=torch.int64))
        data = TensorData(split, split, split)
        calls = []
        splits = self._splits(tensor_loader=lambda: calls.append(1) or data)
        repr(splits)
        assert calls == []
        assert splits.tensors is data and splits.tensors is data and calls == [1]
        assert self._splits().tensors is None

    def test_assigning(self) -> None:
        split = TensorSplit(torch.zeros(1, 1, 2, 2), torch.zeros(1, dtype=torch.int64))
        data = TensorData(split, split, split)
        splits = self._splits(tensor_loader=lambda: pytest.fail("the loader must not run"))
        splits.tensors = data
        assert splits.tensors is data and splits.tensor_loader is None
        splits.tensors = None
        assert splits.tensors is None


def test_cifar_tensors_open_no_file(tiny_cifar10: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CIFAR tensors come from the datasets' arrays in memory: no file is opened to build them."""
    splits = cifar_module.load_cifar10(tiny_cifar10["root"], val_size=cifar_fakes.TINY_VAL_SIZE)
    import builtins

    def no_open(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a file was opened: {args}")

    monkeypatch.setattr(builtins, "open", no_open)
    monkeypatch.setattr(np, "load", no_open)
    assert splits.tensors.train.images.shape == (cifar_fakes.NUM_TRAIN - cifar_fakes.TINY_VAL_SIZE, 3, 32, 32)
