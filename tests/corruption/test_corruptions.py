"""Corrupted test sets in the CIFAR-C layout: the generator, the loader, and a trial's per-severity metrics."""

import numpy as np
import pytest
import torch

from calib._config import ConfigError
from calib.config import parse_trial_config
from calib.datasets import DatasetNotFoundError, load_dataset
from calib.datasets.cifar import CIFAR_MEAN, CIFAR_STD
from calib.datasets.corruptions import (
    CORRUPTIONS,
    GENERATED,
    SEVERITIES,
    ensure_digits_c,
    generate_corrupted,
    load_corrupted,
)
from calib.metrics import expected_calibration_error
from calib.trial import run_trial


def test_nineteen_corruptions():
    assert len(CORRUPTIONS) == 19 and set(GENERATED) < set(CORRUPTIONS)


def test_generated_layout(tmp_path):
    rng = np.random.default_rng(0)
    images, labels = rng.random((6, 8, 8, 1)), np.arange(6)
    directory = generate_corrupted(images, labels, tmp_path / "x-C", ("contrast", "brightness"))
    contrast = np.load(directory / "contrast.npy")
    assert contrast.shape == (30, 8, 8, 1) and contrast.dtype == np.uint8
    assert np.array_equal(np.load(directory / "labels.npy"), np.tile(labels, 5))
    # severity 1 contrast: (x − mean)·0.75 + mean, per image, then clipped and quantised
    mean = images.mean(axis=(1, 2, 3), keepdims=True)
    expected = np.uint8(np.round(np.clip((images - mean) * 0.75 + mean, 0, 1) * 255))
    assert np.array_equal(contrast[:6], expected)
    brightness = np.load(directory / "brightness.npy")[24:]  # severity 5: + 0.3
    assert np.array_equal(brightness, np.uint8(np.round(np.clip(images + 0.3, 0, 1) * 255)))
    assert not [p for p in directory.iterdir() if p.name.startswith(".")]
    with pytest.raises(ValueError, match="cannot generate corruption 'frost'"):
        generate_corrupted(images, labels, tmp_path / "y", ("frost",))


def test_severity_grows_the_damage(tmp_path):
    directory = ensure_digits_c(tmp_path)
    clean = np.load(directory / "gaussian_noise.npy").astype(float)
    labels = np.load(directory / "labels.npy")
    assert clean.shape[0] == 5 * 630 and len(labels) == 5 * 630
    test = load_dataset("digits", "").test.tensors[0].numpy().transpose(0, 2, 3, 1) * 255
    errors = [np.abs(clean[(s - 1) * 630:s * 630] - test).mean() for s in SEVERITIES]
    assert errors == sorted(errors)


def test_cifar_c_loader(tmp_path):
    # A tiny CIFAR-10-C: 4 test images × 5 severities of one corruption, uint8 (20, 32, 32, 3), labels tiled.
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, size=(20, 32, 32, 3), dtype=np.uint8)
    (tmp_path / "CIFAR-10-C").mkdir()
    np.save(tmp_path / "CIFAR-10-C" / "fog.npy", data)
    np.save(tmp_path / "CIFAR-10-C" / "labels.npy", np.tile(np.array([3, 1, 4, 1]), 5))
    images, labels = load_corrupted(str(tmp_path), "cifar10", "fog", 3).tensors
    assert images.shape == (4, 3, 32, 32) and labels.tolist() == [3, 1, 4, 1]
    expected = (data[8, 0, 0, 2] / 255 - CIFAR_MEAN[2]) / CIFAR_STD[2]  # severity 3 starts at row 2·4
    assert images[0, 2, 0, 0].item() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(DatasetNotFoundError, match=r"CIFAR-10-C not found: expected .*snow\.npy"):
        load_corrupted(str(tmp_path), "cifar10", "snow", 1)
    with pytest.raises(ValueError, match=r"`severity` must be one of 1\.\.5"):
        load_corrupted(str(tmp_path), "cifar10", "fog", 6)


def test_config_checks(make_config):
    with pytest.raises(ConfigError, match="`corruptions` must name corruptions from gaussian_noise"):
        parse_trial_config({**make_config(), "corruptions": ["rain"]})


def test_trial_per_severity_metrics(make_config, tmp_path):
    ensure_digits_c(tmp_path / "data")
    result = run_trial({**make_config(method={"name": "vanilla"}), "corruptions": ["contrast", "gaussian_noise"]})
    ece_all = result.details["corrupted_ece_all"]
    assert len(ece_all) == 10 and len(result.details["corrupted_ece_by_severity"]) == 5
    assert result.details["corrupted_ece_by_severity"][0] == pytest.approx((ece_all[0] + ece_all[5]) / 2)
    assert result.metrics["corrupted_ece"] == pytest.approx(np.mean(ece_all))
    from calib.artifacts import get_or_train_stage1

    artifact, _ = get_or_train_stage1(parse_trial_config(make_config()), torch.device("cpu"))
    images, labels = load_corrupted(str(tmp_path / "data"), "digits-noisy", "contrast", 2).tensors
    with torch.no_grad():
        probs = artifact.load_model()(images).double().softmax(1).numpy()
    assert ece_all[1] == pytest.approx(expected_calibration_error(probs, labels.numpy()), abs=1e-6)
