"""Prototype of table formats for the result store, measured on the same synthetic trial rows.

    python benchmarks/store_formats.py                       # N = 1000, all formats, ~10 min on 2 cores
    python benchmarks/store_formats.py --trials 5000 --formats baseline,delta

Self-contained (it does not import calib): it builds realistic rows itself, one trial row of 152 columns
(15 identity strings incl. ``trial_id`` = 16 hex digits and ``study``, 20 int64 config columns, 40 float64
hyper-parameters mostly constant and partly null, 58 float64 metrics random in [0, 1], 10 ``list<double>``
columns of 15 reliability bins, 5 bools, 2 timestamps, a ~1.5 KB ``config_json``) and 100 history rows of
18 columns per trial, and stores them, one trial per commit (history, then the trial row), as a Ray worker
would, in:

  baseline       plain Parquet, one file per trial per table under ``<root>/<table>/study=<study>/``,
                 written to a hidden temporary name, fsynced, renamed (what calib does today); then compacted
                 into one ``part-<uuid>.parquet`` per hive folder, the small files deleted.
  delta          Delta Lake through ``deltalake`` (delta-rs): ``write_deltalake(uri, mode="append")`` per
                 commit, partitioned by study; ``optimize.compact()``, then ``vacuum``.
  iceberg        Apache Iceberg through ``pyiceberg`` with a ``SqlCatalog`` on sqlite and a local warehouse,
                 partitioned by identity(study). pyiceberg has no compaction: emulated by ``overwrite`` of the
                 whole table with its own scan, ``expire_snapshots``, and a hand-written orphan-file delete.
  ducklake       DuckLake (DuckDB extension) with a sqlite catalog and a local data path, partitioned by
                 study; both tables in one transaction per trial. The extension is loaded from DuckDB's
                 extension repository if reachable, else from a PyPI package that ships the binary
                 (``duckdb-extension-ducklake`` / ``duckdb-extension-sqlite``, matching the installed duckdb
                 version). Default settings (rows of an insert under 10 rows are inlined in the catalog DB).
  delta-s3       Delta Lake on S3 emulated by moto (``ThreadedMotoServer``), no locking provider; a short
                 append run and the concurrency test only.

Measured per format: appends (trials committed per second; seconds of the first and last 100 trials), files
and bytes on disk (data files vs log/metadata/catalog), read of the trials table through the format's own
reader to pandas, and through ``pd.read_parquet(<data dir>)`` and DuckDB
``read_parquet('<data dir>/**/*.parquet', hive_partitioning=true)`` directly (rows vs distinct trial ids:
does a plain reader double count?), after the appends, after compaction and after cleanup (vacuum).
Concurrency: P processes (multiprocessing, spawn) append K trials each to one fresh table at once;
failed commits and the rows that land are counted ("logged retries": pyiceberg's commit-retry warnings;
delta-rs retries inside Rust, not visible). DuckLake is also run with ``META_BUSY_TIMEOUT 5000`` (sqlite
busy timeout, "ducklake-busy5s") and with the caller retrying a commit that failed with "database is
locked" up to 20 times ("ducklake-appretry").

Needs, besides calib's own dependencies: ``pip install deltalake "pyiceberg[sql-sqlite,pyarrow]" duckdb moto
boto3``; offline, DuckLake also needs ``duckdb==X`` with ``duckdb-extension-ducklake==X`` and
``duckdb-extension-sqlite==X`` (the measured run used X = 1.5.5: no such binary exists for duckdb 2.0).
Each format's appends stop after ``--append-budget`` seconds (the row says so). Other processes on the
machine skew all timings: the load average is printed at start and end.

A format whose package cannot be imported, or a step that raises, is printed as a row with the reason;
the script does not stop. Everything is written under a temporary directory (``--workdir``), removed at
the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib
import importlib.metadata as md
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import socket
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

FORMATS = ["baseline", "delta", "iceberg", "ducklake", "delta-s3"]
STUDIES = ["sens_gamma", "grid_base"]
N_BINS = 15
HISTORY_EPOCHS = 100


def log(*args: Any) -> None:
    print(time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


def short(exc: BaseException, n: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return re.sub(r"\s+", " ", text)[:n]


# ----------------------------------------------------------------------------------------------- rows

STRING_COLS = ["trial_id", "study", "method", "dataset", "arch", "loss", "status", "node_id", "stage1_id",
               "source_kind", "source_path", "source_sha256", "git_head", "plugins", "dataset_options"]
INT_COLS = [f"cfg_int_{k:02d}" for k in range(20)]          # epochs, batch sizes, ... (constant)
HP_COLS = [f"hp_{k:02d}" for k in range(40)]                # hyper-parameters: constant, some null, 2 vary
METRIC_COLS = ([f"val_m_{k:02d}" for k in range(15)] + [f"test_m_{k:02d}" for k in range(15)]
               + [f"posthoc_m_{k:02d}" for k in range(28)])  # vary per trial
LIST_COLS = [f"reliability_{k}" for k in range(10)]          # 15 bins each, vary
BOOL_COLS = [f"flag_{k}" for k in range(5)]
TS_COLS = ["started_at", "finished_at"]


def trial_schema() -> pa.Schema:
    fields = [(c, pa.string()) for c in STRING_COLS] + [("seed", pa.int64())] + [(c, pa.int64()) for c in INT_COLS]
    fields += [(c, pa.float64()) for c in HP_COLS] + [(c, pa.float64()) for c in METRIC_COLS]
    fields += [(c, pa.list_(pa.float64())) for c in LIST_COLS] + [(c, pa.bool_()) for c in BOOL_COLS]
    fields += [(c, pa.timestamp("ms", tz="UTC")) for c in TS_COLS] + [("config_json", pa.string())]
    return pa.schema(fields)


HIST_FLOATS = ["lr", "train_loss", "train_accuracy", "train_confidence", "val_accuracy", "val_ece", "val_loss",
               "update_accuracy", "update_confidence", "accuracy_weight", "retention_prob", "clip_threshold"]


def history_schema() -> pa.Schema:
    return pa.schema([("trial_id", pa.string()), ("study", pa.string()), ("method", pa.string()),
                      ("seed", pa.int64()), ("stage", pa.string()), ("epoch", pa.int64())]
                     + [(c, pa.float64()) for c in HIST_FLOATS])


TRIAL_SCHEMA = trial_schema()
HISTORY_SCHEMA = history_schema()
METHODS = ["vanilla", "focal", "mac_cal", "label_smoothing", "mixup"]
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def trial_id_of(index: int, salt: str) -> str:
    return hashlib.blake2b(f"{salt}:{index}".encode(), digest_size=8).hexdigest()


def config_json(seed: int, lr: float, gamma: float, method: str) -> str:
    cfg = {
        "method": {"name": method, "gamma": gamma, "accuracy_source": "train", "stats_source": "epoch",
                   "retention": {"init": 1.0, "min": 0.05, "max": 1.0, "momentum": 0.9},
                   "clip": {"init": 5.0, "decay": 0.97, "floor": 0.5}},
        "seed": seed,
        "dataset": {"name": "cifar100", "root": "/data/cifar100", "val_fraction": 0.1, "augment": True,
                    "normalize": {"mean": [0.5071, 0.4865, 0.4409], "std": [0.2673, 0.2564, 0.2762]},
                    "options": {"crop": 32, "padding": 4, "flip": True}},
        "model": {"arch": "resnet18", "width": 64, "dropout": 0.0, "norm": "batch", "init": "kaiming"},
        "stage1": {"epochs": 200, "batch_size": 128, "lr": lr, "momentum": 0.9, "weight_decay": 5e-4,
                   "milestones": [60, 120, 160], "lr_decay": 0.2, "grad_clip": None, "amp": True,
                   "scheduler_step": "epoch", "data_pipeline": "gpu", "compile": False, "channels_last": True},
        "stage2": {"epochs": 100, "batch_size": 256, "lr": 0.01, "optimizer": "sgd", "temperature_init": 1.5,
                   "val_every": 1, "early_stop": {"metric": "val_ece", "patience": 20, "min_delta": 1e-4}},
        "loss": {"name": "cross_entropy", "smoothing": 0.0, "penalty_weight": 0.0, "margin": 10.0,
                 "pos_weight": 1.0, "neg_weight": 1.0, "modulation_strength": 0.0, "norm_momentum": 0.99},
        "metrics": {"ece_bins": 15, "adaptive_bins": 15, "classwise": True, "kde_bandwidth": 0.05,
                    "bootstrap": {"samples": 200, "confidence": 0.95}},
        "posthoc": ["temperature", "vector", "dirichlet", "histogram_binning", "isotonic", "spline"],
        "runtime": {"device": "cuda", "workers": 8, "pin_memory": True, "deterministic": True,
                    "cache_stage1": True, "ray": {"num_gpus": 0.25, "num_cpus": 2, "max_retries": 2}},
    }
    return json.dumps(cfg, sort_keys=True)


def make_trial(index: int, salt: str = "bench") -> tuple[pa.Table, pa.Table]:
    """The trial row and its history (deterministic from ``index`` and ``salt``)."""
    tid = trial_id_of(index, salt)
    rng = np.random.default_rng(int(tid, 16) % (2**32))
    study = STUDIES[index % len(STUDIES)]
    method = METHODS[index % len(METHODS)]
    seed = index % 10
    lr = [0.05, 0.1, 0.2][index % 3]
    gamma = [0.5, 0.9, 1.0, 2.0][(index // 3) % 4]
    cols: dict[str, Any] = {
        "trial_id": [tid], "study": [study], "method": [method], "dataset": ["cifar100"], "arch": ["resnet18"],
        "loss": ["cross_entropy"], "status": ["ok"], "node_id": [f"node-{index % 4}"],
        "stage1_id": [hashlib.blake2b(f"s1:{seed}".encode(), digest_size=8).hexdigest()],
        "source_kind": ["git"], "source_path": ["/home/user/calib"], "source_sha256": ["9f" * 32],
        "git_head": ["3b1e0c4"], "plugins": ["[]"], "dataset_options": ['{"crop": 32}'], "seed": [seed],
    }
    for k, c in enumerate(INT_COLS):
        cols[c] = [[200, 128, 100, 256, 15, 15, 8, 1][k % 8]]
    for k, c in enumerate(HP_COLS):
        if k == 0:
            v = lr
        elif k == 1:
            v = gamma
        elif k >= 30:                     # method-specific hyper-parameters: null for most methods
            v = None if method != "mac_cal" else 0.1 * k
        else:
            v = [0.9, 5e-4, 0.2, 0.0, 1.0, 0.99, 10.0][k % 7]
        cols[c] = [v]
    for c in METRIC_COLS:
        cols[c] = [float(rng.random())]
    for c in LIST_COLS:
        cols[c] = [rng.random(N_BINS).tolist()]
    for k, c in enumerate(BOOL_COLS):
        cols[c] = [bool((index + k) % 2)]
    start = T0 + timedelta(seconds=37 * index)
    cols["started_at"] = [start]
    cols["finished_at"] = [start + timedelta(seconds=int(rng.integers(600, 3600)))]
    cols["config_json"] = [config_json(seed, lr, gamma, method)]
    trial = pa.Table.from_pydict(cols, schema=TRIAL_SCHEMA)

    n = HISTORY_EPOCHS
    hist = {"trial_id": [tid] * n, "study": [study] * n, "method": [method] * n, "seed": [seed] * n,
            "stage": ["stage1"] * 60 + ["stage2"] * (n - 60), "epoch": list(range(60)) + list(range(n - 60))}
    for c in HIST_FLOATS:
        hist[c] = rng.random(n)
    return trial, pa.Table.from_pydict(hist, schema=HISTORY_SCHEMA)


# ----------------------------------------------------------------------------------------- measuring

def disk_usage(root: str, is_data: Callable[[str], bool]) -> dict[str, float]:
    out = {"data_files": 0, "data_mb": 0.0, "meta_files": 0, "meta_mb": 0.0}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                size = os.path.getsize(p)
            except OSError:
                continue
            kind = "data" if is_data(p) else "meta"
            out[f"{kind}_files"] += 1
            out[f"{kind}_mb"] += size / 2**20
    return out


def plain_reads(data_dir: str) -> dict[str, Any]:
    """``pd.read_parquet`` and DuckDB's glob read straight on the folder: time, rows, distinct trial ids."""
    out: dict[str, Any] = {}
    def rows(df: pd.DataFrame) -> str:
        if "trial_id" not in df.columns:
            return f"{len(df)} (no file)"
        return f"{len(df)}/{df['trial_id'].nunique()}"

    t = time.perf_counter()
    try:
        df = pd.read_parquet(data_dir)
        out["pd_s"] = time.perf_counter() - t
        out["pd_rows"] = rows(df)
    except Exception as exc:
        out["pd_rows"] = "ERR"
        out["pd_err"] = short(exc, 200)
        try:   # the partition column is also inside the files: read without the hive folder names
            t = time.perf_counter()
            df = pd.read_parquet(data_dir, partitioning=None)
            out["pd_s"] = time.perf_counter() - t
            out["pd_rows"] = f"ERR; partitioning=None: {rows(df)}"
        except Exception as exc2:
            out["pd_err"] += f"; with partitioning=None: {short(exc2, 120)}"
    try:
        import duckdb
        con = duckdb.connect()
        t = time.perf_counter()
        n, u = con.execute(f"SELECT count(*), count(DISTINCT trial_id) FROM read_parquet("
                           f"'{data_dir}/**/*.parquet', hive_partitioning=true)").fetchone()
        out["duck_s"] = time.perf_counter() - t
        out["duck_rows"] = f"{n}/{u}"
        con.close()
    except Exception as exc:
        out["duck_rows"] = "ERR"
        out["duck_err"] = short(exc, 260)
    return out


