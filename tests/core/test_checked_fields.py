"""A config field declares its default and its rule once (calib._config.checked_field); the config and the
calibrator built from it check a value by that rule, with one message. One test per kind of rule."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Literal

import pytest

from calib._config import (
    ConfigError,
    all_of,
    check_fields,
    check_values,
    checked_field,
    in_range,
    integer,
    number,
    or_null,
)
from calib.posthoc._method import CALIBRATION_FIELDS, build_calibrator, register_posthoc_method
from calib.posthoc.histogram_binning import HistogramBinningEqualMass, HistogramBinningEqualMassConfig
from calib.posthoc.parameterized_ts import ParameterizedTemperatureScaling, ParameterizedTemperatureScalingConfig
from calib.registries import METHODS, POSTHOC


@dataclass(frozen=True, kw_only=True)
class Example:
    bins: int = checked_field(15, integer(at_least=1))
    rate: float = checked_field(0.1, number(above=0))
    weight: float = checked_field(0.0, number(at_least=0))
    exponent: float = checked_field(1.0, number())
    size: int | None = checked_field(None, or_null(integer(at_least=2), "all of it"))
    kind: Literal["a", "b"] = "a"
    share: float = checked_field(0.1, in_range(at_least=0, below=1))
    momentum: float = checked_field(0.5, in_range(above=0, at_most=1))
    gap: float = checked_field(0.0, in_range(at_least=0))
    step: float = checked_field(1.0, all_of(number(), in_range(at_least=0)))

    def __post_init__(self) -> None:
        check_fields(self)


def test_the_defaults_pass():
    assert Example().bins == 15


@pytest.mark.parametrize(("field", "bad", "good", "message"), [
    ("bins", 0, 1, "`bins` must be an integer >= 1, got bins=0."),
    ("bins", 2.0, 2, "`bins` must be an integer >= 1, got bins=2.0."),
    ("bins", True, 3, "`bins` must be an integer >= 1, got bins=True."),
    ("rate", 0.0, 1e-9, "`rate` must be a finite number > 0, got rate=0.0."),
    ("rate", math.inf, 2.0, "`rate` must be a finite number > 0, got rate=inf."),
    ("weight", -0.5, 0, "`weight` must be a finite number >= 0, got weight=-0.5."),
    ("exponent", math.nan, -3.0, "`exponent` must be a finite number, got exponent=nan."),
    ("exponent", "1", 1, "`exponent` must be a finite number, got exponent='1'."),
    ("size", 1, None, "`size` must be null (all of it) or an integer >= 2, got size=1."),
    ("kind", "c", "b", "`kind` must be one of 'a', 'b', got kind='c'."),
    ("share", 1.0, 0.0, "`share` must be in [0, 1), got share=1.0."),
    ("share", math.nan, 0.5, "`share` must be in [0, 1), got share=nan."),
    ("momentum", 0.0, 1.0, "`momentum` must be in (0, 1], got momentum=0.0."),
    ("gap", -1.0, math.inf, "`gap` must be >= 0, got gap=-1.0."),
    ("gap", "1", 0, "`gap` must be >= 0, got gap='1'."),
    ("step", math.inf, 0.0, "`step` must be a finite number, got step=inf."),  # all_of: the first rule it breaks
    ("step", -1.0, 2.0, "`step` must be >= 0, got step=-1.0."),
])
def test_each_kind_of_rule(field, bad, good, message):
    assert getattr(Example(**{field: good}), field) == good
    with pytest.raises(ConfigError) as raised:
        Example(**{field: bad})
    assert str(raised.value) == message
    with pytest.raises(ConfigError) as raised:  # a constructor's arguments, checked by the same rule
        check_values(Example, {field: bad, "self": object()})
    assert str(raised.value) == message


def test_the_config_and_its_calibrator_say_the_same():
    with pytest.raises(ConfigError) as from_config:
        HistogramBinningEqualMassConfig(num_bins=0)
    with pytest.raises(ConfigError) as from_calibrator:
        HistogramBinningEqualMass(num_bins=0)
    assert str(from_config.value) == str(from_calibrator.value) == "`num_bins` must be an integer >= 1, got num_bins=0."


def test_the_calibrator_is_built_from_the_config_by_name_with_the_seed():
    params = ParameterizedTemperatureScalingConfig(top_k=3, steps=7, calibration_size=50)
    calibrator = build_calibrator(ParameterizedTemperatureScaling, params, seed=11)
    assert (calibrator.top_k, calibrator.steps, calibrator.seed) == (3, 7, 11)


def test_every_calibrator_takes_its_configs_defaults():
    """The calibrator's keyword defaults are its config's (read from it, not written again)."""
    checked = 0
    for name in METHODS.names():
        spec = METHODS.get(name)
        if not spec.posthoc or name not in POSTHOC:
            continue
        parameters = inspect.signature(POSTHOC.get(name)).parameters
        for field, default in vars(spec.config()).items():
            if field not in CALIBRATION_FIELDS:
                assert parameters[field].default == default, (name, field)
                checked += 1
    assert checked >= 25


def test_a_calibrator_without_a_fields_argument_is_refused_at_registration():
    class Fixed(HistogramBinningEqualMass):
        def __init__(self) -> None:
            super().__init__()

    with pytest.raises(TypeError, match=r"Fixed must take each field of HistogramBinningEqualMassConfig as a keyword "
                                         r"argument of the same name; it has no 'num_bins'"):
        register_posthoc_method("fixed_bins", HistogramBinningEqualMassConfig, Fixed, "x", label=None)
    assert "fixed_bins" not in METHODS
