"""OOD sets: the offline patches, the SVHN loader on a file in torchvision's layout, config checks, trial metrics."""

import numpy as np
import pytest
import scipy.io
import torch
from sklearn.metrics import roc_auc_score

from calib._config import ConfigError
from calib.config import parse_trial_config
from calib.datasets import DEFAULT_OOD, OOD_SETS, DatasetNotFoundError, load_ood
from calib.datasets.cifar import CIFAR_MEAN, CIFAR_STD
from calib.datasets.fashion_mnist import FASHION_MNIST_MEAN, FASHION_MNIST_STD, fashion_mnist_eval_transform
from calib.datasets.ood import NUM_FASHION_PATCHES, NUM_PATCHES, natural_patches, upsampled_digits
from calib.trial import run_trial


def test_natural_patches_are_fixed_and_in_the_digits_format():
    clean, noisy = natural_patches(noisy=False), natural_patches(noisy=True)
    assert clean.shape == (NUM_PATCHES, 1, 8, 8) and clean.dtype == np.float32
    assert clean.min() >= 0.0 and clean.max() <= 1.0
    assert np.array_equal(noisy, natural_patches(noisy=True))
    assert 0.25 < float((noisy - clean).std()) < 0.35  # digits-noisy's σ = 0.3
    images, labels = load_ood("natural-patches", "", False, "digits-noisy").tensors
    assert images.shape == (NUM_PATCHES, 1, 8, 8) and torch.all(labels == 0)


def test_digits_patches_are_unchanged():
    # Pinned when the 28×28 patches were added: the digits' OOD set stays the same images.
    clean, noisy = natural_patches(noisy=False), natural_patches(noisy=True)
    assert float(clean.sum(dtype=np.float64)) == pytest.approx(20053.1822565, rel=1e-9)
    assert float(noisy.sum(dtype=np.float64)) == pytest.approx(19954.1135317, rel=1e-9)
    assert float(clean[0, 0, 3, 5]) == pytest.approx(0.6867403, abs=1e-7)


def _pixels(images: torch.Tensor) -> np.ndarray:
    """The uint8 pixels behind Fashion-MNIST-normalised images (checked to be whole levels 0..255)."""
    levels = (images.double() * FASHION_MNIST_STD[0] + FASHION_MNIST_MEAN[0]) * 255
    assert torch.allclose(levels, levels.round(), atol=1e-4) and levels.min() > -0.5 and levels.max() < 255.5
    return levels.round().to(torch.uint8).numpy()


@pytest.mark.parametrize(("name", "count"), [("digits", 630), ("natural-patches", NUM_FASHION_PATCHES)])
def test_fashion_mnist_ood_sets(name, count):
    from PIL import Image

    assert name in DEFAULT_OOD["fashion-mnist"] and "fashion-mnist" in OOD_SETS.get(name).compatible
    images, labels = load_ood(name, "", False, "fashion-mnist").tensors
    assert images.shape == (count, 1, 28, 28) and images.dtype == torch.float32 and torch.all(labels == 0)
    sample = list(range(0, count, 10))
    pixels = _pixels(images[sample])
    transform = fashion_mnist_eval_transform()
    for k in (0, 1, len(sample) - 1):  # Fashion-MNIST's evaluation transform of the uint8 image, bit for bit
        expected = transform(Image.fromarray(pixels[k, 0]))
        assert torch.equal(images[sample[k]].view(torch.int32), expected.view(torch.int32))
    if name == "natural-patches":  # each patch stretched to the full range
        assert (pixels.min(axis=(1, 2, 3)) == 0).all() and (pixels.max(axis=(1, 2, 3)) == 255).all()
        first = natural_patches(noisy=False, side=28, count=51)  # the first 51 of the set
        assert np.array_equal(pixels[:6, 0], np.rint(first[::10, 0] * 255))


def test_upsampled_digits_are_bilinear():
    from calib.datasets.digits import digits_arrays, digits_split_indices

    images, labels = digits_arrays()
    small = images[digits_split_indices(labels)[2]][:, 0].astype(np.float64)
    # Half-pixel centres: output pixel y samples the input at (y + 1/2) · 8/28 − 1/2, clamped to [0, 7].
    position = np.clip((np.arange(28) + 0.5) * 8 / 28 - 0.5, 0, 7)
    low = np.floor(position).astype(int)
    high, frac = np.minimum(low + 1, 7), position - low
    rows = small[:, low] * (1 - frac)[None, :, None] + small[:, high] * frac[None, :, None]
    expected = rows[:, :, low] * (1 - frac) + rows[:, :, high] * frac
    upsampled = upsampled_digits()
    assert upsampled.shape == (630, 1, 28, 28)
    np.testing.assert_allclose(upsampled[:, 0], expected, atol=1e-6)
    images, _ = load_ood("digits", "", False, "fashion-mnist").tensors
    assert np.abs(_pixels(images)[:, 0] - expected * 255).max() <= 0.5 + 1e-9  # the nearest level (ties: either)


