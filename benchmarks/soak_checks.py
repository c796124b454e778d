"""The store checks of ``benchmarks/soak.py`` (its docstring lists them): at any moment while a driver runs
(:func:`check_anytime`, polled by a :class:`Watcher`) and at the end of a round, against the uninterrupted
reference run (:func:`check_final`)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch

from calib.store import read_history, read_trials

STUDY = "sensitivity_gamma"
HISTORY_METRICS = ["lr", "train_loss", "train_accuracy", "train_confidence", "val_accuracy", "val_ece", "val_loss",
                   "retention_prob", "clip_threshold"]


def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith((".", "_")) for part in path.relative_to(root).parts)


def _stamp(path: Path) -> str:
    try:
        st = path.stat()
    except FileNotFoundError:
        return f"{path} (gone)"
    return f"{path} ({st.st_size} B, mtime {time.strftime('%H:%M:%S', time.localtime(st.st_mtime))}" \
           f".{int(st.st_mtime * 1000) % 1000:03d})"


def check_anytime(store: Path) -> list[str]:
    """Invariants that must hold at any moment, whatever the driver is doing (empty list: all hold)."""
    problems: list[str] = []
    stored: dict[str, set[str]] = {"trials": set(), "history": set()}
    for kind in ("trials", "history"):
        root = store / kind
        if not root.exists():
            continue
        for path in sorted(root.rglob("*")):
            if not path.is_file() or not _visible(path, root):
                continue
            try:
                table = pq.read_table(path)
            except FileNotFoundError:
                continue  # a compaction deleted it since the listing: its rows are in a part
            except Exception as err:
                problems.append(f"unreadable {kind} file {_stamp(path)}: {type(err).__name__}: {err}")
                continue
            ids = table.column("trial_id").to_pylist() if "trial_id" in table.column_names else []
            if path.name.startswith("part-"):
                stored[kind].update(ids)
                continue
            if ids and set(ids) != {path.stem}:
                problems.append(f"{kind} file {path} holds trial ids {sorted(set(ids))}, not {path.stem}")
            if kind == "trials" and len(ids) != 1:
                problems.append(f"trials file {path} has {len(ids)} rows")
            stored[kind].add(path.stem)
    trials = None
    try:
        if (store / "trials").exists():
            compacting = any((store / "compaction").glob("study=*.json"))
            # A table directory whose only files are hidden temporaries reads as a frame without columns.
            frame = pd.read_parquet(store / "trials")
            if "trial_id" in frame.columns:
                dup = frame["trial_id"][frame["trial_id"].duplicated()]
                if len(dup) and not compacting:
                    problems.append(f"pandas.read_parquet(trials) sees trial ids twice with no compaction under way "
                                    f"or killed: {sorted(set(dup))}")
            elif stored["trials"]:
                problems.append(f"pandas.read_parquet(trials) sees no trial_id column but {len(stored['trials'])} "
                                "stored trials")
        trials = read_trials(store)
        dup = trials["trial_id"][trials["trial_id"].duplicated()]
        if len(dup):
            problems.append(f"read_trials sees trial ids twice: {sorted(set(dup))}")
        history = read_history(store, columns=["trial_id"])
        pruned_or_failed = set(trials.loc[trials["status"] != "ok", "trial_id"])
        for missing in sorted(set(trials["trial_id"]) - set(history["trial_id"]) - pruned_or_failed):
            problems.append(f"trial {missing} is stored without its history rows")
    except Exception as err:
        problems.append(f"reading the store failed: {type(err).__name__}: {err}")
    problems += check_artifacts(store)
    for path in sorted(store.rglob("*.json")) if store.exists() else []:
        if _visible(path, store) and path.parent.parent.name != "stage1":  # records: in check_artifacts
            try:
                json.loads(path.read_text())
            except Exception as err:
                problems.append(f"unreadable {_stamp(path)}: {type(err).__name__}: {err}")
    if trials is not None:
        complete = {d.name for d in (store / "artifacts" / "stage1").glob("*") if (d / "record.json").exists()}
        for row in trials[trials["status"] == "ok"].itertuples():
            if row.stage1_id not in complete:
                problems.append(f"trial {row.trial_id} is ok but its Stage-I artifact {row.stage1_id} is not stored")
    return problems


def check_artifacts(store: Path) -> list[str]:
    """Every visible Stage-I artifact directory is complete and loadable."""
    problems = []
    root = store / "artifacts" / "stage1"
    if not root.exists():
        return problems
    for path in sorted(root.iterdir()):
        if not path.is_dir() or path.name.startswith("."):
            continue
        if not (path / "record.json").exists():
            problems.append(f"artifact directory without record.json: {path} "
                            f"(contents {sorted(p.name for p in path.iterdir())})")
            continue
        try:
            json.loads((path / "record.json").read_text())
        except Exception as err:
            problems.append(f"unreadable {_stamp(path / 'record.json')}: {type(err).__name__}: {err}")
        for name in ("model.pt", "cache.pt"):
            try:
                torch.load(path / name, map_location="cpu", weights_only=True)
            except Exception as err:
                problems.append(f"unloadable {_stamp(path / name)}: {type(err).__name__}: {err}")
    return problems


class Watcher(threading.Thread):
    """A reader polling :func:`check_anytime` while a driver runs."""

    def __init__(self, store: Path, interval: float) -> None:
        super().__init__(daemon=True)
        self.store, self.interval = store, interval
        self.stop = threading.Event()
        self.reads = 0
        self.problems: list[str] = []

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            found = check_anytime(self.store)
            self.reads += 1
            self.problems += [f"(seen by the reader while the driver ran, {time.strftime('%H:%M:%S')}) {p}"
                              for p in found if p not in self.problems]


def _artifact_tensors(store: Path) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
    root = store / "artifacts" / "stage1"
    return {d.name: {name: torch.load(d / name, map_location="cpu", weights_only=True)
                     for name in ("model.pt", "cache.pt")}
            for d in sorted(root.iterdir()) if d.is_dir() and (d / "record.json").exists()}


def _max_diff(a: Any, b: Any) -> float:
    """max |a − b| elementwise (0 when identical, NaN equal to NaN; inf when shapes or NaN placement differ)."""
    if a is None or b is None:
        return 0.0 if a is None and b is None else math.inf
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        return math.inf
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    if (nan_x != nan_y).any():
        return math.inf
    diff = np.abs(x[~nan_x] - y[~nan_y])
    return float(diff.max()) if diff.size else 0.0


@dataclass
class Reference:
    trials: pd.DataFrame
    history: pd.DataFrame
    artifacts: dict[str, dict[str, dict[str, torch.Tensor]]]
    seconds: float


def load_reference(store: Path, seconds: float) -> Reference:
    return Reference(read_trials(store, study=STUDY), read_history(store, study=STUDY), _artifact_tensors(store),
                     seconds)


def check_final(store: Path, ref: Reference, num_seeds: int) -> tuple[list[str], float]:
    """A completed store against the reference; returns the problems and the max |Δ| over the metrics."""
    problems: list[str] = []
    trials = read_trials(store, study=STUDY)
    history = read_history(store, study=STUDY)
    counts = Counter(trials["trial_id"])
    if twice := sorted(t for t, n in counts.items() if n > 1):
        problems.append(f"trials stored more than once: {twice}")
    expected = set(ref.trials["trial_id"])
    if set(counts) != expected:
        problems.append(f"trial ids differ from the reference: missing {sorted(expected - set(counts))}, "
                        f"extra {sorted(set(counts) - expected)}")
    if not_ok := sorted(trials.loc[trials["status"] != "ok", "trial_id"]):
        problems.append(f"trials not ok: {not_ok}")
    rows, ref_rows = history.groupby("trial_id").size(), ref.history.groupby("trial_id").size()
    if not rows.sort_index().equals(ref_rows.sort_index()):
        problems.append(f"history rows per trial differ: {rows.to_dict()} vs the reference's {ref_rows.to_dict()}")

    max_delta, differing = 0.0, set()
    got = trials.drop_duplicates("trial_id").set_index("trial_id")
    want = ref.trials.set_index("trial_id")
    columns = [c for c in want.columns if c.startswith(("val_", "test_"))]
    for tid in sorted(expected & set(got.index)):
        for col in columns:
            delta = _max_diff(got.at[tid, col], want.at[tid, col])
            if delta != 0.0:
                differing.add(col)
                max_delta = max(max_delta, delta)
    key = ["trial_id", "stage", "epoch"]
    merged = history.merge(ref.history, on=key, suffixes=("", "_ref"))
    for col in HISTORY_METRICS:
        delta = _max_diff(merged[col].to_numpy(), merged[f"{col}_ref"].to_numpy())
        if delta != 0.0:
            differing.add(f"history.{col}")
            max_delta = max(max_delta, delta)
    if differing:
        problems.append(f"metrics differ from the uninterrupted run (max |Δ| {max_delta:.3g}) in {sorted(differing)}")

    artifacts = _artifact_tensors(store)
    if len(artifacts) != num_seeds or set(artifacts) != set(ref.artifacts):
        problems.append(f"Stage-I artifacts {sorted(artifacts)} ≠ the reference's {sorted(ref.artifacts)} "
                        f"(expected one per seed: {num_seeds})")
    for sid in sorted(set(artifacts) & set(ref.artifacts)):
        for name, tensors in artifacts[sid].items():
            reference = ref.artifacts[sid][name]
            if tensors.keys() != reference.keys() or any(not torch.equal(tensors[k], reference[k]) for k in tensors):
                problems.append(f"Stage-I artifact {sid}/{name} differs from the reference's")
    return problems, max_delta
