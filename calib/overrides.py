"""``KEY=VALUE`` settings of trial-config fields, typed and checked against the config dataclasses (``--set``).

A key is a dotted trial-config key: a top-level field (``num_bins``, ``cifar100_test_norm``, ``stage2_seed``), or a
field of a section: ``stage1.<field>`` (:class:`~calib.config.Stage1Config`), ``source.<field>``
(:class:`~calib.stage1_source.Stage1Source`), ``method.<field>`` or ``loss.<field>`` (the config class of a
registered method or loss). A value is read as the field's type wants it: ``10``, ``0.05``, ``1e-3``, ``null``,
``true``, ``[150, 250]`` (or ``150,250``), a name (``epoch_start``); a string field keeps its text as given (``off``
stays a string). A method's or a loss's field is typed per config, against that config's method or loss, and applies
only to the configs whose method (loss) has it (:func:`apply_settings`). ``<method name>.<field>``
(``histogram_binning_equal_mass.num_bins=10``) sets the field of that one method only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from calib._config import ConfigError, coerce, config_fields, did_you_mean, field_types, fields_of_symbol
from calib.config import Stage1Config, TrialConfig, set_dotted
from calib.registries import DEFAULT_LOSS, LOSSES, METHODS
from calib.stage1_source import Stage1Source

__all__ = ["ABSENT", "ConfigSetting", "apply_settings", "current_value", "parse_setting", "settable_keys",
           "typed_value"]

_SECTIONS = ("stage1", "source", "method", "loss")
_COMPONENTS = {"method": METHODS, "loss": LOSSES}


@dataclass(frozen=True)
class ConfigSetting:
    """One ``KEY=VALUE``: the dotted trial-config ``key`` it sets, its ``section`` ("stage1", "source", "method",
    "loss"; "" for a top-level field), the ``field`` name, the ``text`` of the value as given, and ``only``: the one
    method it applies to when given as ``<method name>.<field>`` ("": every config that has the field)."""

    key: str
    section: str
    field: str
    text: str
    only: str = ""

    def __str__(self) -> str:
        return f"{self.only}.{self.field}={self.text}" if self.only else f"{self.key}={self.text}"


def _top_level_types() -> dict[str, Any]:
    return {k: v for k, v in field_types(TrialConfig).items() if k not in _SECTIONS}


def _component_fields(section: str) -> dict[str, list[str]]:
    """Field name -> the registered methods (losses) whose config has it."""
    registry = _COMPONENTS[section]
    out: dict[str, list[str]] = {}
    for name in registry.names():
        for field in field_types(registry.get(name).config):
            out.setdefault(field, []).append(name)
    return out


def settable_keys(reserved: Mapping[str, str] = {}) -> list[str]:
    """Every key a setting may name (``method.*``/``loss.*``: the fields of any registered method or loss), less
    ``reserved``."""
    keys = list(_top_level_types()) + [f"stage1.{f}" for f in field_types(Stage1Config)]
    keys += [f"source.{f}" for f in field_types(Stage1Source)]
    keys += [f"{s}.{f}" for s in _COMPONENTS for f in sorted(_component_fields(s))]
    return [k for k in keys if k not in reserved]


def _symbol_fields(key: str) -> list[str]:
    """The fields whose paper's symbol the field of ``key`` spells (``method.gamma``, ``method.θ_0``), each with its
    symbol and, for a method's or a loss's field, the ones whose config has it: ``'method.accuracy_weight' (γ of
    mac_cal)``."""
    section, _, field = key.rpartition(".")
    if section in _COMPONENTS:
        registry = _COMPONENTS[section]
        found: dict[str, list[str]] = {}
        for name in registry.names():
            for hint in fields_of_symbol(registry.get(name).config, field, f"{section}."):
                found.setdefault(hint, []).append(name)
        return [f"{hint[:-1]} of {', '.join(names)})" for hint, names in found.items()]
    classes = {"stage1": [Stage1Config], "source": [Stage1Source], "": [TrialConfig]}.get(section, [])
    return [hint for cls in classes for hint in fields_of_symbol(cls, field, f"{section}." if section else "")]


def _bad_key(key: str, why: str, allowed: Sequence[str]) -> ConfigError:
    hint = did_you_mean(key, allowed, first=_symbol_fields(key))
    return ConfigError(f"`--set {key}`: {why}.{hint} Allowed keys: {', '.join(allowed)}.")


def parse_setting(text: str, reserved: Mapping[str, str] = {}) -> ConfigSetting:
    """``"stage1.epochs=2"`` -> a :class:`ConfigSetting`; its key checked against the config dataclasses and the
    registries, and, where the field's type is known here (every key but ``method.*`` / ``loss.*``), its value.

    ``reserved`` maps keys that another flag sets to that flag (``{"seed": "--seeds"}``): naming one is an error
    that names the flag. A bad key or value raises :class:`ConfigError` naming it and what is allowed."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"`--set` takes KEY=VALUE (a dotted trial-config key such as stage1.epochs=2), "
                          f"got --set {text!r}.")
    if key in reserved:
        raise ConfigError(f"`--set {key}`: {key} is set by {reserved[key]}, not --set.")
    allowed = settable_keys(reserved)
    section, dot, field = key.partition(".") if "." in key else ("", "", key)
    if not dot:
        types = _top_level_types()
        if key in _SECTIONS:
            raise _bad_key(key, f"{key} is a section; set one of its fields ({key}.FIELD)", allowed)
        if key not in types:
            raise _bad_key(key, "not a field of the trial config", allowed)
        typed_value(value, types[key], key)
    elif section in ("stage1", "source"):
        types = field_types(Stage1Config if section == "stage1" else Stage1Source)
        if field not in types:
            what = "Stage1Config" if section == "stage1" else "Stage1Source"
            raise _bad_key(key, f"not a field of {section} ({what})",
                           [k for k in allowed if k.startswith(f"{section}.")])
        typed_value(value, types[field], key)
    elif section in _COMPONENTS:
        fields = _component_fields(section)
        if field not in fields:
            raise _bad_key(key, f"no registered {section} has the field {field!r}",
                           [k for k in allowed if k.startswith(f"{section}.")])
    elif section in METHODS:
        return _one_method_setting(f"{key}={value}", METHODS.canonical(section), field, value)
    else:
        raise _bad_key(key, f"{section!r} is not a section of the trial config ({', '.join(_SECTIONS)}) nor a "
                            f"registered method", allowed)
    return ConfigSetting(key, section, field, value)