def history_plain(hist_dir: str) -> str:
    """``pd.read_parquet(<history data dir>)``: rows/distinct trial ids (``partitioning=None`` if needed)."""
    for kw, tag in (({}, ""), ({"partitioning": None}, "p=None: ")):
        try:
            df = pd.read_parquet(hist_dir, columns=["trial_id", "epoch"], **kw)
            return f"{tag}{len(df)}/{df['trial_id'].nunique()}"
        except Exception as exc:
            err = short(exc, 40)
    return "ERR " + err


# ------------------------------------------------------------------------------------------ backends

class Backend:
    name = "?"
    is_remote = False

    def __init__(self, root: str) -> None:
        self.root = root

    # all of these may raise; the driver turns an exception into a row
    def create(self) -> None: ...
    def open(self) -> None: ...                      # in a worker process, on an existing table
    def append(self, trial: pa.Table, history: pa.Table) -> None: raise NotImplementedError
    def read(self) -> pd.DataFrame: raise NotImplementedError
    def count(self) -> tuple[int, int, int]:          # trial rows, distinct trial ids, history rows
        df = self.read()
        return len(df), df["trial_id"].nunique(), self.history_rows()
    def history_rows(self) -> int: raise NotImplementedError
    def compact(self) -> str: return "n/a"
    def cleanup(self) -> str: return "n/a"
    def data_dir(self) -> str: raise NotImplementedError
    def history_dir(self) -> str: return self.data_dir().rsplit("trials", 1)[0] + "history"
    def is_data(self, path: str) -> bool: return path.endswith(".parquet")
    def close(self) -> None: ...


