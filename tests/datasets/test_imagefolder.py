"""Tests for calib/datasets/imagefolder.py on small ImageFolder trees of PNGs written in tmp_path."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Subset
from torchvision import transforms
from torchvision.datasets.folder import IMG_EXTENSIONS

from calib._config import ConfigError
from calib.datasets import DATASETS, DatasetNotFoundError, dataset_options, load_dataset, require_dataset
from calib.datasets import imagefolder as imf

# Written in this (unsorted) order; labels follow the sorted names: bird 0, cat 1, dog 2.
TRAIN_COUNTS = {"dog": 10, "cat": 20, "bird": 10}
TEST_PER_CLASS = 3
SORTED = sorted(TRAIN_COUNTS)
MIXED_SIZES = ((12, 12), (16, 10))  # (width, height), alternating image by image
SAME_SIZE = ((12, 12),)


def _write_tree(
    root: Path,
    *,
    mode: str = "RGB",
    sizes: tuple[tuple[int, int], ...] = MIXED_SIZES,
    val_per_class: int = 0,
    seed: int = 0,
) -> Path:
    """train/<class>/NNN.png (TRAIN_COUNTS), test/<class>/ (3 a class), val/<class>/ when val_per_class > 0.

    Pixels are random; in an RGB tree, train/cat/003.png is grayscale (mode L), to be converted.
    """
    rng = np.random.default_rng(seed)
    channels = 3 if mode == "RGB" else 1
    counter = 0
    splits = {"train": TRAIN_COUNTS, "test": dict.fromkeys(TRAIN_COUNTS, TEST_PER_CLASS)}
    if val_per_class:
        splits["val"] = dict.fromkeys(TRAIN_COUNTS, val_per_class)
    for split, counts in splits.items():
        for name, count in counts.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for k in range(count):
                width, height = sizes[counter % len(sizes)]
                counter += 1
                shape = (height, width, channels) if channels == 3 else (height, width)
                pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
                image = Image.fromarray(pixels, mode)
                if mode == "RGB" and (split, name, k) == ("train", "cat", 3):
                    image = image.convert("L")
                image.save(folder / f"{k:03d}.png")
    return root


def _pixels(path: str, mode: str, transform: transforms.Compose | None = None) -> np.ndarray:
    """The image at ``path`` as float64 (H, W, C) in [0, 1], converted to ``mode`` and optionally transformed."""
    image = Image.open(path).convert(mode)
    if transform is not None:
        image = transform(image)
    array = np.asarray(image, dtype=np.float64) / 255.0
    return array[:, :, None] if array.ndim == 2 else array


def _normalize(dataset) -> transforms.Normalize:
    inner = dataset.dataset if isinstance(dataset, Subset) else dataset
    (step,) = [t for t in inner.transform.transforms if isinstance(t, transforms.Normalize)]
    return step


def _train_paths(splits) -> list[str]:
    return [splits.train_eval.dataset.samples[i][0] for i in splits.train_eval.indices]


class TestRegistry:
    def test_registered(self) -> None:
        info = DATASETS.get("imagefolder")
        assert info.options is imf.ImageFolderOptions
        assert info.num_classes is None and info.input_shape is None
        assert info.load is imf.load_imagefolder and info.require is imf.require_imagefolder

    def test_extensions_are_torchvisions(self) -> None:
        assert imf.IMAGE_EXTENSIONS == tuple(IMG_EXTENSIONS)

    def test_dataset_options_defaults(self) -> None:
        assert dataset_options("imagefolder", None) == {
            "image_size": None, "resize": None, "mean": None, "std": None, "val_fraction": 0.1}
        got = dataset_options("imagefolder", {"image_size": 8, "mean": (0.5, 0.5, 0.5), "std": [1, 1, 1]})
        assert got["mean"] == [0.5, 0.5, 0.5] and got["std"] == [1.0, 1.0, 1.0] and got["image_size"] == 8
        assert dataset_options("cifar10", None) == {} and dataset_options("cifar10", {}) == {}


class TestLoad:
    def test_image_size_shapes_and_labels(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path)
        splits = load_dataset("imagefolder", str(root), options={"image_size": 8})
        assert splits.num_classes == 3 and splits.input_shape == (3, 8, 8)
        assert splits.tensor_loader is None and splits.tensors is None
        for view in (splits.train, splits.train_eval, splits.val, splits.test):
            for index in (0, len(view) - 1):
                image, label = view[index]
                assert image.shape == (3, 8, 8) and image.dtype == torch.float32
                assert label in (0, 1, 2)
        test = splits.test
        assert test.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
        for path, label in test.samples:
            assert label == SORTED.index(Path(path).parent.name)
        assert Counter(test.targets) == {0: 3, 1: 3, 2: 3}
        # The training augmentation: padding image_size // 8, then a flip.
        train_steps = splits.train.dataset.transform.transforms
        crop = next(t for t in train_steps if isinstance(t, transforms.RandomCrop))
        assert crop.size == (8, 8) and crop.padding == 1
        assert any(isinstance(t, transforms.RandomHorizontalFlip) for t in train_steps)
        # The grayscale file of the RGB tree is read as RGB.
        gray_index = next(i for i, (p, _) in enumerate(splits.train_eval.dataset.samples)
                          if p.endswith(str(Path("cat", "003.png"))))
        assert splits.train_eval.dataset[gray_index][0].shape == (3, 8, 8)

    def test_resize_then_center_crop(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path)
        splits = imf.load_imagefolder(str(root), image_size=8, resize=10, mean=(0.5,) * 3, std=(0.5,) * 3)
        path, _ = splits.test.samples[1]  # a 16x10 image: resized to 16x10 (shorter side 10), then cropped
        expected = _pixels(path, "RGB", transforms.Compose([transforms.Resize(10), transforms.CenterCrop(8)]))
        expected = torch.from_numpy((expected.transpose(2, 0, 1) - 0.5) / 0.5).float()
        assert torch.allclose(splits.test[1][0], expected, atol=1e-6)

    def test_computed_stats_same_size(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path, sizes=SAME_SIZE)
        splits = imf.load_imagefolder(str(root))
        assert splits.input_shape == (3, 12, 12)
        paths = _train_paths(splits)
        assert len(paths) == 36  # 40 training images, 4 held out
        pixels = np.stack([_pixels(p, "RGB") for p in paths])  # (N, H, W, 3)
        mean, std = pixels.mean(axis=(0, 1, 2)), pixels.std(axis=(0, 1, 2))
        normalize = _normalize(splits.train_eval)
        np.testing.assert_allclose(normalize.mean, mean, rtol=1e-6)
        np.testing.assert_allclose(normalize.std, std, rtol=1e-6)
        for view in (splits.train, splits.val, splits.test):
            assert _normalize(view).mean == normalize.mean and _normalize(view).std == normalize.std
        image, _ = splits.train_eval[0]
        expected = (_pixels(paths[0], "RGB").transpose(2, 0, 1) - mean[:, None, None]) / std[:, None, None]
        assert torch.allclose(image, torch.from_numpy(expected).float(), atol=1e-5)

    def test_computed_stats_after_resize(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path)
        splits = imf.load_imagefolder(str(root), image_size=8)
        resize_crop = transforms.Compose([transforms.Resize(8), transforms.CenterCrop(8)])
        pixels = np.stack([_pixels(p, "RGB", resize_crop) for p in _train_paths(splits)])
        normalize = _normalize(splits.train_eval)
        np.testing.assert_allclose(normalize.mean, pixels.mean(axis=(0, 1, 2)), rtol=1e-6)
        np.testing.assert_allclose(normalize.std, pixels.std(axis=(0, 1, 2)), rtol=1e-6)

    def test_stats_sample(self) -> None:
        # More paths than max_images: the fixed-seed sample only.
        paths = [str(k) for k in range(10)]
        value = {str(k): float(k) for k in range(10)}

        def load(path: str) -> float:
            return value[path]

        def to_tensor(v: float) -> torch.Tensor:
            return torch.full((1, 2, 2), v)

        mean, std = imf.channel_stats(paths, load, to_tensor, max_images=4, seed=3)
        chosen = np.random.RandomState(3).choice(10, 4, replace=False)
        assert mean == pytest.approx((chosen.mean(),)) and std == pytest.approx((chosen.std(),))
        mean, std = imf.channel_stats(paths, load, to_tensor, max_images=10)
        assert mean == pytest.approx((4.5,)) and std == pytest.approx((np.std(range(10)),))

    def test_given_stats_applied(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path, sizes=SAME_SIZE)
        marked = root / "test" / "bird" / "000.png"
        pixels = np.asarray(Image.open(marked)).copy()
        pixels[0, 0] = (255, 0, 128)
        Image.fromarray(pixels).save(marked)
        splits = load_dataset("imagefolder", str(root),
                              options={"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.5, 1.0]})
        assert splits.test.samples[0][0] == str(marked)
        image, label = splits.test[0]
        assert label == 0
        assert image[:, 0, 0].tolist() == pytest.approx([2.0, -1.0, 128 / 255 - 0.5], abs=1e-6)

    def test_grayscale(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path, mode="L", sizes=SAME_SIZE)
        splits = imf.load_imagefolder(str(root))
        assert splits.input_shape == (1, 12, 12)
        assert splits.test[0][0].shape == (1, 12, 12) and splits.train[0][0].shape == (1, 12, 12)
        pixels = np.stack([_pixels(p, "L") for p in _train_paths(splits)])
        normalize = _normalize(splits.train_eval)
        np.testing.assert_allclose(normalize.mean, [pixels.mean()], rtol=1e-6)
        np.testing.assert_allclose(normalize.std, [pixels.std()], rtol=1e-6)
        with pytest.raises(ConfigError, match=r"`dataset_options\.mean` must have one value a channel: the images "
                                              r"have 1 \(L, from the first training image train/bird/000\.png\)"):
            imf.load_imagefolder(str(root), mean=(0.5,) * 3, std=(0.2,) * 3)

    def test_validation_split(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path, sizes=SAME_SIZE)
        first = load_dataset("imagefolder", str(root))
        second = load_dataset("imagefolder", str(root))
        assert first.val.indices == second.val.indices
        assert first.train_eval.indices == second.train_eval.indices == first.train.indices
        val, train = set(first.val.indices), set(first.train_eval.indices)
        assert not val & train and val | train == set(range(40))
        samples = first.val.dataset.samples
        # Stratified: 10 % of 10 / 20 / 10 images.
        assert Counter(samples[i][1] for i in val) == {0: 1, 1: 2, 2: 1}
        on_disk = {str(p) for p in (root / "train").rglob("*.png")}
        assert {samples[i][0] for i in val | train} == on_disk
        # As calib's stratified sample draws it with seed 1.
        expected_val, _ = imf.stratified_sample(np.asarray([label for _, label in samples]), 4, seed=1)
        assert sorted(val) == expected_val.tolist()
        bigger = imf.load_imagefolder(str(root), val_fraction=0.5)
        assert len(bigger.val) == 20 and len(bigger.train_eval) == 20

    def test_val_folder_used(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path, sizes=SAME_SIZE, val_per_class=2)
        splits = imf.load_imagefolder(str(root), val_fraction=0.5)  # ignored
        assert len(splits.train_eval) == len(splits.train) == 40
        assert len(splits.val) == 6
        assert {p for p, _ in splits.val.samples} == {str(p) for p in (root / "val").rglob("*.png")}
        assert Counter(splits.val.targets) == {0: 2, 1: 2, 2: 2}
        assert splits.val[0][0].shape == (3, 12, 12)


class TestErrors:
    def test_missing_test(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path)
        for path in (root / "test").rglob("*.png"):
            path.unlink()
        for folder in (root / "test").iterdir():
            folder.rmdir()
        (root / "test").rmdir()
        message = re.escape(f"expected the directory {root / 'test'}") + ".*train/<class>/<image>"
        with pytest.raises(DatasetNotFoundError, match=message):
            require_dataset("imagefolder", str(root))
        with pytest.raises(DatasetNotFoundError, match=message):
            load_dataset("imagefolder", str(root), options={"image_size": 8})
        with pytest.raises(DatasetNotFoundError, match=re.escape(str(tmp_path / "nowhere"))):
            require_dataset("imagefolder", str(tmp_path / "nowhere"))

    def test_no_class_folder(self, tmp_path: Path) -> None:
        (tmp_path / "train").mkdir()
        (tmp_path / "test").mkdir()
        with pytest.raises(DatasetNotFoundError, match=re.escape(f"{tmp_path / 'train'} holds no class folder")):
            require_dataset("imagefolder", str(tmp_path))

    def test_classes_disagree(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path, val_per_class=1)
        for path in (root / "test" / "cat").iterdir():
            path.unlink()
        (root / "test" / "cat").rmdir()
        (root / "val" / "horse").mkdir()
        Image.new("RGB", (12, 12)).save(root / "val" / "horse" / "0.png")
        message = re.escape("ImageFolder splits disagree on the classes: "
                            "test/ lacks 'cat'; val/ has 'horse', which train/ lacks.")
        with pytest.raises(ConfigError, match=message):
            require_dataset("imagefolder", str(root))
        with pytest.raises(ConfigError, match=message):
            load_dataset("imagefolder", str(root), options={"image_size": 8})

    def test_mixed_sizes_without_image_size(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path)
        require_dataset("imagefolder", str(root))  # sizes are not a path check
        message = (r"images differ in size: train/bird/000\.png is 12x12, train/bird/001\.png is 16x10 "
                   r"\(width x height\)\. Set image_size \(`--image-size`\)")
        with pytest.raises(ConfigError, match=message):
            load_dataset("imagefolder", str(root))

    def test_mixed_sizes_across_splits(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path, sizes=SAME_SIZE)
        Image.new("RGB", (16, 10)).save(root / "test" / "dog" / "000.png")
        with pytest.raises(ConfigError, match=r"is 12x12, test/dog/000\.png is 16x10"):
            imf.load_imagefolder(str(root))

    def test_mean_without_std(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path, sizes=SAME_SIZE)
        with pytest.raises(ConfigError, match=r"`dataset_options\.mean` must be given together with std"):
            load_dataset("imagefolder", str(root), options={"mean": [0.5, 0.5, 0.5]})
        with pytest.raises(ConfigError, match=r"`dataset_options\.std` must be given together with mean"):
            dataset_options("imagefolder", {"std": [0.5, 0.5, 0.5]})
        with pytest.raises(ConfigError, match=r"`std` must be given together with mean"):
            imf.load_imagefolder(str(root), std=(0.5,) * 3)

    def test_option_ranges(self) -> None:
        with pytest.raises(ConfigError, match=r"`dataset_options\.val_fraction` must be in \(0, 1\)"):
            dataset_options("imagefolder", {"val_fraction": 1.0})
        with pytest.raises(ConfigError, match=r"`dataset_options\.resize` must be given with image_size"):
            dataset_options("imagefolder", {"resize": 10})
        with pytest.raises(ConfigError, match=r"`dataset_options\.resize` must be at least image_size=8"):
            dataset_options("imagefolder", {"image_size": 8, "resize": 6})
        with pytest.raises(ConfigError, match=r"`dataset_options\.std` must hold positive values"):
            dataset_options("imagefolder", {"mean": [0.5], "std": [0.0]})
        with pytest.raises(ConfigError, match=r"`dataset_options\.image_size` must be an integer"):
            dataset_options("imagefolder", {"image_size": "big"})

    def test_val_fraction_too_small(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path, sizes=SAME_SIZE)
        with pytest.raises(ConfigError, match=r"val_fraction=0\.01 \(0 images\)"):
            imf.load_imagefolder(str(root), val_fraction=0.01)

    def test_empty_class_folder(self, tmp_path: Path) -> None:
        root = _write_tree(tmp_path, sizes=SAME_SIZE)
        for path in (root / "train" / "cat").iterdir():
            path.unlink()
        (root / "train" / "cat" / "notes.txt").write_text("no images here")
        message = re.escape(f"class folder {root / 'train' / 'cat'} holds no image file")
        with pytest.raises(ConfigError, match=message):
            require_dataset("imagefolder", str(root))
        with pytest.raises(ConfigError, match=message):
            imf.load_imagefolder(str(root))

    def test_options_for_dataset_without_options(self, tmp_path: Path) -> None:
        message = r"Dataset 'digits' takes no options, got dataset_options=\{'image_size': 8\}"
        with pytest.raises(ConfigError, match=message):
            load_dataset("digits", str(tmp_path), options={"image_size": 8})
        with pytest.raises(ConfigError, match="Dataset 'cifar10' takes no options"):
            dataset_options("cifar10", {"image_size": 8})

    def test_unknown_option_key(self) -> None:
        with pytest.raises(ConfigError, match=r"Unknown key 'dataset_options\.image_sise' for ImageFolderOptions\..*"
                                              r"Did you mean 'dataset_options\.image_size'\?"):
            dataset_options("imagefolder", {"image_sise": 8})
