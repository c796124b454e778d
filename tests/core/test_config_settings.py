"""``--set KEY=VALUE`` (calib.overrides): keys checked against the config dataclasses and the registries, values
typed by the field, method and loss settings applied where the field exists; and ``stage2_seed``, whose default
keeps every stored trial id."""

from __future__ import annotations

import json

import pytest

from calib._config import ConfigError
from calib.config import parse_trial_config, trial_id, trial_identity
from calib.overrides import apply_settings, parse_setting, typed_value
from calib.study.settings import STUDY_KEYS

# Trial ids computed by calib before stage2_seed existed (commit 1f1fbf9): quick preset, digits-noisy, paths left
# out (placement). Each must keep its id, with stage2_seed absent, null or equal to the seed.
_STAGE1 = {"epochs": 60, "batch_size": 64, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005, "milestones": [30, 45],
           "lr_decay": 0.1, "grad_clip": 2.0, "loss_reduction": "mean", "mixup_alpha": None, "mit_alpha": None,
           "checkpoint": "last", "scheduler_step": "epoch_end", "train_size": None, "amp": "off",
           "data_pipeline": "auto", "compile": "off", "channels_last": True}
_HEAD = {"epochs": 40, "optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005, "batch_size": 128,
         "latent_dim": 256, "checkpoint": "last"}
STORED_IDS = [
    ("5f5e0753e350ca29", 1, {"name": "cross_entropy"},
     {"name": "mac_cal", "epochs": 40, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005, "batch_size": 128,
      "head": "bottleneck", "bottleneck_width": 256, "head_init": "random", "masked_forward": True,
      "mask_mode": "forward", "gradient_restriction": True, "adaptive_retention": "decay", "retention_init": 0.9,
      "retention_min": 0.1, "accuracy_weight": 0.95, "clip_init": 0.05, "clip_decay": 3.0, "mask_resample": "epoch",
      "stats_pass": "online", "stats_source": "train", "accuracy_weight_source": "fixed",
      "train_mask_scaling": "none", "inference_weights": "expected"}),
    ("2ddc2b218b2ee75e", 2, {"name": "cross_entropy"}, {"name": "tst", **_HEAD}),
    ("4f4a5ad88738ca2b", 3, {"name": "focal", "gamma": 3.0},
     {"name": "temperature_scaling", "calibration_size": None, "calibration_draw": 0, "objective": "nll",
      "optimizer": "lbfgs", "lbfgs_line_search": True}),
    ("8e30d3bfb5b927af", 4, {"name": "cross_entropy"}, {"name": "vtst", **_HEAD, "num_samples": 1}),
]


def stored_config(seed, loss, method, **extra):
    return {"study": "s", "seed": seed, "dataset": "digits-noisy", "arch": "small_cnn", "stage1": dict(_STAGE1),
            "loss": loss, "method": method, "data_root": "/d", "artifact_root": "/a", "device": "cpu",
            "num_bins": 15, **extra}


@pytest.mark.parametrize(("stored_id", "seed", "loss", "method"), STORED_IDS)
def test_trial_ids_stored_before_stage2_seed_are_kept(stored_id, seed, loss, method):
    assert trial_id(stored_config(seed, loss, method)) == stored_id
    assert trial_id(stored_config(seed, loss, method, stage2_seed=None)) == stored_id
    assert trial_id(stored_config(seed, loss, method, stage2_seed=seed)) == stored_id  # the default, said
    other = stored_config(seed, loss, method, stage2_seed=seed + 100)
    assert trial_id(other) != stored_id and trial_identity(parse_trial_config(other))["stage2_seed"] == seed + 100


def test_stage2_seed_defaults_to_the_seed_and_round_trips():
    cfg = parse_trial_config(stored_config(*STORED_IDS[0][1:]))
    assert cfg.stage2_seed == cfg.seed == 1
    seven = parse_trial_config(stored_config(*STORED_IDS[0][1:], stage2_seed=7))
    assert seven.stage2_seed == 7 and parse_trial_config(seven.to_dict()) == seven
    with pytest.raises(ConfigError, match=r"`stage2_seed` must be an integer with 0 <= stage2_seed < 2\*\*32"):
        parse_trial_config(stored_config(*STORED_IDS[0][1:], stage2_seed=-1))