class Baseline(Backend):
    name = "baseline"
    HEX = re.compile(r"^[0-9a-f]{16}\.parquet$")

    def _write(self, table: pa.Table, kind: str) -> None:
        study = table.column("study")[0].as_py()
        folder = os.path.join(self.root, kind, f"study={study}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{table.column('trial_id')[0].as_py()}.parquet")
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as fh:
            pq.write_table(table.drop_columns(["study"]), fh)   # study lives in the hive folder name
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def append(self, trial: pa.Table, history: pa.Table) -> None:
        self._write(history, "history")
        self._write(trial, "trials")

    def data_dir(self) -> str:
        return os.path.join(self.root, "trials")

    def read(self) -> pd.DataFrame:
        return pd.read_parquet(self.data_dir())

    def history_rows(self) -> int:
        return pads.dataset(os.path.join(self.root, "history"), partitioning="hive").count_rows()

    def compact(self) -> str:
        merged = 0
        for kind in ("trials", "history"):
            for folder in sorted(glob.glob(os.path.join(self.root, kind, "study=*"))):
                small = sorted(f for f in os.listdir(folder) if self.HEX.match(f))
                if not small:
                    continue
                parts = [f for f in os.listdir(folder) if f.startswith("part-") and f.endswith(".parquet")]
                table = pads.dataset([os.path.join(folder, f) for f in parts + small], format="parquet").to_table()
                if kind == "trials":   # dedupe by trial_id (a small file may repeat a compacted trial)
                    ids = table.column("trial_id").to_numpy(zero_copy_only=False)
                    _, first = np.unique(ids[::-1], return_index=True)
                    table = table.take(np.sort(len(ids) - 1 - first))
                out = os.path.join(folder, f"part-{uuid.uuid4().hex}.parquet")
                tmp = os.path.join(folder, f".{os.path.basename(out)}.tmp")
                pq.write_table(table, tmp)
                os.replace(tmp, out)
                for f in parts + small:
                    os.unlink(os.path.join(folder, f))
                merged += len(small)
        return f"merged {merged} small files (own code)"


