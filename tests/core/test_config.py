import dataclasses

import pytest

from calib._config import ConfigError
from calib._registry import UnknownNameError
from calib.config import (
    Stage1Config,
    config_hash,
    parse_trial_config,
    set_dotted,
    stage1_identity,
    trial_identity,
)
from calib.datasets import DATASETS
from calib.losses import LOSSES
from calib.methods import METHODS, MacCalConfig
from calib.models import MODELS


class TestParseTrialConfig:
    def test_main(self, make_config):
        cfg = parse_trial_config(make_config(method={"name": "mac_cal", "accuracy_weight": 0.9}))
        assert cfg.method.name == "mac_cal" and cfg.method.params.accuracy_weight == 0.9
        assert cfg.method.params.retention_init == 0.9  # defaults of docs/methods.md §1.3
        assert cfg.stage1.milestones == () and cfg.stage1.momentum == 0.9
        assert parse_trial_config(cfg.to_dict()) == cfg  # round trip

    def test_paper_defaults(self):
        s1 = Stage1Config()
        assert (s1.epochs, s1.batch_size, s1.lr, s1.milestones, s1.grad_clip, s1.weight_decay) == \
            (350, 128, 0.1, (150, 250), 2.0, 5e-4)
        m = MacCalConfig()
        assert (m.epochs, m.lr, m.batch_size, m.bottleneck_width, m.accuracy_weight, m.clip_init, m.clip_decay,
                m.retention_init, m.retention_min) == (40, 0.1, 128, 256, 0.95, 0.05, 3.0, 0.9, 0.1)

    @pytest.mark.parametrize(
        ("key", "value", "message"),
        [
            ("method.retention_init", 0.0, r"`method.retention_init` must be in \(0, 1\]"),
            ("method.retention_init", 1.5, r"got method.retention_init=1.5"),
            ("method.accuracy_weight", 0.0, r"`method.accuracy_weight` must be > 0 \(it is γ\)"),
            ("method.clip_init", -0.1, r"`method.clip_init` must be >= 0"),
            ("method.bottleneck_width", 0, r"`method.bottleneck_width` must be an integer >= 1"),
            ("method.epochs", -1, r"`method.epochs` must be an integer >= 1"),
            ("stage1.mixup_alpha", 0.0, r"`stage1.mixup_alpha` must be > 0, or null"),
            ("stage1.epochs", -3, r"`stage1.epochs` must be an integer >= 1, got stage1.epochs=-3"),
            ("method.head", "mlp", r"`method.head` must be one of 'bottleneck', 'linear', got method.head='mlp'"),
            ("method.accuracy_weight", "high", r"`method.accuracy_weight` must be a number"),
            ("stage1.milestones", [5, 2], r"`stage1.milestones` must be increasing positive epochs"),
            ("method.gama", 0.9, r"Unknown key 'method.gama' for MacCalConfig\. Valid keys: method.epochs"),
            ("stage1.lrr", 0.1, r"Unknown key 'stage1.lrr' for Stage1Config"),
            ("colour", "red", r"Unknown trial config key\(s\) 'colour'"),
            ("data_root", "relative/path", r"`data_root` must be an absolute path"),
            ("num_bins", 0, r"`num_bins` must be an integer >= 1"),
            ("seed", -1, r"`seed` must be an integer with 0 <= seed < 2\*\*32 .*got seed=-1"),
            ("seed", 2**32, r"`seed` must be an integer with 0 <= seed < 2\*\*32 .*got seed=4294967296"),
            ("seed", 99999999999999999999, r"0 <= seed < 2\*\*32 .*got seed=99999999999999999999"),
            ("stage1.train_size", 9, r"`stage1.train_size` must be at least the 10 classes of digits-noisy "
                                     r"\(Stage I trains on a stratified sample that holds every class\), "
                                     r"got stage1.train_size=9"),
        ],
    )
    def test_errors(self, make_config, key, value, message):
        with pytest.raises(ConfigError, match=message):
            parse_trial_config(set_dotted(make_config(), key, value))

    @pytest.mark.parametrize(("key", "value", "registry"), [
        ("method.name", "maccal", METHODS),
        ("dataset", "cifar11", DATASETS),
        ("arch", "resnet111", MODELS),
        ("loss.name", "focall", LOSSES),
    ])
    def test_unknown_names_list_valid_ones(self, make_config, key, value, registry):
        with pytest.raises(UnknownNameError) as info:
            parse_trial_config(set_dotted(make_config(), key, value))
        assert f"names: {', '.join(registry.names())}." in str(info.value)

    def test_inconsistent_components(self, make_config):
        with pytest.raises(ConfigError, match=r"needs `head`='linear'"):
            parse_trial_config(make_config(method={"name": "mac_cal", "head_init": "stage1"}))
        with pytest.raises(ConfigError, match=r"`method.masked_forward`=false leaves nothing to restrict"):
            parse_trial_config(make_config(method={"name": "mac_cal", "masked_forward": False}))


class TestIdentity:
    def test_stage1_identity_ignores_method_and_placement(self, make_config, tmp_path):
        a = parse_trial_config(make_config(method={"name": "mac_cal", "accuracy_weight": 0.8}))
        b = parse_trial_config(make_config(method={"name": "vanilla"}))
        c = parse_trial_config({**make_config(), "data_root": str(tmp_path / "elsewhere")})
        assert config_hash(stage1_identity(a)) == config_hash(stage1_identity(b)) == config_hash(stage1_identity(c))
        assert config_hash(trial_identity(a)) != config_hash(trial_identity(b))
        assert config_hash(trial_identity(parse_trial_config(make_config()))) == config_hash(trial_identity(c))

    def test_stage1_identity_changes_with_stage1(self, make_config):
        base = parse_trial_config(make_config())
        for key, value in [("seed", 2), ("stage1.mixup_alpha", 0.2), ("stage1.lr", 0.05), ("dataset", "digits")]:
            other = parse_trial_config(set_dotted(make_config(), key, value))
            assert config_hash(stage1_identity(other)) != config_hash(stage1_identity(base)), key

    def test_hash_is_canonical(self):
        assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
        assert len(config_hash({"a": 1})) == 16

    def test_set_dotted_copies(self, make_config):
        cfg = make_config()
        out = set_dotted(cfg, "method.accuracy_weight", 0.8)
        assert out["method"]["accuracy_weight"] == 0.8 and "accuracy_weight" not in cfg["method"]
        with pytest.raises(ConfigError, match="is not a section"):
            set_dotted(cfg, "seed.x", 1)


def test_config_dataclasses_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Stage1Config().epochs = 3  # type: ignore[misc]
