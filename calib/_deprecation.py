"""Renamed public names: the old name keeps working for one release, with a ``DeprecationWarning`` naming the new.

:data:`RENAMES` lists every rename still served (tests/core/test_renames.py calls each old form and checks the
warning and the result); a rename adds its line here and calls :func:`warn_renamed` where the old name is read.
"""

from __future__ import annotations

import warnings

__all__ = ["REMOVED_AFTER", "RENAMES", "renamed_message", "warn_renamed"]

REMOVED_AFTER = "0.2"
"""The last release that still reads the old names below."""

RENAMES: dict[str, str] = {
    "TemperatureScaling(line_search=...)": "TemperatureScaling(lbfgs_line_search=...)",
    "post-hoc calibrator 'histogram_binning'": "post-hoc calibrator 'histogram_binning_equal_mass'",
    "LossSpec(build=...)": "calib.losses.register_loss(name, Config, Loss, description, label=..., order=...)",
    "posthoc.py --param METHOD.FIELD=VALUE": "posthoc.py --set METHOD.FIELD=VALUE",
    "calib.presets": "calib.study.presets",
}
"""Old form -> new form, as the warning says them."""


def renamed_message(old: str, new: str | None = None) -> str:
    """"<old> is renamed <new>; the old name is read until calib <release>"; ``new`` defaults to ``old``'s entry in
    :data:`RENAMES` (a registry alias names its own)."""
    return f"{old} is renamed {RENAMES[old] if new is None else new}; the old name is read until calib {REMOVED_AFTER}"


def warn_renamed(old: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` (a key of :data:`RENAMES`) is renamed, naming the new form."""
    warnings.warn(renamed_message(old), DeprecationWarning, stacklevel=stacklevel)