class Delta(Backend):
    name = "delta"

    def __init__(self, root: str, storage_options: dict[str, str] | None = None) -> None:
        super().__init__(root)
        import deltalake  # noqa: F401
        self.so = storage_options
        self.uri = {k: f"{root.rstrip('/')}/{k}" for k in ("trials", "history")}

    def create(self) -> None:
        from deltalake import DeltaTable
        DeltaTable.create(self.uri["trials"], schema=TRIAL_SCHEMA, partition_by=["study"], storage_options=self.so)
        DeltaTable.create(self.uri["history"], schema=HISTORY_SCHEMA, partition_by=["study"], storage_options=self.so)

    def append(self, trial: pa.Table, history: pa.Table) -> None:
        from deltalake import write_deltalake
        write_deltalake(self.uri["history"], history, mode="append", storage_options=self.so)
        write_deltalake(self.uri["trials"], trial, mode="append", storage_options=self.so)

    def _dt(self, kind: str):
        from deltalake import DeltaTable
        return DeltaTable(self.uri[kind], storage_options=self.so)

    def read(self) -> pd.DataFrame:
        return self._dt("trials").to_pandas()

    def history_rows(self) -> int:
        return self._dt("history").to_pyarrow_dataset().count_rows()

    def data_dir(self) -> str:
        return self.uri["trials"]

    def is_data(self, path: str) -> bool:
        return path.endswith(".parquet") and "/_delta_log/" not in path

    def compact(self) -> str:
        notes = []
        for kind in ("trials", "history"):
            m = self._dt(kind).optimize.compact()
            notes.append(f"{kind}: -{m.get('numFilesRemoved')} +{m.get('numFilesAdded')}")
        return "optimize.compact(): " + ", ".join(notes)

    def cleanup(self) -> str:
        notes = []
        try:   # the default: retention 168 h is enforced; a shorter retention is refused
            self._dt("trials").vacuum(retention_hours=0, dry_run=True)
            notes.append("vacuum(retention_hours=0) accepted without enforce flag?!")
        except Exception as exc:
            notes.append(f"vacuum(retention_hours=0) -> {short(exc, 200)}")
        for kind in ("trials", "history"):
            dt = self._dt(kind)
            dry = len(dt.vacuum(dry_run=True))      # default retention (7 days): nothing is old enough yet
            gone = dt.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
            notes.append(f"{kind}: default-retention vacuum would delete {dry}; "
                         f"vacuum(0, enforce_retention_duration=False) deleted {len(gone)}")
        return "; ".join(notes)


