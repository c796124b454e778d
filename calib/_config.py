"""Building validated, frozen config dataclasses from plain dicts.

Every config in calib is a ``@dataclass(frozen=True, kw_only=True)`` whose ``__post_init__`` checks
ranges. :func:`from_dict` adds what dataclasses do not do: it rejects unknown keys (listing the
valid ones), checks each value against the field's type (``Literal`` choices included) and
converts lists to tuples, so a typo in a search-space file or on the command line fails loudly.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import types
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

__all__ = ["ConfigError", "check", "coerce", "field_types", "from_dict", "load_yaml"]

C = TypeVar("C")


class ConfigError(ValueError):
    """A config value is unknown, of the wrong type or out of range; the message names key and value."""


def check(condition: bool, key: str, value: Any, rule: str, hint: str = "") -> None:
    """Raise :class:`ConfigError` ``"`key` must <rule>, got key=value. <hint>"`` unless ``condition``."""
    if not condition:
        raise ConfigError(f"`{key}` must {rule}, got {key}={value!r}." + (f" {hint}" if hint else ""))


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's init fields, in declaration order."""
    return dict(_field_types(cls))


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    # resolving hints costs ~0.3 ms a class: a grid parses every trial's config (100,000 at scale) through them
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` checked against the field type ``tp`` (``Literal`` choices, unions, tuples, nested dataclasses)
    and converted (lists to tuples, integral floats to int, ints to float); else :class:`ConfigError` naming
    ``key``."""
    return _coerce(value, tp, key)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(
                f"`{key}` must be one of {', '.join(repr(c) for c in choices)}, got {key}={value!r}."
            )
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"`{key}` must not be None.")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"`{key}` has an invalid value {value!r}.")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"`{key}` must be a list, got {key}={value!r}.")
        (item_type, *_rest) = get_args(tp)
        return tuple(_coerce(v, item_type, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"`{key}` must be true or false, got {key}={value!r}.")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"`{key}` must be an integer, got {key}={value!r}.")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"`{key}` must be a number, got {key}={value!r}.")
        if not math.isfinite(value):
            raise ConfigError(f"`{key}` must be a finite number, got {key}={value!r}.")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"`{key}` must be a string, got {key}={value!r}.")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"`{key}` must be a mapping of {tp.__name__} fields, got {key}={value!r}.")
        return from_dict(tp, value, prefix=f"{key}.")
    return value


def from_dict(cls: type[C], data: Mapping[str, Any], *, prefix: str = "") -> C:
    """Build ``cls`` from ``data``; unknown keys, wrong types and bad ranges raise :class:`ConfigError`."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"`{prefix.rstrip('.') or cls.__name__}` must be a mapping of {cls.__name__} fields, "
                          f"got {data!r}.")
    types_ = field_types(cls)
    unknown = sorted(set(data) - set(types_), key=str)
    if unknown:
        close = [prefix + c for k in unknown for c in difflib.get_close_matches(str(k), types_, n=1)]
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        valid = f"Valid keys: {', '.join(prefix + k for k in types_)}." if types_ else f"{cls.__name__} has no keys."
        raise ConfigError(
            f"Unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(f'{prefix}{k}') for k in unknown)} for {cls.__name__}. {valid}{hint}"
        )
    kwargs = {k: _coerce(v, types_[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as err:
        if prefix and not str(err).startswith(f"`{prefix}"):
            raise ConfigError(
                str(err).replace("`", f"`{prefix}", 1).replace(", got ", f", got {prefix}", 1)
            ) from None
        raise
    except TypeError as err:  # a required field is missing
        raise ConfigError(f"{cls.__name__}: {err}") from None


def load_yaml(path: str | os.PathLike, what: str) -> Any:
    """The parsed YAML file ``path``; a missing file or invalid YAML is a :class:`ConfigError` naming it.

    ``what`` names the kind of file in messages ("Search space", "Ladder"); a YAML syntax error becomes
    one line: the file, where the parser stopped and what it expected.
    """
    import yaml

    try:
        with open(path) as fh:
            return yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{what} file not found: {os.fspath(path)!r}.") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} file expected, got the directory {os.fspath(path)!r}.") from None
    except OSError as err:
        raise ConfigError(f"{what} file {os.fspath(path)!r} cannot be read: {err.strerror or err}.") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{os.fspath(path)}: not a text (UTF-8) file: {err.reason} at byte {err.start}; "
                          f"a {what.lower()} file is YAML text.") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{os.fspath(path)}: not valid YAML: {problem}{where}. Fix the syntax there (indentation, "
                          f"a missing `:` or an unclosed quote or bracket).") from None
