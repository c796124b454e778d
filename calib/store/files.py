"""The files of the result store: their names, and listing them.

Each table (``trials``, ``history``, ``predictions``) is a hive-partitioned folder of Parquet files of two kinds::

    <store>/<table>/study=<study>/<trial_id>.parquet       a trial's own file, written by its worker
    <store>/<table>/study=<study>/part-<32 hex>.parquet    a part: the rows of many finished trials

A trial's own file is the unit of durability: its worker writes it when the trial ends. A compaction
(:mod:`calib.store.compaction`) moves the rows of finished trials into parts and deletes their own
files. Any other visible file under a table is foreign to the store: readers skip it with a warning.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

import pyarrow.fs as pafs

from calib import storage
from calib.config import validate_study_name

__all__ = ["TABLES", "StoreFile", "file_location", "list_table", "new_part_name", "study_folder", "table_location",
           "trial_file"]

TABLES = ("trials", "history", "predictions")
_TRIAL_FILE = re.compile(r"[0-9a-f]{16}\.parquet")
_PART_FILE = re.compile(r"part-[0-9a-f]{32}\.parquet")


def table_location(store: str, table: str) -> str:
    return storage.join(store, table)


def study_folder(store: str, table: str, study: str) -> str:
    return storage.join(store, table, f"study={validate_study_name(study)}")


def trial_file(store: str, table: str, study: str, trial_id: str) -> str:
    """Where the worker of ``trial_id`` writes its row(s) of ``table``."""
    return storage.join(study_folder(store, table, study), f"{trial_id}.parquet")


def file_location(store: str, path: str) -> str:
    """The location (path or URI) of ``path``, a path inside the file system of ``store``."""
    return f"{store[: store.index('://') + 3]}{path}" if storage.is_remote(store) else path


def new_part_name() -> str:
    return f"part-{uuid.uuid4().hex}.parquet"


@dataclass(frozen=True)
class StoreFile:
    """One visible file under a table's folder: ``path`` inside the file system, its ``study`` (None
    outside a ``study=`` folder), ``kind``: ``"trial"`` (a trial's own file: ``trial_id`` is its name),
    ``"part"``, or ``None`` (foreign: ``problem`` says why)."""

    path: str
    study: str | None
    kind: str | None
    size: int
    problem: str | None = None
    trial_id: str | None = None


def _classify(root: str, info: pafs.FileInfo) -> StoreFile:
    folder, _, name = info.path[len(root) + 1:].rpartition("/")
    study = folder.removeprefix("study=") if folder.startswith("study=") and "/" not in folder else None
    if study is not None and _TRIAL_FILE.fullmatch(name):
        return StoreFile(info.path, study, "trial", info.size, trial_id=name.removesuffix(".parquet"))
    if study is not None and _PART_FILE.fullmatch(name):
        return StoreFile(info.path, study, "part", info.size)
    problem = ("not named like a store file (expected study=<study>/<16 hex digits>.parquet or "
               "study=<study>/part-<32 hex digits>.parquet)" if name.endswith(".parquet")
               else "not a Parquet file of the store (expected study=<study>/<16 hex digits>.parquet)")
    return StoreFile(info.path, study, None, info.size, problem)


def _hidden(relative: str) -> bool:
    """Names pyarrow, pandas and DuckDB's ``**/*.parquet`` skip: a component starting with "." or "_"."""
    return relative.startswith((".", "_")) or "/." in relative or "/_" in relative


def list_table(fs: pafs.FileSystem, root: str, studies: list[str] | None = None) -> list[StoreFile]:
    """The visible files under the table folder ``root`` (of ``studies`` only, when given), sorted by path.

    Parts sort before trial files within a study: the order in which readers and compactions prefer
    a trial's row when it is, for a moment, in two files.
    """
    folders = [root] if studies is None else [f"{root}/study={validate_study_name(s)}" for s in studies]
    files = []
    for folder in folders:
        selector = pafs.FileSelector(folder, recursive=True, allow_not_found=True)
        for info in fs.get_file_info(selector):
            if info.type == pafs.FileType.File and not _hidden(info.path[len(root) + 1:]):
                files.append(_classify(root, info))
    return sorted(files, key=lambda f: (f.study or "", f.kind != "part", f.path))