class Iceberg(Backend):
    name = "iceberg"

    def __init__(self, root: str) -> None:
        super().__init__(root)
        import pyiceberg  # noqa: F401
        self.catalog = None

    def _catalog(self):
        if self.catalog is None:
            from pyiceberg.catalog.sql import SqlCatalog
            os.makedirs(self.root, exist_ok=True)
            self.catalog = SqlCatalog("bench", uri=f"sqlite:///{self.root}/catalog.db",
                                      warehouse=f"file://{self.root}/warehouse")
        return self.catalog

    def create(self) -> None:
        cat = self._catalog()
        cat.create_namespace("calib")
        for kind, schema in (("trials", TRIAL_SCHEMA), ("history", HISTORY_SCHEMA)):
            tbl = cat.create_table(f"calib.{kind}", schema=schema)
            with tbl.update_spec() as spec:
                spec.add_identity("study")

    def _tbl(self, kind: str):
        return self._catalog().load_table(f"calib.{kind}")

    def append(self, trial: pa.Table, history: pa.Table) -> None:
        self._tbl("history").append(history)   # load_table each commit: a worker sees the latest metadata
        self._tbl("trials").append(trial)

    def read(self) -> pd.DataFrame:
        return self._tbl("trials").scan().to_pandas()

    def history_rows(self) -> int:
        return self._tbl("history").scan().to_arrow().num_rows

    def data_dir(self) -> str:
        return self._tbl("trials").location().removeprefix("file://") + "/data"

    def history_dir(self) -> str:
        return self._tbl("history").location().removeprefix("file://") + "/data"

    def metadata_note(self) -> str:
        tbl = self._tbl("trials")
        path = tbl.metadata_location.removeprefix("file://")
        return (f"current trials metadata.json {os.path.getsize(path) / 2**10:.0f} KiB "
                f"({len(tbl.metadata.snapshots)} snapshots; rewritten on every commit)")

    def is_data(self, path: str) -> bool:
        return path.endswith(".parquet") and "/data/" in path

    def compact(self) -> str:
        notes = []
        for kind in ("trials", "history"):
            tbl = self._tbl(kind)
            before = len(tbl.inspect.files())
            tbl.overwrite(tbl.scan().to_arrow())     # not a compaction API: a full rewrite, one commit
            tbl = self._tbl(kind)
            notes.append(f"{kind}: {before}->{len(tbl.inspect.files())} files")
        return "no compaction in pyiceberg; emulated by overwrite(scan()): " + ", ".join(notes)

    def cleanup(self) -> str:
        notes = []
        for kind in ("trials", "history"):
            tbl = self._tbl(kind)
            n_snap = len(tbl.metadata.snapshots)
            tbl.maintenance.expire_snapshots().older_than(datetime.now(timezone.utc)).commit()
            tbl = self._tbl(kind)
            data_dir = tbl.location().removeprefix("file://") + "/data"
            on_disk_before = len(glob.glob(f"{data_dir}/**/*.parquet", recursive=True))
            live = {p.removeprefix("file://") for p in tbl.inspect.files().column("file_path").to_pylist()}
            deleted = 0
            for p in glob.glob(f"{data_dir}/**/*.parquet", recursive=True):   # hand-written orphan delete
                if p not in live:
                    os.unlink(p)
                    deleted += 1
            notes.append(f"{kind}: expire_snapshots {n_snap}->{len(tbl.metadata.snapshots)} snapshots, "
                         f"{on_disk_before} data files still on disk after it; manual orphan delete removed {deleted}")
        return "; ".join(notes)

    def close(self) -> None:
        if self.catalog is not None:
            self.catalog.engine.dispose()


def load_duckdb_extension(con, name: str, package: str) -> str:
    """LOAD ``name``: from DuckDB's repository if reachable, else from the PyPI package shipping the binary."""
    import duckdb
    try:
        con.execute(f"LOAD {name}")
        return "already installed"
    except Exception:
        pass
    try:
        con.execute(f"INSTALL {name}")
        con.execute(f"LOAD {name}")
        return "INSTALL from extensions.duckdb.org"
    except Exception as exc:
        first = short(exc, 140)
    try:
        mod = importlib.import_module(package.replace("-", "_"))
    except ImportError:
        raise RuntimeError(f"INSTALL {name} failed ({first}); PyPI package {package} not installed") from None
    paths = glob.glob(os.path.join(os.path.dirname(mod.__file__), "extensions", f"v{duckdb.__version__}",
                                   "*.duckdb_extension"))
    if not paths:
        raise RuntimeError(f"INSTALL {name} failed ({first}); {package} has no binary for duckdb "
                           f"v{duckdb.__version__}")
    con.execute(f"INSTALL '{paths[0]}'")
    con.execute(f"LOAD {name}")
    return f"INSTALL {name} failed offline; loaded the binary from PyPI package {package}"


class DuckLake(Backend):
    name = "ducklake"

    def __init__(self, root: str, busy_timeout_ms: int | None = None) -> None:
        super().__init__(root)
        import duckdb
        self.con = duckdb.connect()
        self.how = load_duckdb_extension(self.con, "ducklake", "duckdb-extension-ducklake")
        load_duckdb_extension(self.con, "sqlite", "duckdb-extension-sqlite")
        os.makedirs(root, exist_ok=True)
        extra = f", META_BUSY_TIMEOUT {busy_timeout_ms}" if busy_timeout_ms else ""   # sqlite busy_timeout
        self.con.execute(f"ATTACH 'ducklake:sqlite:{root}/catalog.sqlite' AS lk (DATA_PATH '{root}/data/'{extra})")

    def create(self) -> None:
        trial, history = make_trial(0, "schema")
        for kind, tbl in (("trials", trial), ("history", history)):
            self.con.register("src", tbl)
            self.con.execute(f"CREATE TABLE lk.{kind} AS SELECT * FROM src LIMIT 0")
            self.con.execute(f"ALTER TABLE lk.{kind} SET PARTITIONED BY (study)")
            self.con.unregister("src")

    app_retries = 0
    retried = 0

    def append(self, trial: pa.Table, history: pa.Table) -> None:
        for attempt in range(self.app_retries + 1):
            try:
                return self._append(trial, history)
            except Exception as exc:
                if attempt == self.app_retries or "database is locked" not in str(exc):
                    raise
                self.retried += 1
                time.sleep(random.uniform(0.02, 0.2) * (attempt + 1))

    def _append(self, trial: pa.Table, history: pa.Table) -> None:
        self.con.register("h", history)
        self.con.register("t", trial)
        self.con.execute("BEGIN")
        try:
            self.con.execute("INSERT INTO lk.history SELECT * FROM h")
            self.con.execute("INSERT INTO lk.trials SELECT * FROM t")
            self.con.execute("COMMIT")
        except Exception:
            try:
                self.con.execute("ROLLBACK")
            except Exception:
                pass
            raise
        finally:
            self.con.unregister("h")
            self.con.unregister("t")

    def read(self) -> pd.DataFrame:
        return self.con.execute("FROM lk.trials").to_arrow_table().to_pandas()

    def history_rows(self) -> int:
        return self.con.execute("SELECT count(*) FROM lk.history").fetchone()[0]

    def data_dir(self) -> str:
        return os.path.join(self.root, "data", "main", "trials")

    def compact(self) -> str:
        self.con.execute("CALL ducklake_flush_inlined_data('lk')")
        self.con.execute("CALL ducklake_merge_adjacent_files('lk')")
        return "ducklake_flush_inlined_data + ducklake_merge_adjacent_files"

    def cleanup(self) -> str:
        self.con.execute("CALL ducklake_expire_snapshots('lk', older_than => now())")
        n = len(self.con.execute("CALL ducklake_cleanup_old_files('lk', cleanup_all => true)").fetchall())
        return f"ducklake_expire_snapshots(older_than => now()) + ducklake_cleanup_old_files(cleanup_all) -> {n} files"

    def close(self) -> None:
        self.con.close()


