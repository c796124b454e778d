"""A config as a table row in a file: what a search writes of its choice, and what ``--row FILE [LABEL]`` reads.

The file (YAML) holds ``label``, ``method``, ``loss`` and ``stage1`` (the row's fields: a method and loss by
name with the fields the search set, the Stage-I changes), ``tuning_seeds`` (the seeds the search chose it on)
and ``configs_tried`` (how many configs it was chosen among), and ``search`` (where it came from, not read).
A table study runs it as one of its rows, on its own preset, setups and seeds, like its default rows; a run on
any of its tuning seeds is refused (a row scored on the seeds it was tuned on looks better than it is) unless
``--allow-tuning-seeds``. A file written before the tuning seeds were recorded has none to check: a note says so.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from calib._config import ConfigError
from calib.config import parse_trial_config
from calib.registries import DEFAULT_LOSS, LOSSES, METHODS
from calib.study.presets import PRESETS, base_config
from calib.study.row import Row
from calib.study.sources import preset_of, study_seeds

__all__ = ["ROW_FILE_KEYS", "add_row_args", "check_tuning_seeds", "default_row", "file_rows", "read_row_file",
           "row_of_config", "tuning_seeds", "write_row_file"]

ROW_FILE_KEYS = ("label", "method", "loss", "stage1", "tuning_seeds", "configs_tried", "search")
SECTIONS = ("method", "loss", "stage1")


def row_of_config(config: Mapping[str, Any], keys: Sequence[str]) -> Row:
    """The row of a trial config whose ``keys`` (dotted, or a whole section) a search set: the method and loss
    by name with those of their fields, and those Stage-I fields; everything else is the table study's."""
    sections: dict[str, dict[str, Any]] = {"method": {"name": config["method"]["name"]},
                                           "loss": {"name": config["loss"]["name"]}, "stage1": {}}
    for key in keys:
        section, _, name = key.partition(".")
        if section not in sections:
            continue
        if not name:  # the space's base replaced the whole section
            sections[section].update({k: v for k, v in config[section].items()})
        else:
            sections[section][name] = config[section][name]
    return Row(loss=sections["loss"], method=sections["method"], stage1=sections["stage1"])


def default_row(row: Row, rows: Mapping[str, Row]) -> tuple[str, Row]:
    """The table's row of ``row``'s method and loss at their defaults (its label and row), or, where the table
    has none, the method and loss by name labelled ``"<method> (defaults)"``."""
    for label, candidate in rows.items():
        if (candidate.method.get("name") == row.method["name"] and candidate.loss.get("name") == row.loss["name"]
                and len(candidate.method) == 1 and len(candidate.loss) == 1 and not candidate.stage1):
            return label, candidate
    plain = Row(loss={"name": row.loss["name"]}, method={"name": row.method["name"]})
    return f"{METHODS.get(row.method['name']).label or row.method['name']} (defaults)", plain


def write_row_file(path: Path, label: str, row: Row, search: Mapping[str, Any], *,
                   tuning_seeds: Sequence[int] = (), configs_tried: int | None = None) -> Path:
    """Write ``row`` as a row file at ``path`` (folders made) and return it: ``tuning_seeds``, the seeds the search
    chose it on, ``configs_tried``, how many configs it was chosen among."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"label": label, "method": dict(row.method), "loss": dict(row.loss), "stage1": dict(row.stage1),
            "tuning_seeds": sorted({int(s) for s in tuning_seeds}), "configs_tried": configs_tried,
            "search": dict(search)}
    header = ("# A searched config as a table row (docs/studies/search.md#from-a-search-to-a-table):\n"
              f"#   python studies/compare_methods.py --row {path} [LABEL]\n")
    path.write_text(header + yaml.safe_dump(body, sort_keys=False, allow_unicode=True))
    return path


def _check_fields(path: str, row: Row) -> None:
    """A ``ConfigError`` naming the file when the row's fields are not its method's, loss's or Stage I's."""
    preset = PRESETS.get("quick")
    config = base_config(preset, study="row_file", dataset=preset.datasets[0], seed=0, method=dict(row.method),
                         loss=dict(row.loss), data_root="/", artifact_root="/")
    config["stage1"].update(row.stage1)
    try:
        parse_trial_config(config)
    except ConfigError as err:
        raise ConfigError(f"--row {path}: {err}") from None


def _load(path: str) -> dict[str, Any]:
    """The mapping a row file holds; a ``ConfigError`` naming the file when it is not one of known keys."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--row {path}: cannot read it as YAML ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else err}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--row {path}: a row file is a YAML mapping with {', '.join(ROW_FILE_KEYS)}; got "
                          f"{type(data).__name__}.")
    unknown = sorted(set(data) - set(ROW_FILE_KEYS))
    if unknown:
        raise ConfigError(f"--row {path}: unknown key(s) {', '.join(map(str, unknown))}; a row file has "
                          f"{', '.join(ROW_FILE_KEYS)}.")
    return data


