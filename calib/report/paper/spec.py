"""A paper table's spec: one small YAML file per table (``tables/*.yaml``), read and checked before anything runs.

The spec names the studies it reads, its rows (stored label, printed name, order), its columns (setups × metrics with
their headers), the control row, the spread, the decimals, bold, caption and ``\\label``. Every name is checked
against what calib knows (the studies, their rows, the metric columns, the registered datasets and architectures):
an unknown one is a :class:`~calib._config.ConfigError` naming it and what is allowed, before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from calib._config import ConfigError
from calib.metrics import METRICS
from calib.registries import DATASETS, MODELS
from calib.report.tables import PREDICTION_CHANGE_COLUMNS

__all__ = ["SPREADS", "RowCatalog", "RowSpec", "SetupSpec", "TableSpec", "check_metric", "load_spec"]

SPREADS = ("ci", "std", "none")
"""± the 95% CI over seeds, ± their standard deviation, or the mean alone."""
_KEYS = {"name", "caption", "label", "studies", "rows", "row_files", "setups", "metrics", "control", "spread",
         "decimals", "bold", "difference", "published", "description"}
_OTHER_COLUMNS = ("ood_auroc", "ood_fpr95", "corrupted_ece", "corrupted_accuracy", "method_seconds",
                  *PREDICTION_CHANGE_COLUMNS)


@dataclass(frozen=True)
class RowSpec:
    """One row: the ``label`` the store holds and the ``name`` the paper prints; ``against``: the row (label) this
    one is tested against, for a table of pairs (each loss and the loss + MaC-Cal) that no single control covers."""

    label: str
    name: str
    against: str | None = None


@dataclass(frozen=True)
class SetupSpec:
    """One column group: a (dataset, architecture) and its header (``CIFAR-10``)."""

    dataset: str
    arch: str
    header: str


@dataclass(frozen=True)
class RowCatalog:
    """The rows a study can have: ``accepts(label)``, and ``examples`` to name in an error; ``command`` runs it."""

    accepts: Callable[[str], bool]
    examples: tuple[str, ...]
    command: str


@dataclass(frozen=True)
class TableSpec:
    """A parsed, checked table spec (see the module docstring and docs/studies/paper-tables.md)."""

    name: str
    path: Path
    studies: tuple[str, ...]
    rows: tuple[RowSpec, ...]
    setups: tuple[SetupSpec, ...]
    metrics: dict[str, str]
    caption: str
    label: str
    control: str | None = None
    spread: str = "ci"
    decimals: int = 2
    bold: bool = True
    difference: bool = False
    published: bool = False
    row_files: tuple[str, ...] = field(default=())

    def name_of(self, label: str) -> str:
        """The printed name of the stored ``label``."""
        return next((row.name for row in self.rows if row.label == label), label)


def check_metric(column: str, where: str) -> None:
    """A store metric column (``test_ece``, ``val_nll``, ``test_ece_bins10``, ``ood_auroc``, ...), else ConfigError."""
    split, _, name = column.partition("_")
    if column.startswith(_OTHER_COLUMNS) or (split in ("test", "val") and re.sub(r"_bins\d+$", "", name) in METRICS):
        return
    raise ConfigError(f"{where}: unknown metric column {column!r}; allowed: test_<metric> or val_<metric> with "
                      f"<metric> one of {', '.join(METRICS)}, or one of {', '.join(_OTHER_COLUMNS)}")


def _text(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: `{key}` must be a non-empty string, got {value!r}")
    return value


def _rows(value: Any, where: str) -> tuple[RowSpec, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: `rows` must be a non-empty list of labels or {{label, name}}, got {value!r}")
    rows = []
    for entry in value:
        if isinstance(entry, str):
            rows.append(RowSpec(entry, entry))
        elif isinstance(entry, dict) and set(entry) <= {"label", "name", "against"} and "label" in entry:
            label = _text(entry["label"], "rows.label", where)
            against = _text(entry["against"], "rows.against", where) if "against" in entry else None
            rows.append(RowSpec(label, _text(entry.get("name", label), "rows.name", where), against))
        else:
            raise ConfigError(f"{where}: a row must be a label or {{label: ..., name: ..., against: ...}}, "
                              f"got {entry!r}")
    labels = [row.label for row in rows]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{where}: row {next(x for x in labels if labels.count(x) > 1)!r} is listed twice")
    for row in rows:
        if row.against is not None and (row.against not in labels or row.against == row.label):
            raise ConfigError(f"{where}: row {row.label!r} is tested against {row.against!r}, which is not another "
                              f"row of the spec; rows: {', '.join(labels)}")
    return tuple(rows)


def _setups(value: Any, where: str) -> tuple[SetupSpec, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: `setups` must be a list of {{dataset, arch, header}}, got {value!r}")
    setups = []
    for entry in value:
        if not isinstance(entry, dict) or not {"dataset", "arch"} <= set(entry) <= {"dataset", "arch", "header"}:
            raise ConfigError(f"{where}: a setup must be {{dataset: ..., arch: ..., header: ...}}, got {entry!r}")
        dataset, arch = str(entry["dataset"]), str(entry["arch"])
        if dataset not in DATASETS:
            raise ConfigError(f"{where}: unknown dataset {dataset!r} in setups; registered: {', '.join(DATASETS)}")
        if arch not in MODELS:
            raise ConfigError(f"{where}: unknown architecture {arch!r} in setups; registered: {', '.join(MODELS)}")
        setups.append(SetupSpec(dataset, arch, str(entry.get("header", f"{dataset} · {arch}"))))
    return tuple(setups)


def _choice(data: Mapping[str, Any], key: str, default: Any, allowed: tuple[Any, ...], where: str) -> Any:
    value = data.get(key, default)
    if value not in allowed or type(value) is not type(default):
        raise ConfigError(f"{where}: `{key}` must be one of {', '.join(map(str, allowed))}, got {value!r}")
    return value


def load_spec(path: str | Path, catalogs: Mapping[str, Callable[[tuple[str, ...]], RowCatalog]]) -> TableSpec:
    """Read and check the spec at ``path``. ``catalogs``: study -> its :class:`RowCatalog` given the spec's
    ``row_files`` (a ``<search>_confirm`` study is looked up as ``*_confirm``). ConfigError on anything unknown."""
    path = Path(path)
    where = str(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--table {path}: no such file") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a table spec is a mapping (name, studies, rows, metrics, ...), got {data!r}")
    if unknown := sorted(set(data) - _KEYS):
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_KEYS))}")
    studies = data.get("studies")
    if not isinstance(studies, list) or not studies or not all(isinstance(s, str) for s in studies):
        raise ConfigError(f"{where}: `studies` must be a non-empty list of study names, got {studies!r}")
    row_files = data.get("row_files", [])
    if not isinstance(row_files, list) or not all(isinstance(f, str) for f in row_files):
        raise ConfigError(f"{where}: `row_files` must be a list of row-file paths, got {row_files!r}")
    for study in studies:
        if study not in catalogs and not (study.endswith("_confirm") and "*_confirm" in catalogs):
            raise ConfigError(f"{where}: unknown study {study!r}; known: {', '.join(sorted(catalogs))}")
    rows = _rows(data.get("rows"), where)
    found = {study: catalogs[study if study in catalogs else "*_confirm"](tuple(row_files)) for study in studies}
    for row in rows:
        if not any(catalog.accepts(row.label) for catalog in found.values()):
            examples = sorted({e for catalog in found.values() for e in catalog.examples})
            raise ConfigError(f"{where}: unknown row {row.label!r} for {', '.join(studies)}; rows: "
                              + ", ".join(examples[:60]) + (", ..." if len(examples) > 60 else ""))
    metrics = data.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise ConfigError(f"{where}: `metrics` must map store columns to headers (test_ece: ECE), got {metrics!r}")
    for column in metrics:
        check_metric(str(column), where)
    control = data.get("control")
    if control is not None and control not in {row.label for row in rows}:
        raise ConfigError(f"{where}: the control {control!r} is not one of the spec's rows")
    if control is not None and any(row.against for row in rows):
        raise ConfigError(f"{where}: `control` and rows' `against` exclude each other: one control for every row, "
                          f"or each row against its own")
    decimals = data.get("decimals", 2)
    if not isinstance(decimals, int) or isinstance(decimals, bool) or not 0 <= decimals <= 6:
        raise ConfigError(f"{where}: `decimals` must be an integer in 0..6, got {decimals!r}")
    name = _text(data.get("name", path.stem), "name", where)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ConfigError(f"{where}: `name` names the written files: letters, digits, _ . - only, got {name!r}")
    return TableSpec(
        name=name, path=path, studies=tuple(studies), rows=rows,
        setups=_setups(data.get("setups", []), where), metrics={str(k): str(v) for k, v in metrics.items()},
        caption=_text(data.get("caption"), "caption", where), label=_text(data.get("label"), "label", where),
        control=control, spread=_choice(data, "spread", "ci", SPREADS, where), decimals=decimals,
        bold=_choice(data, "bold", True, (True, False), where),
        difference=_choice(data, "difference", False, (True, False), where),
        published=_choice(data, "published", False, (True, False), where), row_files=tuple(row_files))
