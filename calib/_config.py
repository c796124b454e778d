"""Building validated, frozen config dataclasses from plain dicts.

Every config in calib is a ``@dataclass(frozen=True, kw_only=True)`` whose ``__post_init__`` checks
ranges. :func:`from_dict` adds what dataclasses do not do: it rejects unknown keys (listing the
valid ones), checks each value against the field's type (``Literal`` choices included) and
converts lists to tuples, so a typo in a search-space file or on the command line fails loudly.

A field declares its own check: :func:`checked_field` attaches a :class:`Rule` (:func:`integer`, :func:`number`,
:func:`in_range`, :func:`or_null`, :func:`all_of`), a ``Literal`` type is its own rule (one of its choices), and
:func:`check_fields` runs every field's rule, so a hyperparameter's default and check are written once, on the config;
a calibrator checks its constructor's arguments against the same rules (:func:`check_values`), with the same message.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import numbers
import os
import re
import types
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

__all__ = [
    "ConfigError",
    "Rule",
    "all_of",
    "check",
    "check_fields",
    "check_values",
    "checked_field",
    "coerce",
    "config_fields",
    "did_you_mean",
    "field_rules",
    "field_symbols",
    "field_types",
    "fields_of_symbol",
    "from_dict",
    "get_dotted",
    "in_range",
    "integer",
    "joined_configs",
    "load_yaml",
    "named_section",
    "number",
    "one_of",
    "or_null",
    "set_dotted",
    "symbol_name",
]

C = TypeVar("C")


class ConfigError(ValueError):
    """A config value is unknown, of the wrong type or out of range; the message names key and value."""


def did_you_mean(names: str | Iterable[object], choices: Iterable[str], *, n: int = 1,
                 show: Callable[[str], str] = repr, first: Sequence[str] = (),
                 form: str = " Did you mean {}?") -> str:
    """The hint of an unknown name: ``form`` naming the ``n`` ``choices`` closest to each of ``names`` (as ``show``
    writes them), or ``first`` (fields named by their paper's symbol) where there are any; "" when none is close.

    >>> did_you_mean("gama", ["gamma", "alpha"])
    " Did you mean 'gamma'?"
    """
    choices = [str(c) for c in choices]
    close = list(first) or [show(c) for name in ([names] if isinstance(names, str) else names)
                            for c in difflib.get_close_matches(str(name), choices, n=n)]
    return form.format(" or ".join(close)) if close else ""


def check(condition: bool, key: str, value: Any, rule: str, hint: str = "") -> None:
    """Raise :class:`ConfigError` ``"`key` must <rule>, got key=value. <hint>"`` unless ``condition``."""
    if not condition:
        raise ConfigError(f"`{key}` must {rule}, got {key}={value!r}." + (f" {hint}" if hint else ""))


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a field's value must be: ``holds(value)`` tests it, ``what`` completes the message
    "`key` must be <what>, got key=value."."""

    what: str
    holds: Callable[[Any], bool]

    def check(self, key: str, value: Any) -> None:
        """Raise :class:`ConfigError` naming ``key`` and ``value`` unless the rule holds."""
        check(self.holds(value), key, value, f"be {self.what}")


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def integer(*, at_least: int) -> Rule:
    """An integer >= ``at_least``.

    >>> integer(at_least=1).holds(3), integer(at_least=1).holds(0), integer(at_least=1).holds(2.0)
    (True, False, False)
    """
    return Rule(f"an integer >= {at_least}", lambda value: _is_integer(value) and value >= at_least)


def number(*, at_least: float | None = None, above: float | None = None) -> Rule:
    """A finite real number, >= ``at_least`` or > ``above`` when given.

    >>> number(above=0).what, number(above=0).holds(0.0), number(at_least=0).holds(0), number().holds(math.inf)
    ('a finite number > 0', False, True, False)
    """
    if above is not None:
        return Rule(f"a finite number > {above:g}", lambda value: _is_number(value) and value > above)
    if at_least is not None:
        return Rule(f"a finite number >= {at_least:g}", lambda value: _is_number(value) and value >= at_least)
    return Rule("a finite number", _is_number)


def in_range(*, at_least: float | None = None, above: float | None = None, below: float | None = None,
             at_most: float | None = None) -> Rule:
    """A real number within the bounds given (±inf where they allow it; never NaN); the message names only the
    bounds, as the losses' checks always have: ">= 0", "> 0", "in [0, 1)", "in (0, 1]".

    >>> in_range(at_least=0).what, in_range(at_least=0, below=1).what, in_range(above=0, at_most=1).holds(1)
    ('>= 0', 'in [0, 1)', True)
    """
    low, high = (at_least if at_least is not None else above), (at_most if at_most is not None else below)
    if low is None and high is None:
        raise ValueError("in_range needs a bound.")
    if low is not None and high is not None:
        what = f"in {'[' if at_least is not None else '('}{low:g}, {high:g}{']' if at_most is not None else ')'}"
    elif low is not None:
        what = f"{'>=' if at_least is not None else '>'} {low:g}"
    else:
        what = f"{'<=' if at_most is not None else '<'} {high:g}"

    def holds(value: Any) -> bool:
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or math.isnan(value):
            return False
        return ((at_least is None or value >= at_least) and (above is None or value > above)
                and (below is None or value < below) and (at_most is None or value <= at_most))

    return Rule(what, holds)


@dataclasses.dataclass(frozen=True)
class _AllOf(Rule):
    rules: tuple[Rule, ...] = ()

    def check(self, key: str, value: Any) -> None:
        for rule in self.rules:
            rule.check(key, value)


def all_of(*rules: Rule) -> Rule:
    """Every one of ``rules``; a value that breaks some is reported by the first of them.

    >>> all_of(number(), in_range(at_least=0)).what
    'a finite number and >= 0'
    """
    return _AllOf(" and ".join(rule.what for rule in rules), lambda value: all(r.holds(value) for r in rules), rules)


def one_of(choices: tuple[Any, ...]) -> Rule:
    """One of ``choices``; the message lists them (a ``Literal`` field's rule)."""
    return Rule(f"one of {', '.join(repr(c) for c in choices)}", lambda value: value in choices)


def or_null(rule: Rule, meaning: str) -> Rule:
    """None (which means ``meaning``) or a value ``rule`` accepts."""
    return Rule(f"null ({meaning}) or {rule.what}", lambda value: value is None or rule.holds(value))


def checked_field(default: Any, rule: Rule | None, **metadata: Any) -> Any:
    """A dataclass field with its default and its :class:`Rule` (checked by :func:`check_fields`; None: no rule),
    and any further ``metadata`` its class reads (a command-line flag's help, say)."""
    return dataclasses.field(default=default, metadata={**metadata, **({"rule": rule} if rule else {})})


@functools.cache
def field_rules(cls: type) -> dict[str, Rule]:
    """The rule of each checked field of dataclass ``cls``: a :func:`checked_field`'s, or a ``Literal``'s choices."""
    rules = {}
    types_ = _field_types(cls)
    for f in dataclasses.fields(cls):
        if "rule" in f.metadata:
            rules[f.name] = f.metadata["rule"]
        elif get_origin(types_.get(f.name)) is Literal:
            rules[f.name] = one_of(get_args(types_[f.name]))
    return rules


def check_values(cls: type, values: Mapping[str, Any]) -> None:
    """Check ``values`` by the rules of the fields of ``cls`` they are named after (:class:`ConfigError`); others
    are not checked. A calibrator checks its constructor's arguments so: ``check_values(Config, locals())``."""
    rules = field_rules(cls)
    for key, value in values.items():
        if key in rules:
            rules[key].check(key, value)


def check_fields(config: Any) -> None:
    """Check every field of the dataclass instance ``config`` by its rule (a config's ``__post_init__``)."""
    check_values(type(config), {name: getattr(config, name) for name in field_rules(type(config))})


def joined_configs(cls: type) -> tuple[type, ...]:
    """The config dataclasses whose fields are keys of ``cls``'s section too, after its own: what its classmethod
    ``joined_configs()`` returns (:class:`~calib.config.Stage1Config`: the registered training procedures'
    configs, so ``stage1.mixup_alpha`` is a key of the ``stage1`` section); none for any other class."""
    joined = getattr(cls, "joined_configs", None)
    return tuple(joined()) if joined is not None else ()


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's init fields, in declaration order, then those of its
    :func:`joined_configs`."""
    out = dict(_field_types(cls))
    for joined in joined_configs(cls):
        out.update(_field_types(joined))
    return out


def config_fields(cls: type) -> list[dataclasses.Field]:
    """The init fields of dataclass ``cls`` and of its :func:`joined_configs` (their defaults), in the order of
    :func:`field_types`."""
    return [f for c in (cls, *joined_configs(cls)) for f in dataclasses.fields(c) if f.init]


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
        one_of(get_args(tp)).check(key, value)
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


def named_section(data: Any, key: str) -> tuple[Any, dict[str, Any]]:
    """(name, the other keys) of a config section given as a name or a mapping with a ``name`` key
    (``method: ts`` or ``method: {name: ts, objective: nll}``); anything else is a :class:`ConfigError`.

    >>> named_section("ts", "method"), named_section({"name": "ts", "lr": 1}, "method")
    (('ts', {}), ('ts', {'lr': 1}))
    """
    if isinstance(data, str):
        return data, {}
    if not isinstance(data, Mapping) or "name" not in data:
        raise ConfigError(f"`{key}` must be a mapping with a `name` key, got {key}={data!r}.")
    params = dict(data)
    return params.pop("name"), params


_ATTRIBUTE_LINE = re.compile(r"^\s+([a-z_][a-z0-9_]*): ([\u0370-\u03ff][^\s,:(]*)")


def symbol_name(text: str) -> str:
    """``text`` (a paper's symbol or its spelling) as compared: Greek letters spelled out, no ``_``, lower case
    (``θ_0``, ``theta_0`` and ``Theta0`` are all ``theta0``)."""
    spelled = "".join(unicodedata.name(c).split()[-1].lower() if "\u0370" <= c <= "\u03ff" else c for c in text)
    return spelled.replace("_", "").lower().replace("lamda", "lambda")  # Unicode's name of λ


def field_symbols(cls: type) -> dict[str, str]:
    """The paper's symbol of each field of the config dataclass ``cls`` that its docstring gives one
    (``accuracy_weight: γ, ...`` under Attributes): field -> symbol."""
    return {m.group(1): m.group(2).rstrip(".;") for c in (cls, *joined_configs(cls))
            for line in (c.__doc__ or "").splitlines()
            if (m := _ATTRIBUTE_LINE.match(line)) and m.group(1) in field_types(c)}


def fields_of_symbol(cls: type, text: str, prefix: str = "") -> list[str]:
    """The fields of ``cls`` whose symbol ``text`` spells (``gamma``, ``γ``, ``theta_0``), each as a "did you mean"
    names it: ``'<prefix><field>' (<symbol>)``."""
    return [f"{prefix + field!r} ({symbol})" for field, symbol in field_symbols(cls).items()
            if symbol_name(symbol) == symbol_name(text)]


def from_dict(cls: type[C], data: Mapping[str, Any], *, prefix: str = "") -> C:
    """Build ``cls`` from ``data``; unknown keys, wrong types and bad ranges raise :class:`ConfigError`."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"`{prefix.rstrip('.') or cls.__name__}` must be a mapping of {cls.__name__} fields, "
                          f"got {data!r}.")
    types_ = field_types(cls)
    unknown = sorted(set(data) - set(types_), key=str)
    if unknown:
        hint = did_you_mean(unknown, types_, show=lambda c: repr(prefix + c),
                            first=[f for k in unknown for f in fields_of_symbol(cls, str(k), prefix)])
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
    # lazy: pyyaml on first use (every module imports this one; few read YAML)
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


def get_dotted(config: dict[str, Any], key: str) -> Any:
    """The value at ``key`` ("method.accuracy_weight", "seed") of a plain config; ``KeyError`` if absent."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"`{key}` is not in the trial config ({part!r} missing).")
        node = node[part]
    return node


def set_dotted(config: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy of ``config`` with ``key`` ("method.accuracy_weight", "seed") set to ``value``."""
    out = json.loads(json.dumps(config))
    *parents, leaf = key.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"`{key}`: {part!r} is not a section of the trial config.")
    node[leaf] = value
    return out
