"""Search-space files: the documented format, its errors, and the shipped files."""

from pathlib import Path

import optuna.distributions as od
import pytest
import yaml

from calib._config import ConfigError
from calib.config import parse_trial_config, set_dotted
from calib.search import load_search_space, parse_search_space

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


VALID = """
description: demo
base: {method.name: mac_cal}
parameters:
  method.accuracy_weight: {distribution: uniform, low: 0.8, high: 1.0}
  method.clip_init: {distribution: loguniform, low: 0.005, high: 0.2}
  method.bottleneck_width: {distribution: int, low: 32, high: 512, log: true}
  stage1.mixup_alpha: {distribution: categorical, choices: [null, 0.2]}
  seed: {distribution: grid, values: [1, 2]}
"""


class TestSearchSpace:
    def test_main(self, tmp_path):
        space = load_search_space(write(tmp_path, VALID))
        assert space.base == {"method.name": "mac_cal"} and space.description == "demo"
        optuna_space = space.optuna_space()
        assert optuna_space["method.accuracy_weight"] == od.FloatDistribution(0.8, 1.0)
        assert optuna_space["method.clip_init"] == od.FloatDistribution(0.005, 0.2, log=True)
        assert optuna_space["method.bottleneck_width"] == od.IntDistribution(32, 512, log=True)
        assert optuna_space["stage1.mixup_alpha"] == od.CategoricalDistribution([None, 0.2])
        assert optuna_space["seed"] == od.CategoricalDistribution([1, 2])
        assert not space.is_finite()

    def test_grid_enumeration(self):
        space = parse_search_space({"parameters": {
            "seed": {"distribution": "grid", "values": [1, 2]},
            "method.head": {"distribution": "categorical", "choices": ["linear", "bottleneck"]},
        }})
        assert space.grid() == [{"seed": 1, "method.head": "linear"}, {"seed": 1, "method.head": "bottleneck"},
                                {"seed": 2, "method.head": "linear"}, {"seed": 2, "method.head": "bottleneck"}]

    def test_tune_distributions(self):
        from ray import tune
        from ray.tune.search.sample import Categorical, Float, Integer

        space = parse_search_space(yaml.safe_load(VALID))
        assert isinstance(space.parameters["method.accuracy_weight"].to_tune(), Float)
        assert isinstance(space.parameters["method.bottleneck_width"].to_tune(), Integer)
        assert isinstance(space.parameters["stage1.mixup_alpha"].to_tune(), Categorical)
        assert space.parameters["seed"].to_tune() == tune.grid_search([1, 2])

    @pytest.mark.parametrize(("text", "message"), [
        ("parameters: {a: {distribution: normal, mu: 0}}", r"unknown distribution 'normal'; allowed: categorical"),
        ("parameters: {a: {distribution: uniform, low: 1}}", r"needs exactly the keys \['high', 'low'\]; missing"),
        ("parameters: {a: {distribution: uniform, low: 1, high: 0}}", r"`low < high` must hold, got low=1, high=0"),
        ("parameters: {a: {distribution: loguniform, low: 0, high: 1}}", r"loguniform needs low > 0"),
        ("parameters: {a: {distribution: categorical, choices: []}}", r"needs a non-empty list"),
        ("parameters: {a: {distribution: uniform, low: x, high: 1}}", r"`low` must be a number"),
        ("parameters: {a: 0.5}", r"parameter `a` must be a mapping with a `distribution` key"),
        ("parameters: {}", r"`parameters` must be a non-empty mapping"),
        ("params: {}", r"unknown top-level key\(s\) \['params'\]"),
        ("- 1\n- 2", r"a search space must be a mapping"),
        ("parameters: {a: [unclosed", r"not valid YAML"),
    ])
    def test_errors(self, tmp_path, text, message):
        path = write(tmp_path, text)
        with pytest.raises(ConfigError, match=message) as info:
            load_search_space(path)
        assert str(path) in str(info.value)

    def test_missing_file(self, tmp_path):
        with pytest.raises(ConfigError, match="Search space file not found"):
            load_search_space(tmp_path / "nope.yaml")


@pytest.mark.parametrize("path", sorted((ROOT / "search_spaces").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_spaces_address_valid_config_keys(path, make_config):
    """Every parameter of a shipped file, at every end of its range, makes a valid trial config."""
    space = load_search_space(path)
    config = make_config()
    for key, value in space.base.items():
        config = set_dotted(config, key, value)
    for key, dist in space.parameters.items():
        values = dist.spec.get("values") or dist.spec.get("choices") or [dist.spec["low"], dist.spec["high"]]
        for value in values:
            parse_trial_config(set_dotted(config, key, value))
