"""A row of a study's table: a loss, a method and Stage-I changes (the rows themselves: :mod:`calib.study.rows`;
read from a file: :mod:`calib.study.row_file`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from calib.registries import DEFAULT_LOSS

__all__ = ["Row"]


@dataclass(frozen=True)
class Row:
    """One labelled config variant: a loss, a method and Stage-I changes (each ``{"name": ..., **fields}``)."""

    loss: Mapping[str, Any] = field(default_factory=lambda: {"name": DEFAULT_LOSS})
    method: Mapping[str, Any] = field(default_factory=lambda: {"name": "vanilla"})
    stage1: Mapping[str, Any] = field(default_factory=dict)