def tuning_seeds(path: str) -> list[int] | None:
    """The seeds the row file's config was tuned on (None: a file written before they were recorded); a
    ``ConfigError`` when its ``tuning_seeds`` is not a list of integers."""
    seeds = _load(path).get("tuning_seeds")
    if seeds is None:
        return None
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError(f"--row {path}: `tuning_seeds` must be a list of integer seeds, got {seeds!r}.")
    return seeds


def read_row_file(path: str, label: str | None = None) -> tuple[str, Row]:
    """The (label, row) of a row file (``label``: instead of the file's); a ``ConfigError`` naming the file and
    what is wrong with it."""
    data = _load(path)
    for section in SECTIONS:
        if not isinstance(data.get(section, {}), dict):
            raise ConfigError(f"--row {path}: `{section}` must be a mapping of its fields, got {data[section]!r}.")
    method, loss = dict(data.get("method") or {}), dict(data.get("loss") or {"name": DEFAULT_LOSS})
    if "name" not in method:
        raise ConfigError(f"--row {path}: `method` needs a `name` (one of {', '.join(METHODS.names())}).")
    METHODS.get(method["name"])
    LOSSES.get(loss.setdefault("name", DEFAULT_LOSS))
    row = Row(loss=loss, method=method, stage1=dict(data.get("stage1") or {}))
    _check_fields(path, row)
    label = label if label is not None else data.get("label")
    if not isinstance(label, str) or not label.strip():
        raise ConfigError(f"--row {path}: the file has no `label`: give one, --row {path} LABEL.")
    return label, row


class _RowAction(argparse.Action):
    """``--row FILE [LABEL]``: a file and an optional label (read by :func:`file_rows` when the study starts)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if not 1 <= len(values) <= 2:
            parser.error(f"--row takes a file and an optional label, got {len(values)} values: {' '.join(values)}")
        getattr(namespace, self.dest).append(tuple(values))


def add_row_args(parser: argparse.ArgumentParser) -> None:
    """``--row FILE [LABEL]`` (repeatable): a row file (a search's choice) as one more row of the table;
    ``--allow-tuning-seeds``: run it on the seeds it was tuned on too."""
    parser.add_argument("--row", nargs="+", action=_RowAction, default=[], metavar="FILE [LABEL]",
                        help="also run this row file as a row of the table (a search's chosen config: "
                             "studies/search.py writes it), labelled LABEL or the file's label; repeatable. Refused "
                             "on the seeds the file was tuned on (its tuning_seeds)")
    parser.add_argument("--allow-tuning-seeds", action="store_true",
                        help="run --row files on the seeds they were tuned on too (their numbers there are biased "
                             "towards them)")


def _read_rows(args: argparse.Namespace) -> list[tuple[str, Row]]:
    out = []
    for entry in getattr(args, "row", None) or []:
        try:
            out.append(read_row_file(*entry))
        except KeyError as err:  # an unknown method or loss name: its message lists the valid ones
            raise ConfigError(f"--row {entry[0]}: {str(err).strip(chr(34) + chr(39))}") from None
    return out


def check_tuning_seeds(args: argparse.Namespace) -> None:
    """A ``ConfigError`` naming a ``--row`` file and the seeds of this run it was tuned on (unless
    ``--allow-tuning-seeds``); a note for a file that records none."""
    seeds = study_seeds(args, preset_of(args))
    for path, *_ in getattr(args, "row", None) or []:
        tuned = tuning_seeds(path)
        if tuned is None:
            print(f"[{args.study}] note: --row {path} records no tuning seeds (written before row files did), so "
                  f"nothing checks that --seeds {' '.join(map(str, seeds))} are not the ones it was tuned on")
            continue
        overlap = sorted(set(tuned) & set(seeds))
        if overlap and not getattr(args, "allow_tuning_seeds", False):
            raise ConfigError(
                f"--row {path} was tuned on seeds {' '.join(map(str, tuned))}, and this run's seeds include "
                f"{' '.join(map(str, overlap))}: a row scored on the seeds it was tuned on looks better than it is. "
                f"Give --seeds without them, or --allow-tuning-seeds to run it there anyway.")


def file_rows(args: argparse.Namespace) -> list[tuple[str, Row]]:
    """The (label, row) of each ``--row`` file, read and checked (a ``ConfigError`` naming the bad file, or one
    tuned on a seed of this run: :func:`check_tuning_seeds`)."""
    out = _read_rows(args)
    check_tuning_seeds(args)
    return out
