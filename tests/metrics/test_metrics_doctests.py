"""Run the doctests of every calib.metrics module, so the documented outputs stay exact."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import calib.metrics

MODULES = sorted(info.name for info in pkgutil.iter_modules(calib.metrics.__path__, "calib.metrics."))


def test_every_module_is_listed() -> None:
    assert "calib.metrics.ece" in MODULES and "calib.metrics._binning" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    if name != "calib.metrics._validation":
        assert result.attempted > 0, f"{name} has no doctest"