def _one_method_setting(text: str, name: str, field: str, value: str) -> ConfigSetting:
    """``text``, ``<method name>.<field>=<value>``: the field of that method alone, its value typed against it."""
    types = field_types(METHODS.get(name).config)
    if field not in types:
        raise ConfigError(f"`--set {text}`: {name} has no field {field!r}; its fields: {', '.join(types) or 'none'}.")
    typed_value(value, types[field], f"{name}.{field}")
    return ConfigSetting(f"method.{field}", "method", field, value, only=name)


def typed_value(text: str, tp: Any, key: str) -> Any:
    """``text`` as a value of type ``tp`` (a config field's annotation): the first reading of it that the type
    accepts among YAML's (numbers, null, true/false, lists), the text itself, a float (``1e-3``, which YAML 1.1
    reads as a string) and a comma-separated list; else the :class:`ConfigError` of YAML's reading, which names
    ``key``, the value and what the type allows."""
    readings: list[Any] = []
    try:
        readings.append(yaml.safe_load(text))
    except yaml.YAMLError:
        pass
    readings.append(text)
    try:
        readings.append(float(text))
    except ValueError:
        pass
    if "," in text and not text.lstrip().startswith("["):
        try:
            readings.append(yaml.safe_load(f"[{text}]"))
        except yaml.YAMLError:
            pass
    first: ConfigError | None = None
    for reading in readings:
        try:
            return _plain(coerce(reading, tp, key))
        except ConfigError as err:
            first = first or err
    assert first is not None
    raise first


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def apply_settings(configs: Sequence[dict[str, Any]], settings: Sequence[ConfigSetting]) -> list[dict[str, Any]]:
    """``configs`` (plain trial-config dicts) with ``settings`` applied, in order, to every config; a
    ``method.FIELD`` (``loss.FIELD``) setting only to the configs whose method (loss) has ``FIELD``, typed against
    it. A ``method``/``loss`` setting that fits none of the configs is a :class:`ConfigError` naming the methods
    (losses) of the configs and the ones that have the field."""
    out = [json.loads(json.dumps(c)) for c in configs]
    for setting in settings:
        applied = 0
        for i, config in enumerate(out):
            if setting.section in _COMPONENTS:
                name = _name(config.get(setting.section))
                types = field_types(_COMPONENTS[setting.section].get(name).config)
                if setting.field not in types or setting.only not in ("", name):
                    continue
                tp = types[setting.field]
            elif setting.section:
                tp = field_types(Stage1Config if setting.section == "stage1" else Stage1Source)[setting.field]
            else:
                tp = _top_level_types()[setting.field]
            if setting.section in _COMPONENTS and isinstance(config.get(setting.section), str):
                config[setting.section] = {"name": config[setting.section]}
            out[i] = set_dotted(config, setting.key, typed_value(setting.text, tp, setting.key))
            applied += 1
        if setting.section in _COMPONENTS and not applied and out:
            _none_has(setting, out)
    return out


