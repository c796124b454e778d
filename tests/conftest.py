"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trial_fixtures import tiny_config


@pytest.fixture
def make_config(tmp_path: Path):
    """``make_config(**kwargs)``: a valid tiny trial config under this test's tmp_path."""

    def factory(**kwargs: Any) -> dict[str, Any]:
        return tiny_config(tmp_path, **kwargs)

    return factory
