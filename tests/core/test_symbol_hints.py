"""A key that spells a paper's symbol (``method.gamma``, ``method.θ_0``, ``loss.lambda``) where calib names the field
(``accuracy_weight``, ``clip_init``, ``penalty_weight``): ``--set`` and search spaces refuse it with a "did you mean"
naming the field behind the symbol, read from the config's docstring."""

from __future__ import annotations

import pytest

from calib._config import ConfigError, field_symbols, symbol_name
from calib.losses.acls import ACLSConfig
from calib.methods.mac_cal import MacCalConfig
from calib.overrides import parse_setting
from calib.search import parse_search_space
from tests.in_process import run_refused


def test_symbol_names():
    assert symbol_name("γ") == symbol_name("gamma") == symbol_name("Gamma") == "gamma"
    assert symbol_name("θ_0") == symbol_name("theta_0") == symbol_name("θ0") == "theta0"
    assert symbol_name("λ") == symbol_name("lambda") == "lambda"  # Unicode spells it LAMDA


def test_the_symbols_of_a_config_come_from_its_docstring():
    symbols = field_symbols(MacCalConfig)
    assert {k: symbols[k] for k in ("accuracy_weight", "clip_init", "clip_decay")} == \
        {"accuracy_weight": "γ", "clip_init": "θ_0", "clip_decay": "β"}
    assert field_symbols(ACLSConfig) == {"penalty_weight": "λ", "pos_weight": "λ1", "neg_weight": "λ2"}


@pytest.mark.parametrize(("key", "hint"), [
    ("method.gamma", "Did you mean 'method.accuracy_weight' (γ of mac_cal)?"),
    ("method.γ", "Did you mean 'method.accuracy_weight' (γ of mac_cal)?"),
    ("method.theta_0", "Did you mean 'method.clip_init' (θ_0 of mac_cal)?"),
    ("stage1.alpha", "Did you mean 'stage1.mixup_alpha' (α) or 'stage1.mit_alpha' (α)?"),
    ("method.accuracy_wieght", "Did you mean 'method.accuracy_weight'?"),  # a typo: the closest name, as before
])
def test_set_names_the_field_behind_the_symbol(key, hint):
    with pytest.raises(ConfigError) as err:
        parse_setting(f"{key}=0.5")
    assert hint in str(err.value)


def test_a_symbol_several_losses_use():
    with pytest.raises(ConfigError) as err:
        parse_setting("loss.lambda=0.1")
    assert "Did you mean 'loss.penalty_weight' (λ of acls, " in str(err.value)
    assert "'loss.update_rate' (λ of adafocal)" in str(err.value)


def test_a_search_space_names_the_field_behind_the_symbol():
    uniform = {"distribution": "uniform", "low": 0.8, "high": 1.0}
    with pytest.raises(ConfigError, match=r"Did you mean 'method.accuracy_weight' \(γ\)\?"):
        parse_search_space({"base": {"method.name": "mac_cal"}, "parameters": {"method.gamma": uniform}})
    with pytest.raises(ConfigError, match=r"Did you mean 'method.clip_init' \(θ_0\)\?"):
        parse_search_space({"base": {"method.name": "mac_cal", "method.θ_0": 0.1},
                            "parameters": {"method.accuracy_weight": uniform}})


def test_a_study_prints_it_on_its_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, err = run_refused("sensitivity_gamma.py", ["--store", str(tmp_path / "results"), "--set", "method.gamma=0.5"],
                            monkeypatch, capsys)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: `--set method.gamma`: ")
    assert "Did you mean 'method.accuracy_weight' (γ of mac_cal)?" in err
    assert list(tmp_path.iterdir()) == []
