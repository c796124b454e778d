"""Tests for calib/datasets/tiny_imagenet.py on a tiny tree written in the official archive's layout."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from calib.datasets import DATASETS, DatasetNotFoundError, load_dataset, require_dataset
from calib.datasets import tiny_imagenet as tin

# wnids.txt is not in sorted order, as in the official file: labels follow the file's line order,
# the held-out draw follows the sorted order.
WNIDS = ["n09999999", "n01443537", "n04067472"]
TRAIN_PER_CLASS = 6
VAL_PER_CLASS = 2
# Official validation images: file name → wnid (the test split).
TEST_ANNOTATIONS = {
    "val_0.JPEG": "n04067472",
    "val_1.JPEG": "n09999999",
    "val_2.JPEG": "n01443537",  # grayscale, every pixel 200
    "val_3.JPEG": "n04067472",
    "val_4.JPEG": "n09999999",
    "val_5.JPEG": "n01443537",  # RGB, every pixel (255, 0, 128)
}
GRAY_TRAIN = ("n04067472", "n04067472_3.JPEG")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _save_noise(path: Path, rng: np.random.Generator) -> None:
    Image.fromarray(rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)).save(path, "JPEG", quality=95)


def _write_tree(root: Path) -> Path:
    """``root/tiny-imagenet-200`` with 3 classes × 6 training images and 6 labelled validation images."""
    rng = np.random.default_rng(0)
    folder = root / "tiny-imagenet-200"
    folder.mkdir(parents=True)
    (folder / "wnids.txt").write_text("".join(f"{wnid}\n" for wnid in WNIDS))
    (folder / "words.txt").write_text("".join(f"{wnid}\tthing {k}\n" for k, wnid in enumerate(WNIDS)))
    for wnid in WNIDS:
        images = folder / "train" / wnid / "images"
        images.mkdir(parents=True)
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text(f"{wnid}_0.JPEG\t0\t0\t63\t63\n")
        for k in range(TRAIN_PER_CLASS):
            _save_noise(images / f"{wnid}_{k}.JPEG", rng)
    gray_wnid, gray_name = GRAY_TRAIN
    Image.new("L", (64, 64), 90).save(folder / "train" / gray_wnid / "images" / gray_name, "JPEG", quality=100)
    val_images = folder / "val" / "images"
    val_images.mkdir(parents=True)
    lines = []
    for name, wnid in TEST_ANNOTATIONS.items():
        _save_noise(val_images / name, rng)
        lines.append(f"{name}\t{wnid}\t0\t0\t63\t63\n")
    (folder / "val" / "val_annotations.txt").write_text("".join(lines))
    Image.new("L", (64, 64), 200).save(val_images / "val_2.JPEG", "JPEG", quality=100)
    Image.new("RGB", (64, 64), (255, 0, 128)).save(val_images / "val_5.JPEG", "JPEG", quality=100, subsampling=0)
    (folder / "test" / "images").mkdir(parents=True)
    _save_noise(folder / "test" / "images" / "test_0.JPEG", rng)  # unlabelled: never read
    return folder


@pytest.fixture()
def tiny_root(tmp_path: Path) -> Path:
    _write_tree(tmp_path / "data")
    return tmp_path / "data"


def _expected_split(val_per_class: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """ACLS/FeDLaS's code path with seed 1: global seed, sorted wnids, one np.random.shuffle a class, val last."""
    train, val = [], []
    state = np.random.get_state()
    try:
        np.random.seed(1)
        for wnid in sorted(WNIDS):
            names = sorted(f"{wnid}_{k}.JPEG" for k in range(TRAIN_PER_CLASS))
            np.random.shuffle(names)
            train += [(wnid, name) for name in names[:-val_per_class]]
            val += [(wnid, name) for name in names[-val_per_class:]]
    finally:
        np.random.set_state(state)
    return train, val


def _files(split: torch.utils.data.Subset) -> list[tuple[str, str]]:
    """(wnid, file name) of every image of a Subset over an ImageList, from its path train/<wnid>/images/<name>."""
    paths = [split.dataset.samples[i][0] for i in split.indices]
    return [(Path(path).parent.parent.name, Path(path).name) for path in paths]


def _normalised(path: Path) -> torch.Tensor:
    """ToTensor + Normalize by hand from the decoded RGB pixels."""
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64).transpose(2, 0, 1) / 255.0
    return torch.from_numpy((pixels - np.array(MEAN)[:, None, None]) / np.array(STD)[:, None, None]).float()


