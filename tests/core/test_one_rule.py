"""Each rule of calib is written once: the "did you mean" hint, the seed range, the default loss, the uncalibrated
model's former labels. The helpers are checked against hand-written messages, and the sources hold no second copy."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from calib._config import ConfigError, did_you_mean
from calib.config import SEED_LIMIT, check_seed, config_hash, is_seed, parse_trial_config, seed_rule, stage1_identity
from calib.methods.vanilla import current_uncalibrated_label
from calib.overrides import ABSENT, apply_settings, current_value, parse_setting
from calib.registries import DEFAULT_LOSS, LOSSES
from calib.report.published import published_ece
from calib.search.space import _check_config
from calib.study.rows import row_label

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "calib").rglob("*.py"), *(ROOT / "studies").glob("*.py")])


def _code(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_did_you_mean_names_the_closest_choices_in_the_form_asked():
    assert did_you_mean("gama", ["gamma", "alpha"]) == " Did you mean 'gamma'?"
    assert did_you_mean(["gama", "alpah"], ["gamma", "alpha"]) == " Did you mean 'gamma' or 'alpha'?"
    assert did_you_mean("zzz", ["gamma", "alpha"]) == ""
    assert did_you_mean("cifar", ["cifar10", "cifar100", "svhn"], n=3) == " Did you mean 'cifar10' or 'cifar100'?"
    assert did_you_mean("nme", ["name"], show=lambda c: f"`{c}`", form="; did you mean {}?") == \
        "; did you mean `name`?"
    # hints naming a field by its paper's symbol replace the close spellings
    assert did_you_mean("gamma", ["gammas"], first=["'method.accuracy_weight' (γ)"]) == \
        " Did you mean 'method.accuracy_weight' (γ)?"


def test_seed_rule_bounds_and_messages():
    assert is_seed(0) and is_seed(SEED_LIMIT - 1) and not is_seed(-1) and not is_seed(2**32)
    check_seed(2**32 - 1, "seed")
    with pytest.raises(ConfigError) as err:
        check_seed(-1, "--seeds", many=True)
    assert str(err.value) == ("`--seeds` must be integers with 0 <= seed < 2**32 = 4294967296 (NumPy's seeding takes "
                              "no other), got --seeds=-1.")
    with pytest.raises(ConfigError) as err:
        check_seed(2**32, "stage2_seed")
    assert str(err.value) == ("`stage2_seed` must be an integer with 0 <= stage2_seed < 2**32 = 4294967296 (NumPy's "
                              "seeding takes no other), got stage2_seed=4294967296.")
    assert seed_rule("--sampler-seed", why="x") == "be an integer with 0 <= seed < 2**32 = 4294967296 (x)"


def test_a_trial_config_and_a_search_space_reject_an_unknown_key_with_one_message(tmp_path):
    config = {"study": "s", "seed": 0, "dataset": "digits", "arch": "small_cnn", "method": "vanilla",
              "data_root": str(tmp_path), "artifact_root": str(tmp_path), "sed": 1}
    with pytest.raises(ConfigError) as parsed:
        parse_trial_config(config)
    with pytest.raises(ConfigError) as searched:
        _check_config({"sed": 1})
    assert str(parsed.value) == str(searched.value)
    assert str(parsed.value).startswith("Unknown trial config key(s) 'sed'. Valid keys: ")
    assert str(parsed.value).endswith(" Did you mean 'seed'?")


def test_a_config_without_a_loss_trains_with_the_default_loss(tmp_path):
    config = {"study": "s", "seed": 0, "dataset": "digits", "arch": "small_cnn", "method": "vanilla",
              "data_root": str(tmp_path), "artifact_root": str(tmp_path)}
    assert parse_trial_config(config).loss.name == DEFAULT_LOSS == "cross_entropy"
    assert DEFAULT_LOSS in LOSSES


def test_the_former_uncalibrated_labels_read_the_same_everywhere():
    for former in ("Vanilla (CE)", "CE", "Uncalibrated", "vanilla"):
        assert current_uncalibrated_label(former) == row_label(former) == "Vanilla"
        assert published_ece("cifar10", "resnet50", former) == published_ece("cifar10", "resnet50", "Vanilla")
    assert published_ece("cifar10", "resnet50", "Vanilla") is not None
    assert current_uncalibrated_label("CE +MaC-Cal") == "Vanilla +MaC-Cal"
    assert current_uncalibrated_label("CEX") == "CEX" and current_uncalibrated_label(None) is None


def test_each_rule_has_one_copy_in_the_sources():
    close_matches = [p.relative_to(ROOT).as_posix() for p in SOURCES if "get_close_matches" in _code(p)]
    assert close_matches == ["calib/_config.py"]
    seed_ranges = [p.relative_to(ROOT).as_posix() for p in SOURCES if "< SEED_LIMIT" in _code(p)]
    assert seed_ranges == ["calib/seeds.py"]
    loss_names = []
    for path in SOURCES:
        tree = ast.parse(_code(path))
        exported = {id(n) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "__all__" for t in node.targets) for n in ast.walk(node)}
        loss_names += [f"{path.relative_to(ROOT).as_posix()}:{node.lineno}" for node in ast.walk(tree)
                       if isinstance(node, ast.Constant) and node.value == "cross_entropy" and id(node) not in exported]
    assert [name.split(":")[0] for name in loss_names] == ["calib/registries.py"]  # one literal, DEFAULT_LOSS
    former = [p.relative_to(ROOT).as_posix() for p in SOURCES if "in FORMER_UNCALIBRATED_LABELS" in _code(p)
              or "for former in FORMER_UNCALIBRATED_LABELS" in _code(p)]
    assert former == ["calib/methods/vanilla.py"]


def test_a_setting_of_one_method_applies_to_its_trials_alone():
    setting = parse_setting("histogram_binning.num_bins=7")  # HB-EM's former name reads as its name
    assert (setting.key, setting.only, str(setting)) == ("method.num_bins", "histogram_binning_equal_mass",
                                                         "histogram_binning_equal_mass.num_bins=7")
    configs = [{"method": {"name": "histogram_binning_equal_mass"}},
               {"method": {"name": "histogram_binning_equal_width"}}, {"method": "vanilla"}]
    assert apply_settings(configs, [setting]) == [{"method": {"name": "histogram_binning_equal_mass", "num_bins": 7}},
                                                  *configs[1:]]
    assert [current_value(c, setting) for c in configs] == [15, ABSENT, ABSENT]
    with pytest.raises(ConfigError, match=r"^`--set histogram_binning_equal_mass\.num_bins=7` names method "
                                          r"'histogram_binning_equal_mass'; the methods of this run are vanilla\.$"):
        apply_settings(configs[2:], [setting])
    with pytest.raises(ConfigError, match=r"^`histogram_binning_equal_mass\.num_bins` must be an integer, got "
                                          r"histogram_binning_equal_mass\.num_bins='x'\.$"):
        parse_setting("histogram_binning_equal_mass.num_bins=x")
    with pytest.raises(ConfigError, match=r"'nonsense' is not a section of the trial config .* nor a registered "
                                          r"method"):
        parse_setting("nonsense.num_bins=7")


def test_the_grid_places_its_trials_from_the_configs_parsed_once(make_config, monkeypatch):
    import calib.run.grid as grid  # the module whose parse_trial_config is replaced below

    methods = [{"name": "vanilla"}, {"name": "temperature_scaling"}, {"name": "mac_cal", "epochs": 2},
               {"name": "mac_cal", "epochs": 2, "accuracy_weight": 0.5}]
    configs = [make_config(seed=seed, method=m) for seed in (1, 2) for m in methods]
    parsed = [parse_trial_config(c) for c in configs]
    stage1_ids = {json.dumps(c, sort_keys=True): config_hash(stage1_identity(p))
                  for c, p in zip(configs, parsed, strict=True)}

    def no_parse(config):
        raise AssertionError("a config was parsed again")

    monkeypatch.setattr(grid, "parse_trial_config", no_parse)
    roles = grid.assign_roles(configs, parsed)
    assert [r["role"] for r in roles] == ["stage1", "stage1", *["cached"] * 6]
    assert all(r["cfg"] is parsed[configs.index(r["config"])] for r in roles)
    trials = grid.batch_roles(roles, configs_per_trial=8)
    # round-robin over the two Stage Is; a seed's TS and its two MaC-Cal rows (one population) share a Tune trial
    assert [(t["role"], len(t["configs"])) for t in trials] == [("stage1", 1), ("stage1", 1), ("cached", 3),
                                                                ("cached", 3)]
    assert [[c["seed"] for c in t["configs"]] for t in trials] == [[1], [2], [1, 1, 1], [2, 2, 2]]
    assert [[c["method"]["name"] for c in t["configs"]] for t in trials[2:]] == [
        ["temperature_scaling", "mac_cal", "mac_cal"]] * 2
    for trial in trials:  # each trial's Stage I is its configs' own
        assert {stage1_ids[json.dumps(c, sort_keys=True)] for c in trial["configs"]} == {trial["stage1_id"]}
    monkeypatch.undo()
    assert grid.batch_roles(grid.assign_roles(configs), configs_per_trial=8) == trials  # parsed there: the same