@pytest.mark.parametrize(("text", "key", "expected"), [
    ("stage1.scheduler_step=epoch_start", "stage1.scheduler_step", "epoch_start"),
    ("stage1.amp=off", "stage1.amp", "off"),  # YAML 1.1 would read a boolean: the field's type decides
    ("stage1.lr=1e-3", "stage1.lr", 0.001),  # YAML 1.1 would read a string
    ("stage1.milestones=20,40", "stage1.milestones", [20, 40]),
    ("stage1.milestones=[150, 250]", "stage1.milestones", [150, 250]),
    ("stage1.milestones=[]", "stage1.milestones", []),
    ("stage1.grad_clip=null", "stage1.grad_clip", None),
    ("stage1.channels_last=false", "stage1.channels_last", False),
    ("num_bins=10", "num_bins", 10),
    ("cifar100_test_norm=focal_bug", "cifar100_test_norm", "focal_bug"),
    ("stage2_seed=7", "stage2_seed", 7),
])
def test_a_setting_is_typed_by_its_field(text, key, expected):
    setting = parse_setting(text, STUDY_KEYS)
    assert setting.key == key
    (config,) = apply_settings([{"method": {"name": "vanilla"}}], [setting])
    section, _, field = key.rpartition(".")
    value = config[section][field] if section else config[field]
    assert json.dumps(value) == json.dumps(expected)


@pytest.mark.parametrize(("text", "message"), [
    ("stage1.scheduler_step=batch",
     r"^`stage1.scheduler_step` must be one of 'epoch_end', 'epoch_start', got stage1.scheduler_step='batch'\.$"),
    ("stage1.epochs=2.5", r"`stage1.epochs` must be an integer, got stage1.epochs=2.5"),
    ("stage1.lr=fast", r"`stage1.lr` must be a number, got stage1.lr='fast'"),
    ("stage1.epoch=3", r"^`--set stage1.epoch`: not a field of stage1 \(Stage1Config\)\. Did you mean "
                       r"'stage1.epochs'\? Allowed keys: stage1.epochs, stage1.batch_size, .*stage1.channels_last, "
                       r"stage1.mixup_alpha, stage1.mit_alpha, stage1.plp_gamma, stage1.balcal_delta\.$"),
    ("method.gamma_x=1", r"^`--set method.gamma_x`: no registered method has the field 'gamma_x'.*Allowed keys: "
                         r"method\.accuracy_weight, "),
    ("colour=red", r"^`--set colour`: not a field of the trial config\. Allowed keys: num_bins, .*stage2_seed, "
                   r"stage1\.epochs, "),
    ("stage1=3", r"`--set stage1`: stage1 is a section; set one of its fields"),
    ("model.depth=3", r"`--set model.depth`: 'model' is not a section of the trial config"),
    ("seed=3", r"^`--set seed`: seed is set by --seeds, not --set\.$"),
    ("method.name=tst", r"method.name is set by the study's rows"),
    ("source.path=/x", r"source.path is set by --checkpoint, --features or --predictions"),
    ("stage1.epochs", r"`--set` takes KEY=VALUE"),
])
def test_a_bad_key_or_value_names_it_and_what_is_allowed(text, message):
    with pytest.raises(ConfigError, match=message) as caught:
        parse_setting(text, STUDY_KEYS)
    assert "\n" not in str(caught.value)
    assert "seed" not in [k for k in str(caught.value).split("Allowed keys: ")[-1].rstrip(".").split(", ")]


def test_a_method_setting_applies_where_the_method_has_the_field():
    configs = [{"method": {"name": "vanilla"}}, {"method": {"name": "mac_cal", "epochs": 3}},
               {"method": {"name": "temperature_scaling"}}, {"method": {"name": "tst"}}]
    out = apply_settings(configs, [parse_setting("method.epochs=7"), parse_setting("method.accuracy_weight=0.9")])
    assert out[0] == {"method": {"name": "vanilla"}} and out[2] == {"method": {"name": "temperature_scaling"}}
    assert out[1]["method"] == {"name": "mac_cal", "epochs": 7, "accuracy_weight": 0.9}
    assert out[3]["method"] == {"name": "tst", "epochs": 7}
    assert configs[1]["method"]["epochs"] == 3, "the input is not changed"
    loss = apply_settings([{"loss": {"name": "focal"}}, {}], [parse_setting("loss.gamma=2")])
    assert loss == [{"loss": {"name": "focal", "gamma": 2.0}}, {}]


def test_a_method_setting_no_config_has_is_refused_naming_who_has_it():
    with pytest.raises(ConfigError, match=r"^`--set method.accuracy_weight`: none of this run's methods \(vanilla, "
                                          r"temperature_scaling\) has the field 'accuracy_weight' \(mac_cal has it\)"):
        apply_settings([{"method": {"name": "vanilla"}}, {"method": {"name": "temperature_scaling"}}],
                       [parse_setting("method.accuracy_weight=0.9")])
    with pytest.raises(ConfigError, match=r"`method.accuracy_weight` must be a number, got "
                                          r"method.accuracy_weight='high'"):
        apply_settings([{"method": {"name": "mac_cal"}}], [parse_setting("method.accuracy_weight=high")])


def test_typed_value_reads_what_the_type_wants():
    assert typed_value("3", int, "k") == 3 and typed_value("3", float, "k") == 3.0
    assert typed_value("3", str, "k") == "3" and typed_value("null", int | None, "k") is None
    with pytest.raises(ConfigError, match=r"`k` must be an integer, got k='three'"):
        typed_value("three", int, "k")
