"""Ablation ladders: the shipped MaC-Cal ladder reproduces Table 5's rows; modes and file errors."""

from pathlib import Path

import pytest

from calib._config import ConfigError
from calib.config import parse_trial_config
from calib.study.ablation import load_ladder, parse_ladder

LADDER = Path(__file__).resolve().parents[2] / "studies" / "ladders" / "mac_cal.yaml"


def method_of(step):
    return parse_trial_config(step.config).method


def test_incremental_mac_cal_ladder_is_table5(make_config):
    steps, skipped = load_ladder(LADDER).steps(make_config(method={"name": "vanilla"}), "incremental")
    assert skipped == []
    assert [s.label for s in steps] == ["Vanilla", "+Masked Retraining", "+Gradient Restriction",
                                        "+Classifier Restructure", "+Static Adaptive Sparsity",
                                        "+Decaying Adaptive Sparsity"]
    assert method_of(steps[0]).name == "vanilla"
    rows = [method_of(s).params for s in steps[1:]]
    assert [(p.head, p.head_init, p.gradient_restriction, p.adaptive_retention) for p in rows] == [
        ("linear", "stage1", False, "none"),
        ("linear", "stage1", True, "none"),
        ("bottleneck", "random", True, "none"),
        ("bottleneck", "random", True, "static"),
        ("bottleneck", "random", True, "decay"),
    ]
    assert all(p.masked_forward for p in rows)
    # every step keeps the Stage I of the baseline: one artifact for the whole ladder
    assert len({str(parse_trial_config(s.config).stage1) for s in steps}) == 1


@pytest.mark.parametrize(("reading", "inference"), [("in_place", "full"), ("straight_through", "expected")])
def test_each_reading_has_the_table5_ladder(make_config, reading, inference):
    """studies/ladders/mac_cal_<reading>.yaml: the same rows as the default ladder, every MaC-Cal row under
    its reading (docs/methods.md §1.9)."""
    ladder = load_ladder(LADDER.with_name(f"mac_cal_{reading}.yaml"))
    steps, skipped = ladder.steps(make_config(method={"name": "vanilla"}), "incremental")
    default, _ = load_ladder(LADDER).steps(make_config(method={"name": "vanilla"}), "incremental")
    assert skipped == [] and [s.label for s in steps] == [s.label for s in default]
    for step, same in zip(steps[1:], default[1:], strict=True):
        params, reference = method_of(step).params, method_of(same).params
        assert (params.mask_mode, params.inference_weights) == (reading, inference)
        assert (params.head, params.gradient_restriction, params.adaptive_retention) == (
            reference.head, reference.gradient_restriction, reference.adaptive_retention)


def test_leave_one_out_skips_invalid_steps_with_a_reason(make_config):
    steps, skipped = load_ladder(LADDER).steps(make_config(method={"name": "vanilla"}), "leave_one_out")
    labels = [s.label for s in steps]
    assert labels[0] == "full" and "− +Gradient Restriction" in labels
    full = method_of(steps[0]).params
    assert (full.head, full.adaptive_retention) == ("bottleneck", "decay")
    no_gr = method_of(steps[labels.index("− +Gradient Restriction")]).params
    assert no_gr.gradient_restriction is False and no_gr.adaptive_retention == "decay"
    assert len(skipped) == 1 and skipped[0].startswith("− +Masked Retraining: ")


def test_factorial_enumerates_subsets(make_config):
    ladder = parse_ladder({
        "baseline": {"name": "base", "set": {"method": {"name": "mac_cal", "epochs": 2}}},
        "components": [{"name": "gr-off", "set": {"method.gradient_restriction": False}},
                       {"name": "static", "set": {"method.adaptive_retention": "static"}}],
    })
    steps, skipped = ladder.steps(make_config(), "factorial")
    assert [s.label for s in steps] == ["base", "gr-off", "static", "gr-off static"] and skipped == []


@pytest.mark.parametrize(("data", "message"), [
    ({"components": []}, "a ladder is a mapping with `baseline` and `components`"),
    ({"baseline": {"name": "b", "set": {}}, "components": []}, "`components` must be a non-empty list"),
    ({"baseline": {"name": "b"}, "components": [{"name": "x", "set": {}}]}, "`baseline` must be a mapping"),
    ({"baseline": {"name": "b", "set": {}}, "components": [{"name": "x", "set": {}}, {"name": "x", "set": {}}]},
     "component names must be unique"),
    ({"baseline": {"name": "b", "set": {}}, "components": [{"name": "x", "set": {}}], "extra": 1},
     r"unknown key\(s\) \['extra'\]"),
])
def test_ladder_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_ladder(data, source="ladder.yaml")


def test_bad_mode(make_config):
    with pytest.raises(ConfigError, match="`mode` must be one of incremental, leave_one_out, factorial"):
        load_ladder(LADDER).steps(make_config(), "shuffle")  # type: ignore[arg-type]
