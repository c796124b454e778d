"""Argument checks shared by the architectures."""

from __future__ import annotations


def check_positive_int(name: str, value: int) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an integer ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1, got {name}={value!r}.")
