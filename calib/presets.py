"""Moved to :mod:`calib.study.presets` (presets are the study layer's): ``calib.presets.X`` still gives
``calib.study.presets.X`` until calib 0.2 (:data:`calib._deprecation.REMOVED_AFTER`), with a
``DeprecationWarning`` naming the new module."""

from __future__ import annotations

from typing import Any

from calib._deprecation import warn_renamed
from calib.study import presets as _moved

__all__ = _moved.__all__  # the moved module's names, each served by __getattr__ below


def __getattr__(name: str) -> Any:
    if name in _moved.__all__:
        warn_renamed("calib.presets", stacklevel=3)
        return getattr(_moved, name)
    raise AttributeError(f"module 'calib.presets' has no attribute {name!r}")