def test_load_ood_checks_the_in_distribution():
    with pytest.raises(ValueError, match=r"OOD set 'digits' fits the in-distribution datasets fashion-mnist, "
                                         r"got in_distribution='digits-noisy'\."):
        load_ood("digits", "", False, "digits-noisy")


def test_svhn_test_split_in_torchvision_layout(tmp_path, monkeypatch):
    # torchvision's SVHN reads <root>/test_32x32.mat: X (32, 32, 3, N) uint8, y (N, 1) with 10 for digit 0.
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(32, 32, 3, 5), dtype=np.uint8)
    scipy.io.savemat(tmp_path / "test_32x32.mat", {"X": x, "y": np.array([[10], [1], [2], [3], [4]])})
    # Only for these generated files: torchvision checks the md5 of the real archive.
    monkeypatch.setattr("torchvision.datasets.svhn.check_integrity", lambda *a, **k: True)
    dataset = load_ood("svhn", str(tmp_path), False, "cifar10")
    image, label = dataset[0]
    assert len(dataset) == 5 and image.shape == (3, 32, 32) and label == 0
    expected = (x[0, 0, 0, 0] / 255 - CIFAR_MEAN[0]) / CIFAR_STD[0]
    assert image[0, 0, 0].item() == pytest.approx(expected, abs=1e-6)
    # X is (row, column, channel, sample): sample 3's tensor [channel, row, column] is X[row, column, channel, 3].
    x[1, 2, 2, 3] = 255
    scipy.io.savemat(tmp_path / "test_32x32.mat", {"X": x, "y": np.array([[10], [1], [2], [3], [4]])})
    dataset = load_ood("svhn", str(tmp_path), False, "cifar100")
    assert dataset[3][0][2, 1, 2].item() == pytest.approx((1.0 - CIFAR_MEAN[2]) / CIFAR_STD[2], abs=1e-6)  # 2.753731
    assert [dataset[i][1] for i in range(len(dataset))] == [0] * 5  # every sample is OOD, whatever its digit


def test_missing_svhn_names_the_file_and_the_flag(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"test_32x32\.mat.*--download"):
        OOD_SETS.get("svhn").require(str(tmp_path))


def test_defaults_and_compatibility(make_config):
    assert DEFAULT_OOD["cifar10"] == ("cifar100", "svhn") and DEFAULT_OOD["cifar100"] == ("cifar10", "svhn")
    with pytest.raises(ConfigError, match=r"`ood_datasets` must hold OOD sets in the input format of 'digits-noisy'"):
        parse_trial_config({**make_config(), "ood_datasets": ["svhn"]})
    assert DEFAULT_OOD["fashion-mnist"] == ("digits", "natural-patches")
    fashion = {**make_config(), "dataset": "fashion-mnist", "arch": "resnet20"}
    assert parse_trial_config({**fashion, "ood_datasets": ["digits", "natural-patches"]}).ood_datasets
    with pytest.raises(ConfigError, match=r"in the input format of 'digits-noisy'; 'digits' fits fashion-mnist"):
        parse_trial_config({**make_config(), "ood_datasets": ["digits"]})
    with pytest.raises(ConfigError, match=r"in the input format of 'fashion-mnist'; 'svhn' fits cifar10"):
        parse_trial_config({**fashion, "ood_datasets": ["svhn"]})


def test_trial_ood_metrics_match_an_independent_auroc(make_config):
    result = run_trial({**make_config(method={"name": "vanilla"}), "ood_datasets": ["natural-patches"]})
    from calib.artifacts import get_or_train_stage1

    artifact, _ = get_or_train_stage1(parse_trial_config(make_config()), torch.device("cpu"))
    model = artifact.load_model()
    with torch.no_grad():
        ood_scores = model(torch.from_numpy(natural_patches(noisy=True))).double().softmax(1).max(1).values
    id_scores = artifact.splits["test"].logits.double().softmax(1).max(1).values
    expected = roc_auc_score(np.r_[np.ones(len(id_scores)), np.zeros(len(ood_scores))],
                             np.r_[id_scores.numpy(), ood_scores.numpy()])
    assert result.metrics["ood_auroc"] == pytest.approx(expected, abs=1e-6)
    assert result.details["ood_auroc_per_dataset"] == [pytest.approx(expected, abs=1e-6)]
    assert 0.0 <= result.metrics["ood_fpr95"] <= 1.0
    assert (artifact.path / "ood-natural-patches.pt").exists()
