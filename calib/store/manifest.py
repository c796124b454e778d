"""A study's fixed config, recorded on its first run so that a changed re-run is refused.

``<store>/manifests/study=<study>.json`` holds the settings every trial of the study shares: each
dotted config key (``stage1.epochs``, ``method.clip_init``...) whose value is the same in all the
run's trials, except the axes that only select trials (``seed``, ``stage2_seed``, ``dataset``, ``arch``); the settings
of each labelled row (``label``: a row of a table, a γ of a sweep, a ladder step); and, for an Optuna
search, the search space. A later run may add seeds, datasets, architectures or rows; a key that is
constant in both runs with different values (``stage1.epochs: 60 → 2``), a row whose settings
changed (``[TST] method.epochs: 40 → 2``) or another search space makes the trials incomparable,
and the run is refused before anything starts.

A study that runs a selection of a fixed table of rows (``compare_methods.py --methods ...``)
computes its manifest from the whole table, so that two runs of different selections agree on
which keys are shared and which belong to rows.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from calib import storage
from calib._config import ConfigError
from calib.config import TrialConfig, added_fields, trial_identity, validate_study_name

__all__ = ["StudyChangedError", "check_manifest", "manifest_of", "new_study_name", "record_manifest"]

SELECTING_KEYS = ("seed", "stage2_seed", "dataset", "arch", "study")


class StudyChangedError(ConfigError):
    """A re-run of a study whose fixed config or search space differs from the stored one."""


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def _shared(flats: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The keys present in every mapping of ``flats`` with one value in all of them."""
    shared: dict[str, Any] | None = None
    for flat in flats:
        shared = flat if shared is None else {k: v for k, v in shared.items() if k in flat and flat[k] == v}
    return shared or {}


def _with_added_defaults(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``flat`` (one config's settings, or a stored manifest's) with the added fields
    (:func:`~calib.config.added_fields`: Stage I's, the method's and the loss's) that identities leave out at their
    default (and manifests written before they existed lack) filled in, where their section is present."""
    out = dict(flat)
    sections = []
    if any(k.startswith("stage1.") for k in flat):
        sections.append(("stage1.", added_fields("stage1")))
    for section in ("method", "loss"):
        if f"{section}.name" in flat:
            sections.append((f"{section}.", added_fields(section, flat[f"{section}.name"])))
    for prefix, defaults in sections:
        for name, default in defaults.items():
            out.setdefault(prefix + name, default)
    return out


def manifest_of(configs: Iterable[TrialConfig], space: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The fixed config of a run: dotted keys with one value across all ``configs`` (selecting axes
    excluded), the same per row label, and the search space of a search."""
    flats: list[tuple[str, dict[str, Any]]] = []
    for cfg in configs:
        flat = {k: v for k, v in _flatten(trial_identity(cfg)).items() if k not in SELECTING_KEYS}
        # Per config, before comparing configs: a field at its default in one row and set in another is a row's.
        flats.append((cfg.label, _with_added_defaults(flat)))
    labels = dict.fromkeys(label for label, _ in flats if label)
    rows = {label: _shared(flat for row, flat in flats if row == label) for label in labels}
    manifest = {"constant": _shared(flat for _, flat in flats), "rows": rows, "space": space}
    # Through JSON, as stored: tuples become lists, so equal configs compare equal.
    return json.loads(json.dumps(manifest))


def _location(store: str, study: str) -> str:
    return storage.join(store, "manifests", f"study={validate_study_name(study)}.json")


def _load(store: str, study: str) -> dict[str, Any] | None:
    location = _location(store, study)
    if not storage.exists(location):
        return None
    fs, path = storage.filesystem(location)
    with fs.open_input_stream(path) as stream:
        return json.loads(stream.read())


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def check_manifest(store: str | os.PathLike, study: str, manifest: Mapping[str, Any]) -> None:
    """Raise :class:`StudyChangedError` if ``study`` exists in ``store`` with another fixed config."""
    stored = _load(storage.normalize(store), study)
    if stored is None:
        return
    # Only the stored side is filled: ``manifest_of`` filled the new one per config, where a field that
    # differs between rows stays out of the shared keys.
    changed = _changes(stored, manifest)
    if changed:
        changes = [f"{where}{key}: {_show(was)} → {_show(now)}" if key else where for where, key, was, now in changed]
        name = new_study_name(store, study, manifest, [(key, now) for _, key, _, now in changed if key])
        raise StudyChangedError(
            f"Study {study!r} is already in the store {storage.normalize(store)} with another fixed config, so the "
            f"new trials would not be comparable with the stored ones. Changed: {'; '.join(changes)}. Re-run with "
            f"the original settings to resume or extend it, or start a new study in the same store: --study {name}"
        )


def _changes(stored: Mapping[str, Any], manifest: Mapping[str, Any]) -> list[tuple[str, str, Any, Any]]:
    """(where: "" or "[row] ", key, stored value, new value) of each change; key "" for the search space."""
    # Only the stored side is filled: ``manifest_of`` filled the new one per config, where a field that
    # differs between rows stays out of the shared keys.
    old, new = _with_added_defaults(stored["constant"]), manifest["constant"]
    shared = old.keys() & new.keys()
    changes = [("", key, old[key], new[key]) for key in sorted(shared) if old[key] != new[key]]
    old_rows, new_rows = stored.get("rows", {}), manifest.get("rows", {})
    for label in sorted(old_rows.keys() & new_rows.keys()):
        was, now = _with_added_defaults(old_rows[label]), new_rows[label]
        changes += [(f"[{label}] ", key, was[key], now[key])
                    for key in sorted((was.keys() & now.keys()) - shared) if was[key] != now[key]]
    if stored.get("space") != manifest.get("space"):
        changes.append(("the search space (parameters, ranges or fixed keys) differs from the stored one", "", None,
                        None))
    return changes


def _name_part(key: str, value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{key.rsplit('.', 1)[-1]}-{text}").strip("_")


def new_study_name(store: str | os.PathLike, study: str, manifest: Mapping[str, Any],
                   changed: Sequence[tuple[str, Any]]) -> str:
    """A study name for a changed run: ``<study>--<field>-<new value>`` per changed key (``compare_methods--
    scheduler_step-epoch_start``), or ``<study>-2`` (``-3``, ...) when nothing but the search space changed or the
    name would pass 100 characters; never a study of ``store`` whose fixed config differs from ``manifest``."""
    parts = list(dict.fromkeys(_name_part(key, value) for key, value in changed))
    base = f"{study}--{'--'.join(parts)}" if parts else ""
    candidates = [base] if base and len(base) <= 100 else []
    candidates += [f"{study}-{n}" for n in range(2, 1000)]
    store = storage.normalize(store)
    for name in candidates:
        stored = _load(store, name)
        if stored is None or not _changes(stored, manifest):
            return name
    return f"{study}-{uuid.uuid4().hex[:8]}"


def record_manifest(store: str | os.PathLike, study: str, manifest: Mapping[str, Any]) -> None:
    """Store ``manifest`` for ``study`` unless one is there already (the first run's stays)."""
    store = storage.normalize(store)
    if _load(store, study) is not None:
        return
    storage.write_bytes(_location(store, study), json.dumps(manifest, sort_keys=True, indent=1).encode())
