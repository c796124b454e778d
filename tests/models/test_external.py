"""Tests for calib/models/external.py and calib/models/checkpoints.py: torchvision/timm classifiers split into
features and a linear head, and users' checkpoints loaded into them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from calib._registry import UnknownNameError
from calib.models import (
    MODELS,
    CalibModel,
    CheckpointError,
    ExternalModel,
    HeadNotFoundError,
    check_arch,
    checkpoint_state_dict,
    create_model,
    external_model,
    load_checkpoint_into,
    read_checkpoint,
)

SHAPE = (3, 32, 32)


def randomize_batchnorm(model: nn.Module) -> nn.Module:
    """Non-trivial running statistics, so that eval-mode outputs depend on every buffer being loaded."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 1.5)
    return model


def trained_resnet18(num_classes: int = 10) -> nn.Module:
    """A torchvision resnet18 with random weights standing in for a user's trained model."""
    torch.manual_seed(1)
    return randomize_batchnorm(torchvision.models.resnet18(num_classes=num_classes)).eval()


def test_resnet18_checkpoint_round_trip(tmp_path: Path) -> None:
    original = trained_resnet18()
    path = tmp_path / "resnet18.pt"
    torch.save(original.state_dict(), path)
    model = external_model("torchvision:resnet18", 10, input_shape=SHAPE)
    assert isinstance(model, ExternalModel) and isinstance(model, CalibModel)
    assert (model.arch, model.head_name) == ("torchvision:resnet18", "fc")
    assert (model.num_features, model.num_classes) == (512, 10)
    assert isinstance(model.head, nn.Linear) and isinstance(model.backbone.fc, nn.Identity)
    assert model.training  # the construction check leaves the mode as torchvision built it

    x = torch.randn(4, *SHAPE)
    with torch.no_grad():
        before = model.eval()(x)
        load_checkpoint_into(model, read_checkpoint(str(path)))
        pooled: list[torch.Tensor] = []
        handle = original.avgpool.register_forward_hook(lambda _m, _i, out: pooled.append(out))
        expected = original(x)
        handle.remove()
        logits, features = model(x), model.features(x)
    assert not torch.allclose(before, expected)  # the weights were really replaced
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(features, torch.flatten(pooled[0], 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.head(features), logits)
    assert model.head.weight.data_ptr() != original.fc.weight.data_ptr()  # copied, not shared


def test_create_model_dispatches_external_names() -> None:
    model = create_model("torchvision:resnet18", num_classes=10, head="fc", input_shape=SHAPE)
    assert isinstance(model, ExternalModel) and model.head_name == "fc"
    assert type(create_model("small_cnn", num_classes=10)) is not ExternalModel  # calib names as before
    with pytest.raises(ValueError, match=r"calib's own architecture 'small_cnn' has its head built in"):
        create_model("small_cnn", num_classes=10, head="fc")


def test_construction_does_not_consume_extra_randomness() -> None:
    torch.manual_seed(0)
    model = external_model("torchvision:resnet18", 10)
    torch.manual_seed(0)
    direct = torchvision.models.get_model("resnet18", weights=None, num_classes=10)
    torch.testing.assert_close(model.head.weight, direct.fc.weight)
    torch.testing.assert_close(model.backbone.conv1.weight, direct.conv1.weight)


def test_mobilenet_auto_head_is_last_linear() -> None:
    model = external_model("torchvision:mobilenet_v3_small", 10, input_shape=SHAPE).eval()
    assert (model.head_name, model.num_features) == ("classifier.3", 1024)
    assert isinstance(model.backbone.classifier[3], nn.Identity)
    with torch.no_grad():
        assert model.features(torch.randn(2, *SHAPE)).shape == (2, 1024)


def test_one_channel_input_is_repeated() -> None:
    model = external_model("torchvision:resnet18", 10, in_channels=1, input_shape=(1, 32, 32)).eval()
    assert model.repeat_channels == 3
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.features(x), model.backbone(x.repeat(1, 3, 1, 1)))
        assert model(x).shape == (2, 10)
    with pytest.raises(ValueError, match=r"torchvision models take 3-channel images.*got in_channels=2"):
        external_model("torchvision:resnet18", 10, in_channels=2)
    with pytest.raises(ValueError, match=r"`input_shape` must be \(C, H, W\) with C = in_channels = 1"):
        external_model("torchvision:resnet18", 10, in_channels=1, input_shape=SHAPE)


