"""The device pipeline (``stage1.data_pipeline: device``) on CPU tensors: the same batches, models and
artifacts as the DataLoader pipeline where nothing is random, its own checkpoints, and the execution
settings that never change a trial's identity."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from trial_fixtures import tiny_config

from calib._config import ConfigError
from calib.config import config_hash, parse_trial_config, stage1_identity, trial_identity
from calib.datasets import Augmentation, DatasetSplits, TensorData, TensorSplit, load_dataset
from calib.models import create_model
from calib.training import train_stage1
from calib.training.augment import to_model_input
from calib.training.batches import DeviceBatches, LoaderBatches, resolve_pipeline
from calib.training.compile import COMPILE_MODES, DEFAULT_MODE, resolve_compile_mode
from calib.training.stage1 import _compiled_forward, _excess_seconds, precision_of, predict
from calib.trial import run_trial

CPU = torch.device("cpu")


def digits() -> DatasetSplits:
    return load_dataset("digits-noisy", "")


def test_device_batches_are_the_loader_batches_without_augmentation():
    data = digits()
    loader = LoaderBatches(data.train, 64, torch.Generator().manual_seed(3), CPU, num_workers=0)
    device = DeviceBatches(data, 64, torch.Generator().manual_seed(3), CPU, torch.Generator().manual_seed(0))
    for epoch in range(2):  # the second epoch continues both generators
        pairs = list(zip(loader, device, strict=True))
        assert len(pairs) == 15, epoch  # ceil(898 / 64)
        for (x_loader, y_loader), (x_device, y_device) in pairs:
            assert torch.equal(x_loader, x_device) and torch.equal(y_loader, y_device)


@pytest.mark.parametrize("stage1", [{}, {"mixup_alpha": 0.4}], ids=["plain", "mixup"])
def test_both_pipelines_train_the_same_model_where_nothing_is_random(tmp_path, stage1):
    models = {}
    for pipeline in ("loader", "device"):
        cfg = parse_trial_config(tiny_config(tmp_path, epochs=2, data_pipeline=pipeline, **stage1))
        trained = train_stage1(cfg, digits(), CPU)
        assert trained.pipeline == pipeline and trained.precision == "fp32" and trained.compile_mode == "off"
        assert trained.compile_seconds == 0.0 and trained.peak_memory_bytes is None
        models[pipeline] = trained
    loader, device = models["loader"], models["device"]
    assert [r["train_loss"] for r in loader.history] == [r["train_loss"] for r in device.history]
    assert [r["val_ece"] for r in loader.history] == [r["val_ece"] for r in device.history]
    for (name, a), (_, b) in zip(loader.model.state_dict().items(), device.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def augmented_digits() -> DatasetSplits:
    """Digits as uint8 pixels with crop and flip: a small dataset that exercises the augmentation."""
    data = digits()
    images, labels = data.tensors.train.images, data.tensors.train.labels
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8)
    split = TensorSplit(pixels, labels, mean=(0.5,), std=(0.25,))
    return dataclasses.replace(data, tensor_loader=lambda: TensorData(split, split, split, Augmentation(2, True)))


def test_a_resumed_device_pipeline_draws_what_the_uninterrupted_run_drew(tmp_path):
    cfg = parse_trial_config(tiny_config(tmp_path, epochs=3, data_pipeline="device"))
    states = []
    full = train_stage1(cfg, augmented_digits(), CPU, on_checkpoint=lambda state: states.append(copy.deepcopy(state)))
    assert "augment_generator" in states[0]["batches"]
    resumed = train_stage1(cfg, augmented_digits(), CPU, resume=states[0])
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in full.history]
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_augmented_batches_stay_in_the_augmentations_range():
    data = augmented_digits()
    batches = DeviceBatches(data, 32, torch.Generator().manual_seed(0), CPU, torch.Generator().manual_seed(1))
    x, y = next(iter(batches))
    assert x.shape == (32, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    # zero padding normalised: (0 − 0.5) / 0.25 = −2 appears where a crop reached into the padding
    assert x.min() >= -2.0 and x.max() <= 2.0 and (x == -2.0).any()


def test_predict_reads_tensors_as_it_reads_the_dataset():
    data = digits()
    model = torch.nn.Module()
    from calib.models import create_model

    model = create_model("small_cnn", num_classes=10, in_channels=1)
    from_dataset = predict(model, data.val, CPU)
    from_tensors = predict(model, data.tensors.val, CPU)
    for a, b in zip(from_dataset, from_tensors, strict=True):
        assert torch.equal(a, b)


def test_pipeline_resolution():
    data = digits()
    assert resolve_pipeline("auto", data, CPU) == "loader"  # nothing changes on the CPU
    assert resolve_pipeline("device", data, CPU) == "device"
    assert resolve_pipeline("loader", data, CPU) == "loader"
    without = dataclasses.replace(data, tensor_loader=None)
    assert resolve_pipeline("auto", without, CPU) == "loader"
    with pytest.raises(ValueError, match="needs a dataset with a tensor view"):
        resolve_pipeline("device", without, CPU)


def test_compile_mode_and_precision_resolution():
    cuda = torch.device("cuda")
    assert resolve_compile_mode("auto", "resnet110", CPU) == "off"  # never on the CPU
    assert resolve_compile_mode("auto", "resnet110", cuda) == COMPILE_MODES["resnet110"] == "reduce-overhead"
    assert resolve_compile_mode("auto", "wrn26_10", cuda) == COMPILE_MODES["wrn26_10"] == "off"
    assert resolve_compile_mode("auto", "my_own_net", cuda) == DEFAULT_MODE == "off"
    assert resolve_compile_mode("max-autotune", "wrn26_10", cuda) == "max-autotune"
    assert resolve_compile_mode("off", "resnet110", cuda) == "off"
    assert precision_of(CPU, "bf16") == "fp32" and precision_of(cuda, "bf16") == "bf16"
    assert precision_of(cuda, "off") == "fp32"


def test_compile_seconds_are_the_steps_excess_over_the_median():
    assert _excess_seconds([40.0, 0.1, 0.1, 0.12, 0.1, 3.0]) == pytest.approx((40.0 - 0.11) + (3.0 - 0.11)
                                                                               + (0.12 - 0.11))
    assert _excess_seconds([]) == 0.0


def test_only_full_batches_run_the_compiled_graph(monkeypatch):
    """An epoch's last, shorter batch runs eagerly instead of compiling a second graph (what it cost on a GPU:
    docs/how-to/benchmarks.md); the results are the eager forward's either way."""
    seen_by_graph: list[int] = []

    def fake_compile(fn, mode):
        assert mode == "reduce-overhead"

        def graph(x):
            seen_by_graph.append(x.shape[0])
            return fn(x)
        return graph

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr("calib.training.stage1.enable_compile_caches", lambda: None)  # no cache environment
    torch.manual_seed(0)
    model = create_model("small_cnn", num_classes=10, in_channels=1).eval()
    forward = _compiled_forward(model, "reduce-overhead", batch_size=4)
    x = torch.randn(7, 1, 8, 8)
    for batch in (x[:4], x[4:]):
        features, logits = forward(batch)
        assert torch.equal(logits, model.head(model.features(batch)))
        assert torch.equal(features, model.features(batch))
    assert seen_by_graph == [4]  # the batch of 3 never reached the graph
    assert _compiled_forward(model, "off", batch_size=4)(x[4:])[1].shape == (3, 10)