ABSENT = object()
"""What :func:`current_value` returns for a config whose method (loss) lacks the setting's field."""


def current_value(config: Mapping[str, Any], setting: ConfigSetting) -> Any:
    """The value that ``config`` (a plain trial-config dict) holds at ``setting.key`` before the setting: its own,
    else the field's default (JSON-plain); :data:`ABSENT` where its method (loss) has no such field."""
    node: Any = config.get(setting.section) if setting.section else config
    if setting.section in _COMPONENTS:
        node = {"name": node} if isinstance(node, str) else (node or {"name": DEFAULT_LOSS})
        if setting.only not in ("", node["name"]):
            return ABSENT
        cls = _COMPONENTS[setting.section].get(node["name"]).config
    else:
        cls = {"stage1": Stage1Config, "source": Stage1Source, "": TrialConfig}[setting.section]
    field = next((f for f in config_fields(cls) if f.name == setting.field), None)
    if field is None:
        return ABSENT
    if isinstance(node, Mapping) and setting.field in node:
        return json.loads(json.dumps(node[setting.field]))
    if field.default is not dataclasses.MISSING:
        return json.loads(json.dumps(field.default))
    if field.default_factory is not dataclasses.MISSING:
        return json.loads(json.dumps(field.default_factory(), default=str))
    return None


def _none_has(setting: ConfigSetting, configs: Sequence[dict[str, Any]]) -> None:
    section = setting.section
    names = dict.fromkeys(_name(c.get(section)) for c in configs)
    if setting.only:
        raise ConfigError(f"`--set {setting}` names method {setting.only!r}; the methods of this run are "
                          f"{', '.join(names)}.")
    having = _component_fields(section).get(setting.field, [])
    fields = sorted({f for n in names for f in field_types(_COMPONENTS[section].get(n).config)})
    raise ConfigError(
        f"`--set {setting.key}`: none of this run's {section}s ({', '.join(names)}) has the field {setting.field!r} "
        f"({', '.join(having)} {'has' if len(having) == 1 else 'have'} it); a {section} setting applies to the trials "
        f"whose {section} has the field. Their fields: {', '.join(f'{section}.{f}' for f in fields) or 'none'}.")


def _name(component: Any) -> str:
    """The registered name of a config's method or loss section (a name, a mapping, or no loss: cross_entropy)."""
    if component is None:
        return DEFAULT_LOSS
    return component if isinstance(component, str) else str(component.get("name"))