class TestLoadTinyImageNet:
    def test_splits_and_labels(self, tiny_root: Path) -> None:
        splits = tin.load_tiny_imagenet(str(tiny_root), val_per_class=VAL_PER_CLASS)
        assert splits.num_classes == len(WNIDS) and splits.input_shape == (3, 64, 64)
        num_train = len(WNIDS) * (TRAIN_PER_CLASS - VAL_PER_CLASS)
        assert len(splits.train) == len(splits.train_eval) == num_train
        assert len(splits.val) == len(WNIDS) * VAL_PER_CLASS and len(splits.test) == len(TEST_ANNOTATIONS)

        expected_train, expected_val = _expected_split(VAL_PER_CLASS)
        assert _files(splits.train) == expected_train and _files(splits.train_eval) == expected_train
        assert _files(splits.val) == expected_val
        every_file = {(wnid, f"{wnid}_{k}.JPEG") for wnid in WNIDS for k in range(TRAIN_PER_CLASS)}
        assert set(expected_train) | set(expected_val) == every_file
        assert set(expected_train).isdisjoint(expected_val)

        # Labels: the line of wnids.txt, not the sorted position.
        label_of = {"n09999999": 0, "n01443537": 1, "n04067472": 2}
        for split, files in ((splits.train_eval, expected_train), (splits.val, expected_val)):
            assert [split[i][1] for i in range(len(split))] == [label_of[wnid] for wnid, _ in files]
        # Test: the official val images in file-name order, labels from val_annotations.txt.
        assert [Path(path).name for path, _ in splits.test.samples] == sorted(TEST_ANNOTATIONS)
        assert [splits.test[i][1] for i in range(len(splits.test))] == [
            label_of[TEST_ANNOTATIONS[name]] for name in sorted(TEST_ANNOTATIONS)
        ]

    def test_held_out_selection_is_fixed(self, tiny_root: Path) -> None:
        first = tin.load_tiny_imagenet(str(tiny_root), val_per_class=VAL_PER_CLASS)
        np.random.seed(123)  # neither the global NumPy nor the torch state moves the split
        torch.manual_seed(123)
        second = tin.load_tiny_imagenet(str(tiny_root), val_per_class=VAL_PER_CLASS)
        assert _files(first.val) == _files(second.val) and _files(first.train) == _files(second.train)
        # Another held-out count draws again from the same seed.
        splits = tin.load_tiny_imagenet(str(tiny_root), val_per_class=1)
        assert _files(splits.val) == _expected_split(1)[1]
        assert len(splits.train) == len(WNIDS) * (TRAIN_PER_CLASS - 1)

    def test_eval_transform_known_pixels(self, tiny_root: Path) -> None:
        splits = tin.load_tiny_imagenet(str(tiny_root), val_per_class=VAL_PER_CLASS)
        names = [Path(path).name for path, _ in splits.test.samples]
        image, _ = splits.test[names.index("val_2.JPEG")]  # grayscale JPEG, every pixel 200
        assert image.shape == (3, 64, 64) and image.dtype == torch.float32
        # (200 / 255 − mean) / std, per channel, computed by hand.
        for channel, value in enumerate((1.307047, 1.465686, 1.681394)):
            torch.testing.assert_close(image[channel], torch.full((64, 64), value), atol=1e-5, rtol=0)
        image, _ = splits.test[names.index("val_5.JPEG")]  # RGB (255, 0, 128); JPEG may move a value by 1
        for channel, value in enumerate((2.248908, -2.035714, 0.426492)):
            torch.testing.assert_close(image[channel], torch.full((64, 64), value), atol=0.02, rtol=0)
        # Every split's eval view equals ToTensor + Normalize of the decoded file.
        folder = tiny_root / "tiny-imagenet-200"
        for split in (splits.train_eval, splits.val):
            for position in (0, len(split) - 1):
                wnid, name = _files(split)[position]
                torch.testing.assert_close(split[position][0], _normalised(folder / "train" / wnid / "images" / name))
        torch.testing.assert_close(splits.test[0][0], _normalised(folder / "val" / "images" / names[0]))

    def test_grayscale_training_image_is_read_as_rgb(self, tiny_root: Path) -> None:
        splits = tin.load_tiny_imagenet(str(tiny_root), val_per_class=VAL_PER_CLASS)
        split = splits.train_eval if GRAY_TRAIN in _files(splits.train_eval) else splits.val
        image, _ = split[_files(split).index(GRAY_TRAIN)]
        assert image.shape == (3, 64, 64)
        expected = [(90 / 255 - MEAN[c]) / STD[c] for c in range(3)]
        assert image[:, 10, 10].tolist() == pytest.approx(expected, abs=1e-5)

    def test_train_is_augmented_view_of_the_same_images(self, tiny_root: Path) -> None:
        splits = tin.load_tiny_imagenet(str(tiny_root), val_per_class=VAL_PER_CLASS)
        assert splits.train.dataset.samples is splits.train_eval.dataset.samples
        assert list(splits.train.indices) == list(splits.train_eval.indices)
        assert splits.val.dataset is splits.train_eval.dataset
        steps = splits.train.dataset.transform.transforms
        names = [type(step).__name__ for step in steps]
        assert names == ["RandomCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]
        assert steps[0].size == (64, 64) and steps[0].padding == 4
        assert tuple(steps[3].mean) == MEAN and tuple(steps[3].std) == STD
        eval_steps = splits.train_eval.dataset.transform.transforms
        assert [type(step).__name__ for step in eval_steps] == ["ToTensor", "Normalize"]
        for position in (0, len(splits.train) - 1):
            image, label = splits.train[position]
            assert image.shape == (3, 64, 64) and label == splits.train_eval[position][1]

    def test_registry_entry(self, tiny_root: Path) -> None:
        info = DATASETS.get("tiny-imagenet")
        assert info.load is tin.load_tiny_imagenet and info.require is tin.require_tiny_imagenet
        assert info.num_classes == 200 and info.input_shape == (3, 64, 64)
        require_dataset("tiny-imagenet", str(tiny_root))
        # The registry entry holds out the protocol's 50 a class: too many for 6 images a class.
        with pytest.raises(ValueError, match=r"\(class n01443537 has 6\), got val_per_class=50\."):
            load_dataset("tiny-imagenet", str(tiny_root))


class TestErrors:
    def test_missing_directory(self, tmp_path: Path) -> None:
        missing = tmp_path / "empty"
        missing.mkdir()
        message = (
            f"Tiny-ImageNet not found: expected the directory {missing}/tiny-imagenet-200 (the layout of the "
            f"official tiny-imagenet-200.zip). Pass --download to fetch it into {missing}, or point --data-root "
            f"at the directory that holds tiny-imagenet-200."
        )
        with pytest.raises(DatasetNotFoundError, match=re.escape(message)):
            tin.load_tiny_imagenet(str(missing))
        with pytest.raises(DatasetNotFoundError, match=re.escape(message)):
            require_dataset("tiny-imagenet", str(missing))

    def test_relative_root_is_reported_absolute(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.chdir(tmp_path)
        expected = os.path.join(os.path.abspath("data"), "tiny-imagenet-200")
        with pytest.raises(DatasetNotFoundError, match=re.escape(f"expected the directory {expected} ")):
            tin.require_tiny_imagenet("data")

    @pytest.mark.parametrize("relative", ["wnids.txt", "val/val_annotations.txt"])
    def test_incomplete_directory_names_the_missing_file(self, tiny_root: Path, relative: str) -> None:
        path = tiny_root / "tiny-imagenet-200" / relative
        path.unlink()
        with pytest.raises(DatasetNotFoundError, match=re.escape(f"expected the file {path} ") + r".*--download"):
            tin.load_tiny_imagenet(str(tiny_root), val_per_class=VAL_PER_CLASS)

    def test_missing_class_directory(self, tiny_root: Path) -> None:
        images = tiny_root / "tiny-imagenet-200" / "train" / "n01443537" / "images"
        for path in images.iterdir():
            path.unlink()
        images.rmdir()
        message = f"expected the directory {images} for class n01443537"
        with pytest.raises(DatasetNotFoundError, match=re.escape(message)):
            tin.load_tiny_imagenet(str(tiny_root), val_per_class=VAL_PER_CLASS)

    def test_val_per_class(self, tiny_root: Path) -> None:
        with pytest.raises(ValueError, match=r"must be smaller than every class's number of training images "
                                             r"\(class n01443537 has 6\), got val_per_class=6\."):
            tin.load_tiny_imagenet(str(tiny_root), val_per_class=TRAIN_PER_CLASS)
        for bad in (0, -1, 2.0, True):
            with pytest.raises(ValueError, match=re.escape(f"must be an integer >= 1, got val_per_class={bad!r}.")):
                tin.load_tiny_imagenet(str(tiny_root), val_per_class=bad)  # type: ignore[arg-type]

    def test_unannotated_test_image(self, tiny_root: Path) -> None:
        extra = tiny_root / "tiny-imagenet-200" / "val" / "images" / "val_6.JPEG"
        Image.new("RGB", (64, 64)).save(extra, "JPEG")
        with pytest.raises(ValueError, match=re.escape(f"{extra} has no line in")):
            tin.load_tiny_imagenet(str(tiny_root), val_per_class=VAL_PER_CLASS)


class TestDownload:
    def test_fetches_the_official_archive_when_missing(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        calls = []

        def fake_download(url: str, download_root: str, **kwargs: object) -> None:
            calls.append((url, download_root, kwargs))
            _write_tree(Path(download_root))  # what extracting the zip into the root leaves

        monkeypatch.setattr("torchvision.datasets.utils.download_and_extract_archive", fake_download)
        root = str(tmp_path / "data")
        splits = tin.load_tiny_imagenet(root, download=True, val_per_class=VAL_PER_CLASS)
        assert len(splits.test) == len(TEST_ANNOTATIONS)
        assert calls == [
            (
                "http://cs231n.stanford.edu/tiny-imagenet-200.zip",
                root,
                {"filename": "tiny-imagenet-200.zip", "md5": "90528d7ca1a48142e341f4ef8d21d0de"},
            )
        ]
        # Complete files: nothing is fetched again.
        tin.load_tiny_imagenet(root, download=True, val_per_class=VAL_PER_CLASS)
        assert len(calls) == 1