def test_execution_settings_change_no_identity(tmp_path):
    base = parse_trial_config(tiny_config(tmp_path))
    other = parse_trial_config(tiny_config(tmp_path, data_pipeline="device", compile="auto", channels_last=False))
    assert config_hash(stage1_identity(base)) == config_hash(stage1_identity(other))
    assert config_hash(trial_identity(base)) == config_hash(trial_identity(other))
    assert other.stage1.data_pipeline == "device"
    precision = parse_trial_config(tiny_config(tmp_path, amp="bf16"))  # what is trained: a new identity
    assert config_hash(stage1_identity(precision)) != config_hash(stage1_identity(base))


def test_the_store_records_how_stage1_ran(tmp_path):
    result = run_trial(tiny_config(tmp_path, data_pipeline="device", method={"name": "vanilla"}))
    assert result.stage1_execution == {"stage1_pipeline": "device", "stage1_precision": "fp32",
                                       "stage1_compile_mode": "off", "stage1_peak_memory_bytes": None}
    assert result.timings["stage1_compile_seconds"] == 0.0
    from calib.store import read_trials, write_result

    write_result(tmp_path / "store", result)
    row = read_trials(tmp_path / "store").iloc[0]
    assert row["stage1_pipeline"] == "device" and row["stage1_precision"] == "fp32"
    assert row["stage1_data_pipeline"] == "device" and row["stage1_compile"] == "off"


def test_auto_sizes_the_tensors_without_building_them():
    from calib.training.batches import _tensor_bytes

    data = digits()
    assert _tensor_bytes(data) == 1797 * 1 * 8 * 8  # estimated as uint8 pixels: nothing decoded yet
    assert "_tensors" not in data.__dict__
    built = data.tensors.nbytes
    assert _tensor_bytes(data) == built == 1797 * 64 * 4 + 1797 * 8  # float32 images and int64 labels


def test_without_augmentation_the_device_batches_are_the_plain_images():
    data = augmented_digits()
    plain = DeviceBatches(data, 32, torch.Generator().manual_seed(0), CPU, torch.Generator().manual_seed(1),
                          augment=False)
    split = data.tensors.train
    for x, y, index in plain.indexed():
        assert torch.equal(x, to_model_input(split.images[index], split)) and torch.equal(y, split.labels[index])


class _Unreadable(torch.utils.data.Dataset):
    """The augmented training view, which ``stage1.augment: false`` must not read."""

    def __len__(self) -> int:
        return 898

    def __getitem__(self, index: int):
        raise AssertionError("stage1.augment=false read the augmented training images")


def test_augment_false_trains_on_the_plain_training_images(tmp_path):
    data = dataclasses.replace(digits(), train=_Unreadable())
    cfg = parse_trial_config(tiny_config(tmp_path, epochs=1, data_pipeline="loader", augment=False))
    trained = train_stage1(cfg, data, CPU)
    assert len(trained.history) == 1
    with pytest.raises(AssertionError, match="read the augmented training images"):
        train_stage1(parse_trial_config(tiny_config(tmp_path, epochs=1, data_pipeline="loader")), data, CPU)


def test_augment_is_part_of_the_stage1_identity_only_when_false(tmp_path):
    before = tiny_config(tmp_path)  # a config from before the field existed
    same = parse_trial_config(tiny_config(tmp_path, augment=True))
    plain = parse_trial_config(tiny_config(tmp_path, augment=False))
    assert config_hash(stage1_identity(same)) == config_hash(stage1_identity(parse_trial_config(before)))
    assert config_hash(stage1_identity(plain)) != config_hash(stage1_identity(same))
    with pytest.raises(ConfigError, match=r"`stage1.augment` must be true or false, got stage1.augment='no'\."):
        parse_trial_config(tiny_config(tmp_path, augment="no"))