@pytest.mark.parametrize("wrap", ["dataparallel", "compiled", "state_dict", "model_state_dict", "module_object"])
def test_wrapped_checkpoints_load(tmp_path: Path, wrap: str) -> None:
    original = trained_resnet18()
    state = original.state_dict()
    saved: object = {
        "dataparallel": {"module." + k: v for k, v in state.items()},
        "compiled": {"_orig_mod.module." + k: v for k, v in state.items()},
        "state_dict": {"state_dict": {"module." + k: v for k, v in state.items()}, "epoch": 3, "arch": "resnet18"},
        "model_state_dict": {"model_state_dict": state, "optimizer_state_dict": {"lr": 0.1}},
        "module_object": None,
    }[wrap]
    if saved is None:
        loaded = checkpoint_state_dict(nn.DataParallel(original))
    else:
        torch.save(saved, tmp_path / "ckpt.pt")
        loaded = read_checkpoint(tmp_path / "ckpt.pt")
    assert set(loaded) == set(state)
    model = external_model("torchvision:resnet18", 10)
    load_checkpoint_into(model, loaded)
    x = torch.randn(2, *SHAPE)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), original(x), atol=1e-5, rtol=1e-5)


def test_wrapper_state_dict_loads_as_is() -> None:
    source = external_model("torchvision:resnet18", 10)
    randomize_batchnorm(source)
    target = external_model("torchvision:resnet18", 10)
    load_checkpoint_into(target, source.state_dict())
    x = torch.randn(2, *SHAPE)
    with torch.no_grad():
        torch.testing.assert_close(target.eval()(x), source.eval()(x))


def test_calib_model_checkpoint_uses_keys_as_they_are() -> None:
    source = create_model("small_cnn", num_classes=10)
    target = create_model("small_cnn", num_classes=10)
    load_checkpoint_into(target, checkpoint_state_dict({"net": source.state_dict()}))
    torch.testing.assert_close(target.head.weight, source.head.weight)
    with pytest.raises(CheckpointError, match=r"the checkpoint's head head\.weight has 10 outputs, the dataset has 7"):
        load_checkpoint_into(create_model("small_cnn", num_classes=7), source.state_dict())


def test_head_shape_mismatch_message() -> None:
    state = trained_resnet18(num_classes=1000).state_dict()
    model = external_model("torchvision:resnet18", 10)
    with pytest.raises(CheckpointError, match=r"the checkpoint's head fc\.weight has 1000 outputs, the dataset has 10"):
        load_checkpoint_into(model, state)


def test_missing_and_unexpected_keys_are_listed() -> None:
    state = dict(trained_resnet18().state_dict())
    del state["layer1.0.conv1.weight"]
    state["extra.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint_into(external_model("torchvision:resnet18", 10), state)
    message = str(info.value)
    assert "1 missing key(s): layer1.0.conv1.weight." in message
    assert "1 unexpected key(s): extra.weight." in message


def test_lightning_style_prefix_hint() -> None:
    state = {"model." + k: v for k, v in trained_resnet18().state_dict().items()}
    with pytest.raises(CheckpointError, match=r"starts with 'model\.', and without it the keys fit"):
        load_checkpoint_into(external_model("torchvision:resnet18", 10), state)


def test_squeezenet_has_no_linear_head() -> None:
    with pytest.raises(HeadNotFoundError) as info:
        external_model("torchvision:squeezenet1_0", 10)
    message = str(info.value)
    assert "torchvision:squeezenet1_0" in message and "no nn.Linear module" in message
    assert "--head" in message and "source.head" in message
    assert isinstance(info.value, ValueError)


def test_explicit_head() -> None:
    assert external_model("torchvision:resnet18", 10, head="fc", input_shape=SHAPE).head_name == "fc"
    with pytest.raises(HeadNotFoundError, match=r"'layer1' is Sequential, not an nn\.Linear(?s:.*)fc: Linear\(512 "):
        external_model("torchvision:resnet18", 10, head="layer1")
    with pytest.raises(HeadNotFoundError, match=r"has no module 'layer9'.*(?s:.*)--head"):
        external_model("torchvision:resnet18", 10, head="layer9")
    with pytest.raises(HeadNotFoundError, match=r"'classifier\.0' has 1024 outputs, but the dataset has 10 classes"):
        external_model("torchvision:mobilenet_v3_small", 10, head="classifier.0")
    with pytest.raises(HeadNotFoundError, match=r"replaced by nn\.Identity the model fails on a \(3, 32, 32\) input"):
        external_model("torchvision:mobilenet_v3_small", 1024, head="classifier.0", input_shape=SHAPE)


def test_verification_rejects_a_wrong_split(monkeypatch: pytest.MonkeyPatch) -> None:
    def toy(name: str, **kwargs: object) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(30, 30), nn.ReLU(), nn.Linear(30, 30))

    monkeypatch.setattr(torchvision.models, "get_model", toy)
    assert external_model("torchvision:resnet18", 30, input_shape=(3, 2, 5)).head_name == "3"
    with pytest.raises(HeadNotFoundError, match=r"splitting at '1' does not reproduce the model's logits"):
        external_model("torchvision:resnet18", 30, head="1", input_shape=(3, 2, 5))


