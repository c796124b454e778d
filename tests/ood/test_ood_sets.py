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
from calib.datasets.ood import NUM_PATCHES, natural_patches
from calib.trial import run_trial


def test_natural_patches_are_fixed_and_in_the_digits_format():
    clean, noisy = natural_patches(noisy=False), natural_patches(noisy=True)
    assert clean.shape == (NUM_PATCHES, 1, 8, 8) and clean.dtype == np.float32
    assert clean.min() >= 0.0 and clean.max() <= 1.0
    assert np.array_equal(noisy, natural_patches(noisy=True))
    assert 0.25 < float((noisy - clean).std()) < 0.35  # digits-noisy's σ = 0.3
    images, labels = load_ood("natural-patches", "", False, "digits-noisy").tensors
    assert images.shape == (NUM_PATCHES, 1, 8, 8) and torch.all(labels == 0)


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