# ------------------------------------------------------------------------------------- S3 via moto

class Moto:
    def __init__(self) -> None:
        import logging

        import boto3
        from moto.server import ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.ERROR)   # one line per request otherwise
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = "calib-bench"
        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=self.bucket)

    def storage_options(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}

    def objects(self, prefix: str) -> tuple[int, int, float]:
        import boto3
        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        data = meta = 0
        size = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                size += o["Size"]
                if "/_delta_log/" in o["Key"]:
                    meta += 1
                else:
                    data += 1
        return data, meta, size / 2**20

    def stop(self) -> None:
        self.server.stop()


def make_backend(fmt: str, root: str, s3: dict[str, str] | None = None) -> Backend:
    if fmt == "baseline":
        return Baseline(root)
    if fmt in ("delta", "delta-s3"):
        b = Delta(root, s3)
        b.name = fmt
        b.is_remote = fmt == "delta-s3"
        return b
    if fmt == "iceberg":
        return Iceberg(root)
    if fmt == "ducklake":
        return DuckLake(root)
    if fmt == "ducklake-busy5s":     # concurrency variant: sqlite waits up to 5 s for the catalog lock
        b = DuckLake(root, busy_timeout_ms=5000)
        b.name = fmt
        return b
    if fmt == "ducklake-appretry":   # concurrency variant: the caller retries a failed commit
        b = DuckLake(root)
        b.name = fmt
        b.app_retries = 20
        return b
    raise ValueError(fmt)


# ------------------------------------------------------------------------------------- the phases