def test_head_applied_per_position_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    # A linear layer applied to the last axis of a feature map, not to pooled features.
    def per_position(name: str, **kwargs: object) -> nn.Module:
        return nn.Sequential(nn.Linear(5, 4), nn.Flatten())

    monkeypatch.setattr(torchvision.models, "get_model", per_position)
    with pytest.raises(HeadNotFoundError, match=r"input have shape \(30,\), not \(5,\)"):
        external_model("torchvision:resnet18", 4, input_shape=(3, 2, 5))
    unchecked = external_model("torchvision:resnet18", 4)  # without input_shape, the first forward finds it
    with pytest.raises(HeadNotFoundError, match=r"gives 30 features per input, but the head '0' expects 5"):
        unchecked(torch.zeros(1, 3, 2, 5))


def test_unknown_names() -> None:
    with pytest.raises(UnknownNameError, match=r"Unknown torchvision classification model 'torchvision:resnet19'\. "
                       r"Did you mean 'torchvision:resnet18'.*list_models"):
        external_model("torchvision:resnet19", 10)
    with pytest.raises(KeyError, match=r"Unknown architecture source 'torchvison:'.*Did you mean 'torchvision:resnet"):
        check_arch("torchvison:resnet18")
    with pytest.raises(UnknownNameError, match=r"Unknown torchvision classification model 'torchvision:fasterrcnn"):
        check_arch("torchvision:fasterrcnn_resnet50_fpn")  # a detection model, not a classifier
    with pytest.raises(UnknownNameError, match=r"Unknown architecture 'resnet51'"):
        check_arch("resnet51")


def test_check_arch_accepts_valid_names() -> None:
    for name in MODELS.names():
        check_arch(name)
    check_arch("torchvision:resnet18")
    check_arch("torchvision:vit_b_16")


def test_timm_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # makes `import timm` fail
    with pytest.raises(ImportError, match=r"pip install timm"):
        check_arch("timm:resnet10t")
    with pytest.raises(ImportError, match=r"pip install timm"):
        create_model("timm:resnet10t", num_classes=10)


def test_checkpoint_file_errors(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(os.urandom(256))
    with pytest.raises(CheckpointError, match=r"corrupt\.pt.*cannot be loaded"):
        read_checkpoint(corrupt)
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.pt.*cannot be loaded"):
        read_checkpoint(tmp_path / "empty.pt")
    with pytest.raises(CheckpointError, match=r"missing\.pt'?: no such file"):
        read_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(CheckpointError, match=r"is a directory"):
        read_checkpoint(tmp_path)
    torch.save(nn.Linear(2, 2), tmp_path / "pickled_module.pt")
    with pytest.raises(CheckpointError, match=r"weights_only=True.*torch\.save\(model\.state_dict\(\), path\)"):
        read_checkpoint(tmp_path / "pickled_module.pt")
    torch.save({"epoch": 3, "lr": 0.1}, tmp_path / "metadata.pt")
    with pytest.raises(CheckpointError, match=r"metadata\.pt.*not a state dict: found a dict with top-level keys "
                       r"\['epoch', 'lr'\]"):
        read_checkpoint(tmp_path / "metadata.pt")


def test_checkpoint_state_dict_rejects_other_objects() -> None:
    with pytest.raises(CheckpointError, match=r"found an object of type builtins\.list"):
        checkpoint_state_dict([torch.zeros(1)])
    with pytest.raises(CheckpointError, match=r"found an empty dict"):
        checkpoint_state_dict({})
    with pytest.raises(CheckpointError, match=r"top-level keys \['model'\]"):
        checkpoint_state_dict({"model": "resnet18"})


# ---------------------------------------------------------------------------------------------------------------------
# timm (skipped when it is not installed)


def test_timm_resnet_round_trip() -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(2)
    original = randomize_batchnorm(timm.create_model("resnet10t", pretrained=False, num_classes=10, in_chans=1)).eval()
    model = external_model("timm:resnet10t", 10, in_channels=1, input_shape=(1, 32, 32))
    assert (model.head_name, model.num_features, model.repeat_channels) == ("fc", 512, 1)
    load_checkpoint_into(model, checkpoint_state_dict({"model": original.state_dict()}))
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), original(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model.features(x), original.forward_head(original.forward_features(x), True))


def test_timm_vit_head_from_pretrained_cfg() -> None:
    timm = pytest.importorskip("timm")
    if "test_vit" not in timm.list_models("test_vit"):
        pytest.skip("this timm has no test_vit")
    model = external_model("timm:test_vit", 5, input_shape=(3, 160, 160))
    assert model.head_name == "head" and model.num_classes == 5
    check_arch("timm:test_vit")
    with pytest.raises(UnknownNameError, match=r"Unknown timm model 'timm:resnet10'\. Did you mean 'timm:resnet10t'"):
        check_arch("timm:resnet10")


def test_registered_name_with_colon_is_not_external(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MODELS._entries, "torchvision:mine", lambda num_classes, in_channels=3: nn.Linear(1, 1))
    check_arch("torchvision:mine")
    assert isinstance(create_model("torchvision:mine", num_classes=2), nn.Linear)
