"""The result store at 1,000 to 100,000 trials: writing, bytes on disk, and every reader against one file.

    python benchmarks/store_scale.py --trials 1000 10000 100000
    python benchmarks/store_scale.py --trials 1000 --backends local      # a quick look

Builds a store through calib's own write path, :func:`calib.store.write_result` (what a Ray worker
calls), from ``--writers`` processes at once, while the main process compacts the study every
``--compact-every`` trials in a background thread, as a study's driver does, and once at the end. The
rows are real: one vanilla and one MaC-Cal trial of the default γ study (quick preset, digits-noisy)
are run once, then copied with new trial ids, seeds 1-5, and metrics, reliability bins, timings and
history values varied by up to ±10 %.

Then it times, best of ``--repeats``, each reader on the store and on the same rows in one Parquet file
per table (written from the store by pyarrow, zstd, as the parts are), read the same way:
``pd.read_parquet(<store>/trials)``, :func:`calib.store.read_trials`, :func:`calib.store.read_history`,
the study-start check (:func:`calib.store.completed_trial_ids` of every trial id, what
:func:`calib.search.run_grid` runs first), and ``studies/report.py`` (:func:`calib.report.build_report`,
its tables and figures included). ``--backends s3`` runs the same against moto's S3 server on loopback.

Also printed: trials written per second with compaction running; the writer alone (2,000 trials into a
fresh store, no compaction) beside the writer before compaction existed, whose stored-check read every
trial file of the study (20 trials into that store); files and bytes per trial of each table.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import logging
import multiprocessing
import os
import pickle
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from calib import storage
from calib.store import completed_trial_ids, read_history, read_trials, write_result
from calib.store.compaction import compact
from calib.trial import TrialResult

STUDY = "sensitivity_gamma"
_BASE: list[TrialResult] = []


# ----------------------------------------------------------------------------------------------------------------
# Rows


def base_results(workdir: Path) -> list[TrialResult]:
    """A vanilla and a MaC-Cal (γ 0.9) trial of the default γ study, run once and kept in ``workdir``."""
    cache = workdir / "base_results.pkl"
    if cache.exists():
        return pickle.loads(cache.read_bytes())
    from calib.config import parse_trial_config
    from calib.study.presets import PRESETS, base_config
    from calib.trial import run_trial

    preset = PRESETS.get("quick")
    common = {"preset": preset, "study": STUDY, "dataset": "digits-noisy", "seed": 1,
              "data_root": str(workdir / "data"), "artifact_root": str(workdir / "artifacts"), "device": "cpu"}
    results = [run_trial(parse_trial_config({**base_config(method=method, **common), "label": label,
                                             "label_rank": rank}))
               for rank, (label, method) in enumerate([("vanilla", {"name": "vanilla"}),
                                                       ("MaC-Cal γ=0.9", {"name": "mac_cal", "accuracy_weight": 0.9})])]
    cache.write_bytes(pickle.dumps(results))
    return results


def _vary(value: Any, rng: random.Random) -> Any:
    if isinstance(value, float):
        return value * rng.uniform(0.9, 1.1)
    if isinstance(value, list):
        return [_vary(v, rng) for v in value]
    return value


def trial(index: int) -> TrialResult:
    """The ``index``-th copy of a base result: a new trial id, seed 1-5, varied numbers."""
    rng = random.Random(index)
    base = _BASE[index % len(_BASE)]
    config = dataclasses.replace(base.config, seed=1 + index % 5)
    return dataclasses.replace(
        base, config=config, trial_id=hashlib.sha256(f"trial {index}".encode()).hexdigest()[:16],
        metrics={k: _vary(v, rng) for k, v in base.metrics.items()},
        details={k: _vary(v, rng) for k, v in base.details.items()},
        timings={k: _vary(v, rng) for k, v in base.timings.items()},
        history=[{k: _vary(v, rng) for k, v in row.items()} for row in base.history],
        started_at=base.started_at + pd.Timedelta(seconds=index), finished_at=base.started_at + pd.Timedelta(
            seconds=index + 5))


def _init_writer(workdir: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    _BASE.extend(base_results(Path(workdir)))


def _write_range(task: tuple[str, int, int, bool]) -> None:
    store, start, stop, known_new = task
    for index in range(start, stop):
        write_result(store, trial(index), known_new=known_new)


# ----------------------------------------------------------------------------------------------------------------
# Measuring


def best_of(repeats: int, run: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def tree_bytes(location: str) -> tuple[int, int]:
    """Files and bytes under ``location``."""
    fs, root = storage.filesystem(location)
    infos = [i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
             if i.type == pafs.FileType.File]
    return len(infos), sum(i.size for i in infos)


def write_in_parallel(pool: Any, store: str, start: int, stop: int, writers: int, known_new: bool = False) -> None:
    bounds = [start + (stop - start) * w // writers for w in range(writers + 1)]
    pool.map(_write_range, [(store, a, b, known_new) for a, b in itertools.pairwise(bounds) if b > a])


def write_store(pool: Any, store: str, trials: int, writers: int, compact_every: int) -> tuple[float, float]:
    """Write ``trials`` trials into ``store`` from the pool, compacting in a thread as a driver does;
    (seconds in all, seconds compacting)."""
    start = time.perf_counter()
    compacting = [0.0]

    def timed_compaction() -> None:
        began = time.perf_counter()
        compact(store, [STUDY])
        compacting[0] += time.perf_counter() - began

    compaction: threading.Thread | None = None
    step = compact_every or trials
    for chunk in range(0, trials, step):
        write_in_parallel(pool, store, chunk, min(trials, chunk + step), writers)
        if compaction is not None:
            compaction.join()
        compaction = threading.Thread(target=timed_compaction)
        compaction.start()
    if compaction is not None:
        compaction.join()
    timed_compaction()
    return time.perf_counter() - start, compacting[0]


def writer_rates(pool: Any, root: str, writers: int) -> tuple[int, float, float]:
    """Trials per second of the writer alone (no compaction) over 2,000 trials written one file per trial,
    and of the writer before compaction existed, whose stored-check read every trial file of the study,
    over 20 more trials into the same store (its cost grows with the study)."""
    store = storage.join(root, "one-file-per-trial")
    sample = 2000
    start = time.perf_counter()
    write_in_parallel(pool, store, 0, sample, writers)
    alone = sample / (time.perf_counter() - start)
    start = time.perf_counter()
    for index in range(sample, sample + 20):
        result = trial(index)
        if result.trial_id not in completed_trial_ids(store, STUDY, trial_ids=[result.trial_id]):
            write_result(store, result, known_new=True)
    return sample, alone, 20 / (time.perf_counter() - start)


def one_file_copy(store: str, target: str) -> None:
    """The rows of ``store`` in one Parquet file per table under ``target`` (same layout, one part each)."""
    for table in ("trials", "history"):
        fs, root = storage.filesystem(storage.join(store, table))
        rows = pads.dataset(root, filesystem=fs, format="parquet", partitioning="hive").to_table()
        rows = rows.drop_columns(["study"])
        location = storage.join(target, table, f"study={STUDY}", f"part-{'0' * 32}.parquet")
        tfs, path = storage.filesystem(location)
        if not storage.is_remote(location):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        with tfs.open_output_stream(path) as out:
            pq.write_table(rows, out, compression="zstd")


def pandas_read(store: str) -> pd.DataFrame:
    fs, root = storage.filesystem(storage.join(store, "trials"))
    if storage.is_remote(store):
        return pd.read_parquet(root, filesystem=fs)
    return pd.read_parquet(root)


def measure(store: str, reference: str, repeats: int, workdir: Path) -> list[tuple[str, float, float]]:
    """(reader, seconds on the store, seconds on the one-file reference)."""
    from calib.report.build import build_report

    ids = list(read_trials(store, columns=["trial_id"])["trial_id"])
    quiet = lambda message: None  # noqa: E731
    readers = {
        "pd.read_parquet(<store>/trials)": pandas_read,
        "read_trials(store)": read_trials,
        "read_history(store)": read_history,
        "study start: completed_trial_ids": lambda s: completed_trial_ids(s, STUDY, trial_ids=ids),
        "report.py (build_report)": lambda s: build_report(s, workdir / "report", log=quiet),
    }
    return [(name, best_of(repeats, lambda r=read: r(store)), best_of(repeats, lambda r=read: r(reference)))
            for name, read in readers.items()]


def run_backend(backend: str, sizes: list[int], args: argparse.Namespace, workdir: Path) -> None:
    env: dict[str, str] = {}
    server = None
    if backend == "s3":
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        os.environ.update(env)
        boto3.client("s3").create_bucket(Bucket="bench")
    context = multiprocessing.get_context("spawn")
    try:
        with context.Pool(args.writers, initializer=_init_writer, initargs=(str(workdir), env)) as pool:
            for size in sizes:
                root = f"s3://bench/n{size}" if backend == "s3" else str(workdir / f"n{size}")
                store, reference = storage.join(root, "store"), storage.join(root, "one-file")
                reused = args.reuse and storage.exists(storage.join(store, "trials"))
                if not reused:
                    seconds, compacting = write_store(pool, store, size, args.writers, args.compact_every)
                    sample, alone, before = writer_rates(pool, root, args.writers)
                one_file_copy(store, reference)
                files = {t: tree_bytes(storage.join(store, t)) for t in ("trials", "history")}
                print(f"\n## {backend}, {size:,} trials ({args.writers} writers, compaction every "
                      f"{args.compact_every})\n")
                if reused:
                    print("- written: (a store of an earlier run, --reuse)")
                else:
                    print(f"- written: {size / seconds:,.0f} trials/s with compaction running ({seconds:.1f} s, "
                          f"{compacting:.1f} s of it compacting in the driver's thread)")
                    print(f"- the writer alone, over {sample:,} trials: {alone:,.1f} trials/s; the writer before "
                          f"compaction (its stored-check read all {sample:,} files): {before:,.2f} trials/s")
                for table, (count, size_bytes) in files.items():
                    print(f"- {table}: {count} files, {size_bytes / 1e6:,.1f} MB, {size_bytes / size:,.0f} bytes "
                          f"per trial")
                print("\n| reader | store (s) | one file (s) | ratio |\n|---|---|---|---|")
                for name, mine, one in measure(store, reference, args.repeats, workdir):
                    print(f"| {name} | {mine:.3f} | {one:.3f} | {mine / one:.2f}× |", flush=True)
                if not args.keep and backend == "local":
                    shutil.rmtree(workdir / f"n{size}", ignore_errors=True)
    finally:
        if server is not None:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--backends", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    parser.add_argument("--writers", type=int, default=2, help="processes writing trials at once")
    parser.add_argument("--compact-every", type=int, default=1000, help="trials between two compactions")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs per reader")
    parser.add_argument("--workdir", default=None, help="where stores are built (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the stores")
    parser.add_argument("--reuse", action="store_true", help="measure the readers on stores an earlier --keep run "
                                                             "built in --workdir instead of writing them again")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="calib-store-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    _BASE.extend(base_results(workdir))
    print(f"store_scale: {len(_BASE)} base rows ({', '.join(r.config.label for r in _BASE)}), "
          f"{len(_BASE[1].history)} history rows per MaC-Cal trial; {os.cpu_count()} CPUs; workdir {workdir}")
    print(f"python {sys.version.split()[0]}, pyarrow {pa.__version__}, pandas {pd.__version__}")
    for backend in args.backends:
        run_backend(backend, args.trials, args, workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