def run_appends(b: Backend, n: int, budget_s: float, salt: str = "bench") -> dict[str, Any]:
    times = []
    start = time.perf_counter()
    stopped = ""
    for i in range(n):
        trial, history = make_trial(i, salt)
        t = time.perf_counter()
        b.append(trial, history)
        times.append(time.perf_counter() - t)
        if (i + 1) % max(1, n // 10) == 0:
            log(f"  {b.name}: {i + 1}/{n} trials, last commit {times[-1] * 1000:.1f} ms")
        if time.perf_counter() - start > budget_s and i + 1 < n:
            stopped = f"stopped after {i + 1} of {n} trials (append budget {budget_s:.0f} s)"
            break
    k = min(100, len(times))
    return {"trials": len(times), "commit_s": sum(times), "per_s": len(times) / sum(times),
            "first100_s": sum(times[:k]), "last100_s": sum(times[-k:]),
            "p50_ms": 1000 * float(np.median(times)), "max_ms": 1000 * max(times), "note": stopped}


def measure_state(b: Backend, label: str, moto: Moto | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"format": b.name, "state": label}
    if moto is not None:
        data, meta, mb = moto.objects(b.root.split(f"{moto.bucket}/", 1)[1])
        row.update(files=f"{data}+{meta}", mb=f"{mb:.1f}")
    else:
        du = disk_usage(b.root, b.is_data)
        row.update(files=f"{du['data_files']}+{du['meta_files']}", mb=f"{du['data_mb']:.1f}+{du['meta_mb']:.1f}")
    t = time.perf_counter()
    try:
        df = b.read()
        row["fmt_read_s"] = time.perf_counter() - t
        row["fmt_rows"] = f"{len(df)}/{df['trial_id'].nunique()}"
    except Exception as exc:
        row["fmt_rows"] = "ERR"
        row["err"] = short(exc, 110)
    if moto is None:
        row.update(plain_reads(b.data_dir()))
        row["hist_pd"] = history_plain(b.history_dir())
    return row


def run_format(fmt: str, n: int, workdir: str, budget_s: float,
               moto: Moto | None) -> tuple[dict, list[dict], list[str]]:
    root = os.path.join(workdir, fmt)
    notes: list[str] = []
    s3 = None
    if fmt == "delta-s3":
        root = f"s3://{moto.bucket}/single"
        s3 = moto.storage_options()
    b = make_backend(fmt, root, s3)
    if isinstance(b, DuckLake):
        notes.append(f"ducklake: {b.how}")
    b.create()
    log(f"{fmt}: appending {n} trials")
    app = run_appends(b, n, budget_s)
    app["format"] = fmt
    states = [measure_state(b, "after appends", moto if b.is_remote else None)]
    if isinstance(b, Iceberg):
        notes.append(f"iceberg after appends: {b.metadata_note()}")
    if fmt != "delta-s3":
        t = time.perf_counter()
        try:
            note = b.compact()
            states.append({**measure_state(b, "after compaction"), "op_s": time.perf_counter() - t})
            notes.append(f"{fmt} compaction ({time.perf_counter() - t:.1f} s): {note}")
        except Exception as exc:
            states.append({"format": fmt, "state": "compaction", "err": short(exc)})
        t = time.perf_counter()
        try:
            note = b.cleanup()
            if note != "n/a":
                states.append({**measure_state(b, "after cleanup"), "op_s": time.perf_counter() - t})
                notes.append(f"{fmt} cleanup ({time.perf_counter() - t:.1f} s): {note}")
        except Exception as exc:
            states.append({"format": fmt, "state": "cleanup", "err": short(exc)})
    for s in states:
        if s.get("pd_err"):
            notes.append(f"{fmt} {s['state']}: pd.read_parquet(data dir) -> {s['pd_err']}")
        if s.get("duck_err"):
            notes.append(f"{fmt} {s['state']}: duckdb read_parquet glob -> {s['duck_err']}")
    b.close()
    return app, states, notes


# ------------------------------------------------------------------------------------- concurrency

def _worker(fmt: str, root: str, s3: dict[str, str] | None, wid: int, k: int, ready, go, queue) -> None:
    import logging

    retries = [0]

    class CountRetries(logging.Handler):   # pyiceberg logs one warning per commit retry
        def emit(self, record: logging.LogRecord) -> None:
            if "retrying" in record.getMessage():
                retries[0] += 1

    logging.getLogger().addHandler(CountRetries(logging.WARNING))
    ok = 0
    errors: list[str] = []
    try:
        b = make_backend(fmt, root, s3)
        b.open()
    except Exception as exc:
        ready.put(wid)
        queue.put((wid, 0, [f"open: {short(exc)}"], 0.0, 0))
        return
    ready.put(wid)
    go.wait()
    t = time.perf_counter()
    for i in range(k):
        trial, history = make_trial(wid * 100_000 + i, "conc")
        try:
            b.append(trial, history)
            ok += 1
        except Exception as exc:
            errors.append(short(exc, 300))
    wall = time.perf_counter() - t
    b.close()
    queue.put((wid, ok, errors, wall, retries[0] + getattr(b, "retried", 0)))


def run_concurrency(fmt: str, procs: int, k: int, workdir: str, moto: Moto | None) -> dict[str, Any]:
    root = os.path.join(workdir, f"{fmt}-conc{procs}")
    s3 = None
    if fmt == "delta-s3":
        root = f"s3://{moto.bucket}/conc{procs}"
        s3 = moto.storage_options()
    b = make_backend(fmt, root, s3)
    b.create()
    b.close()
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    ready = ctx.Queue()
    queue = ctx.Queue()
    ps = [ctx.Process(target=_worker, args=(fmt, root, s3, w, k, ready, go, queue)) for w in range(procs)]
    for p in ps:
        p.start()
    for _ in ps:                      # every worker has imported its package and opened the table
        ready.get(timeout=300)
    t = time.perf_counter()
    go.set()
    results = [queue.get(timeout=900) for _ in ps]
    wall = time.perf_counter() - t
    for p in ps:
        p.join(timeout=60)
    ok = sum(r[1] for r in results)
    errors = [e for r in results for e in r[2]]
    row = {"format": fmt, "procs": procs, "attempted": procs * k, "ok": ok, "failed": len(errors),
           "retries": sum(r[4] for r in results) if fmt in ("iceberg", "ducklake-appretry") else "n/v",
           "wall_s": wall, "per_s": ok / wall if wall else 0.0}
    try:
        b = make_backend(fmt, root, s3)
        n, u, h = b.count()
        row["landed"] = f"{n}/{u}"
        row["history"] = h
        b.close()
    except Exception as exc:
        row["landed"] = "ERR " + short(exc, 80)
    kinds: dict[str, int] = {}
    for e in errors:
        key = e[:300]
        kinds[key] = kinds.get(key, 0) + 1
    row["errors"] = kinds
    return row


# ----------------------------------------------------------------------------------------- printing

def fmt_cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if v < 100 else f"{v:.0f}"
    return str(v)


def print_table(title: str, rows: list[dict], cols: list[tuple[str, str]]) -> None:
    print(f"\n## {title}")
    cells = [[h for _, h in cols]] + [[fmt_cell(r.get(k)) for k, _ in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    for j, c in enumerate(cells):
        print("| " + " | ".join(x.ljust(w) for x, w in zip(c, widths, strict=True)) + " |")
        if j == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def versions() -> str:
    out = [f"python {sys.version.split()[0]}"]
    for p in ("pyarrow", "pandas", "deltalake", "pyiceberg", "SQLAlchemy", "duckdb", "duckdb-extension-ducklake",
              "duckdb-extension-sqlite", "moto", "boto3"):
        try:
            out.append(f"{p} {md.version(p)}")
        except md.PackageNotFoundError:
            out.append(f"{p} (not installed)")
    return ", ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=1000, help="trials appended per format (default 1000)")
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated subset of {','.join(FORMATS)}")
    ap.add_argument("--s3-trials", type=int, default=50, help="trials appended to delta-s3 (moto) (default 50)")
    ap.add_argument("--append-budget", type=float, default=200.0,
                    help="stop a format's appends after this many seconds (default 200)")
    ap.add_argument("--procs", default="2,4",
                    help="comma-separated process counts for the concurrency test (default 2,4)")
    ap.add_argument("--conc-trials", type=int, default=15,
                    help="trials per process in the concurrency test (default 15; delta-s3: 10)")
    ap.add_argument("--no-concurrency", action="store_true")
    ap.add_argument("--workdir", default=None, help="where the tables go (default: a new temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    for f in formats:
        if f not in FORMATS:
            ap.error(f"unknown format {f!r}; choose from {FORMATS}")
    workdir = args.workdir or tempfile.mkdtemp(prefix="store_formats-")
    os.makedirs(workdir, exist_ok=True)
    t_all = time.perf_counter()
    print(f"# store formats: {args.trials} trials per format, workdir {workdir}")
    print(f"# {versions()}")
    print(f"# load average at start (1/5/15 min): {'/'.join(f'{x:.2f}' for x in os.getloadavg())} "
          "(other processes on the machine skew every timing)")
    sample = make_trial(0)[0]
    print(f"# {os.cpu_count()} CPUs; rows: trial {len(TRIAL_SCHEMA)} columns "
          f"({sample.nbytes / 1024:.1f} KiB in Arrow, config_json {len(sample['config_json'][0].as_py())} B), "
          f"history {HISTORY_EPOCHS} rows x {len(HISTORY_SCHEMA)} columns per trial")

    moto = None
    if "delta-s3" in formats:
        try:
            os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
            moto = Moto()
        except Exception as exc:
            log(f"moto unavailable: {short(exc)}")

    appends: list[dict] = []
    states: list[dict] = []
    notes: list[str] = []
    for fmt in formats:
        n = args.s3_trials if fmt == "delta-s3" else args.trials
        if fmt == "delta-s3" and moto is None:
            appends.append({"format": fmt, "note": "moto server could not start"})
            continue
        try:
            app, st, nt = run_format(fmt, n, workdir, args.append_budget, moto)
            appends.append(app)
            states.extend(st)
            notes.extend(nt)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            appends.append({"format": fmt, "note": "UNAVAILABLE/FAILED: " + short(exc, 300)})

    conc: list[dict] = []
    if not args.no_concurrency:
        variants = {"ducklake": ["ducklake", "ducklake-busy5s", "ducklake-appretry"]}
        conc_formats = [f for x in formats for f in variants.get(x, [x])]
        all_procs = [int(p) for p in args.procs.split(",")]
        for fmt in conc_formats:
            for procs in all_procs:
                if fmt == "delta-s3" and moto is None:
                    continue
                if fmt == "ducklake-busy5s" and procs != max(all_procs):
                    continue
                k = min(args.conc_trials, 10) if fmt == "delta-s3" else args.conc_trials
                log(f"{fmt}: concurrency, {procs} processes x {k} trials")
                try:
                    conc.append(run_concurrency(fmt, procs, k, workdir, moto))
                except Exception as exc:
                    traceback.print_exc(file=sys.stderr)
                    conc.append({"format": fmt, "procs": procs, "landed": "FAILED: " + short(exc, 200)})

    print_table("Appends: one trial per commit (history commit + trial commit; ducklake: one transaction)", appends, [
        ("format", "format"), ("trials", "trials"), ("per_s", "trials/s"), ("p50_ms", "p50 ms"),
        ("max_ms", "max ms"), ("first100_s", "first 100 s"), ("last100_s", "last 100 s"), ("note", "note")])
    print_table("Storage and reads of the trials table (files: data+log/metadata, both tables; MB likewise; "
                "rows: rows/distinct trial_id)", states, [
        ("format", "format"), ("state", "state"), ("op_s", "op s"), ("files", "files"), ("mb", "MB"),
        ("fmt_read_s", "own reader s"), ("fmt_rows", "own rows"), ("pd_s", "pd.read_parquet(dir) s"),
        ("pd_rows", "pd rows"), ("duck_s", "duckdb glob s"), ("duck_rows", "duckdb rows"),
        ("hist_pd", "history pd rows"), ("err", "error")])
    if conc:
        print_table("Concurrency: P processes appending at once to one table", conc, [
            ("format", "format"), ("procs", "procs"), ("attempted", "attempted"), ("ok", "ok"),
            ("failed", "failed"), ("retries", "logged retries"), ("landed", "landed rows/ids"),
            ("history", "history rows"),
            ("wall_s", "wall s"), ("per_s", "trials/s")])
        for r in conc:
            for e, c in (r.get("errors") or {}).items():
                notes.append(f"{r['format']} x{r['procs']}: {c} x {e}")
    if notes:
        print("\n## Notes")
        for n in notes:
            print(f"- {n}")
    print(f"\n# total {time.perf_counter() - t_all:.0f} s; load average at end (1/5/15 min): "
          f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    if moto is not None:
        moto.stop()
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
