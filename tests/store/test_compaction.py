"""Compaction: finished trials' rows move into parts; every reader reads each trial once, through any crash."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from trial_copies import copy_of
from trial_fixtures import tiny_config

from calib._lease import holder_identity
from calib.config import parse_trial_config
from calib.store import StoreWarning, completed_trial_ids, read_history, read_trials, write_result
from calib.store import compaction as compaction_module
from calib.store.compaction import CompactionLost, compact, compact_study
from calib.store.files import StoreFile
from calib.trial import TrialResult, run_trial

STUDY = "test"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> TrialResult:
    """One real MaC-Cal trial (3 Stage-II epochs of history)."""
    return run_trial(parse_trial_config(tiny_config(tmp_path_factory.mktemp("base"), method={"name": "mac_cal"})))


def files_of(store: Path | str, table: str = "trials", study: str = STUDY) -> list[str]:
    return sorted(p.name for p in (Path(store) / table / f"study={study}").iterdir())


def own_files(store: Path | str, table: str = "trials") -> list[str]:
    return [n for n in files_of(store, table) if not n.startswith(("part-", "."))]


def parts(store: Path | str, table: str = "trials") -> list[str]:
    return [n for n in files_of(store, table) if n.startswith("part-")]


def canonical(df: pd.DataFrame) -> pd.DataFrame:
    keys = [k for k in ("trial_id", "stage", "epoch") if k in df.columns]
    return df.sort_values(keys).reset_index(drop=True)


def assert_reads(store: Path | str, trials: pd.DataFrame, history: pd.DataFrame, *, pandas_once: bool = True,
                 history_once: bool | None = None) -> None:
    """calib's readers give exactly ``trials`` and ``history``; so does pandas where ``pandas_once`` (the trials
    table) and ``history_once`` (default: the same), else pandas sees each row at least once."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)
        pd.testing.assert_frame_equal(canonical(read_trials(store)), canonical(trials), check_dtype=False)
        pd.testing.assert_frame_equal(canonical(read_history(store)), canonical(history), check_dtype=False)
    seen = pd.read_parquet(Path(store) / "trials")["trial_id"]
    assert set(seen) == set(trials["trial_id"]) and seen.is_unique == pandas_once
    rows = pd.read_parquet(Path(store) / "history")
    assert set(rows["trial_id"]) == set(history["trial_id"])
    assert (len(rows) == len(history)) == (pandas_once if history_once is None else history_once)


def test_finished_trials_move_into_parts_and_read_the_same(base: TrialResult, tmp_path: Path):
    results = [copy_of(base, 0), copy_of(base, 1), copy_of(base, 2, status="failed"),
               TrialResult.pruned(base.config, epoch=1, metrics={"val_ece": 0.3}, started_at=base.started_at)]
    for r in results:
        write_result(tmp_path, r)
    trials, history = read_trials(tmp_path), read_history(tmp_path)
    (report,) = compact(tmp_path)
    assert report.trials_moved == 3 and report.parts_merged == 0
    # the failed trial keeps its own file (its re-run replaces it); ok and pruned rows are in one part per table
    assert own_files(tmp_path) == own_files(tmp_path, "history") == [f"{results[2].trial_id}.parquet"]
    assert len(parts(tmp_path)) == len(parts(tmp_path, "history")) == 1
    assert_reads(tmp_path, trials, history)
    part = pq.ParquetFile(tmp_path / "trials" / f"study={STUDY}" / parts(tmp_path)[0])
    assert part.metadata.num_rows == 3 and part.metadata.row_group(0).column(0).compression == "ZSTD"
    assert completed_trial_ids(tmp_path, STUDY) == {results[0].trial_id, results[1].trial_id}
    # an ok trial in a part is never rewritten; the failed one is replaced by its re-run, and moves on the next run
    assert write_result(tmp_path, results[0]).endswith(parts(tmp_path)[0])
    assert own_files(tmp_path) == [f"{results[2].trial_id}.parquet"]
    rerun = copy_of(base, 2)
    write_result(tmp_path, rerun)
    compact(tmp_path)
    assert own_files(tmp_path) == own_files(tmp_path, "history") == []
    assert read_trials(tmp_path).set_index("trial_id").loc[rerun.trial_id, "status"] == "ok"
    (again,) = compact(tmp_path)
    assert again.parts_written == again.files_deleted == 0  # nothing left to do


def test_a_trial_in_two_files_is_read_once_and_the_spare_copy_goes(base: TrialResult, tmp_path: Path):
    """The state a compaction killed after publishing its parts leaves: rows in a part and in own files."""
    for i in range(4):
        write_result(tmp_path, copy_of(base, i))
    trials, history = read_trials(tmp_path), read_history(tmp_path)
    backup = tmp_path.parent / f"{tmp_path.name}-own"
    shutil.copytree(tmp_path, backup)
    compact(tmp_path)
    for table in ("trials", "history"):
        for name in own_files(backup, table):
            shutil.copy(backup / table / f"study={STUDY}" / name, tmp_path / table / f"study={STUDY}" / name)
    assert len(own_files(tmp_path)) == 4 and len(parts(tmp_path)) == 1
    assert_reads(tmp_path, trials, history, pandas_once=False)
    (report,) = compact(tmp_path)
    assert report.trials_moved == 0 and report.files_deleted == 8 and report.parts_written == 0
    assert own_files(tmp_path) == [] and len(parts(tmp_path)) == 1
    assert_reads(tmp_path, trials, history)


def test_the_best_row_wins_and_a_part_holding_a_losing_row_is_merged(base: TrialResult, tmp_path: Path):
    """A pruned row in a part and the same trial ok in its own file: readers take the ok row; the
    compaction rewrites the part without the pruned row. Two parts holding one trial: read once, merged."""
    ok = copy_of(base, 0)
    pruned = TrialResult.pruned(base.config, epoch=0, metrics={"val_ece": 0.5}, started_at=base.started_at)
    pruned.trial_id = ok.trial_id
    write_result(tmp_path, pruned)
    write_result(tmp_path, copy_of(base, 1))
    compact(tmp_path)
    first_part = parts(tmp_path)[0]
    write_result(tmp_path, ok, known_new=True)  # the same trial, ok (a re-run whose check raced)
    rows = read_trials(tmp_path)
    assert rows["trial_id"].is_unique and rows.set_index("trial_id").loc[ok.trial_id, "status"] == "ok"
    history = read_history(tmp_path)
    assert len(history[history["trial_id"] == ok.trial_id]) == len(ok.history)  # the ok row's file: its history
    (report,) = compact(tmp_path)
    # the trials part lost a row: merged; the history part did not (a pruned trial has no history rows)
    assert report.parts_merged == 1 and first_part not in parts(tmp_path) and own_files(tmp_path) == []
    pd.testing.assert_frame_equal(canonical(read_trials(tmp_path)), canonical(rows), check_dtype=False)
    pd.testing.assert_frame_equal(canonical(read_history(tmp_path)), canonical(history), check_dtype=False)
    assert pd.read_parquet(tmp_path / "trials")["trial_id"].is_unique

    # two parts sharing a trial (two compactions that overlapped): one copy read, and the parts merged
    folder = tmp_path / "trials" / f"study={STUDY}"
    (only,) = parts(tmp_path)
    shutil.copy(folder / only, folder / f"part-{'f' * 32}.parquet")
    hfolder = tmp_path / "history" / f"study={STUDY}"
    shutil.copy(hfolder / parts(tmp_path, "history")[0], hfolder / f"part-{'f' * 32}.parquet")
    assert len(read_trials(tmp_path)) == 2 and len(pd.read_parquet(tmp_path / "trials")) == 4
    compact(tmp_path)
    assert len(parts(tmp_path)) == 1 and len(pd.read_parquet(tmp_path / "trials")) == 2
    assert len(pd.read_parquet(tmp_path / "history")) == len(history)


def part(trials: int) -> tuple[StoreFile, int]:
    return StoreFile(f"part-{trials}", STUDY, "part", 0), trials


def test_size_tiers():
    """FANOUT 4, tier k up to 1,000 · 4^k trials: a new part absorbs its tier once it makes 4 parts, then climbs."""
    tiered = compaction_module._tiered
    assert compaction_module.FANOUT == 4
    assert tiered(1000, [part(900), part(800)]) == []
    assert tiered(1000, [part(900), part(800), part(700)]) == [part(700)[0], part(800)[0], part(900)[0]]
    # 3 × 1k + 1k = 4k reaches tier 1 where three 4k parts wait: all merge into 16k
    small = [part(1000), part(1000), part(1000), part(4000), part(5000), part(6000)]
    assert {p.path for p in tiered(1000, small)} == {p.path for p, _ in small}
    assert tiered(1000, [part(20_000)] * 5) == []  # larger tiers stay
    assert tiered(0, [part(10)] * 5) == []  # nothing new: nothing merges


def test_parts_merge_by_tier_and_full_merges_all(base: TrialResult, tmp_path: Path):
    trials_written = 0
    for _round in range(3):
        for _ in range(2):
            write_result(tmp_path, copy_of(base, trials_written))
            trials_written += 1
        compact(tmp_path)
    assert len(parts(tmp_path)) == 3 and len(parts(tmp_path, "history")) == 3
    write_result(tmp_path, copy_of(base, trials_written))
    (report,) = compact(tmp_path)  # the fourth part of tier 0: all four become one
    assert report.parts_merged == 6 and len(parts(tmp_path)) == 1 and len(parts(tmp_path, "history")) == 1
    for i in range(trials_written + 1, trials_written + 3):
        write_result(tmp_path, copy_of(base, i))
        compact(tmp_path)
    assert len(parts(tmp_path)) == 3
    (report,) = compact(tmp_path, full=True)
    assert len(parts(tmp_path)) == 1 and report.parts_merged == 6
    assert len(read_trials(tmp_path)) == trials_written + 3 == len(pd.read_parquet(tmp_path / "trials"))


def test_a_store_of_an_earlier_calib_is_compacted_in_place(base: TrialResult, tmp_path: Path):
    """One file per trial, files written before some columns existed (a subset of today's, int32 seed)."""
    for i in range(3):
        write_result(tmp_path, copy_of(base, i))
    old = "0123456789abcdef"
    pq.write_table(pa.table({"trial_id": [old], "status": ["ok"], "seed": pa.array([7], pa.int32()),
                             "test_ece": [0.25], "method": ["vanilla"]}),
                   tmp_path / "trials" / f"study={STUDY}" / f"{old}.parquet", compression="snappy")
    pq.write_table(pa.table({"trial_id": [old, old], "epoch": [0, 1], "train_loss": [1.0, 0.5]}),
                   tmp_path / "history" / f"study={STUDY}" / f"{old}.parquet")
    trials, history = read_trials(tmp_path), read_history(tmp_path)
    result = subprocess.run([sys.executable, "-m", "calib.store", "compact", "--store", str(tmp_path)],
                            capture_output=True, text=True, check=True)
    assert "4 finished trials moved into parts" in result.stdout and "0 trials' own files" in result.stdout
    assert own_files(tmp_path) == own_files(tmp_path, "history") == []
    assert_reads(tmp_path, trials, history)
    row = read_trials(tmp_path).set_index("trial_id").loc[old]
    assert row["seed"] == 7 and row["test_ece"] == 0.25 and pd.isna(row["val_ece"])


def test_foreign_files_are_left_alone(base: TrialResult, tmp_path: Path):
    write_result(tmp_path, copy_of(base, 0))
    folder = tmp_path / "trials" / f"study={STUDY}"
    (folder / "notes.txt").write_text("mine")
    (folder / f"{'e' * 16}.parquet").write_bytes(b"PAR1 not really")
    compact(tmp_path)
    assert (folder / "notes.txt").read_text() == "mine" and (folder / f"{'e' * 16}.parquet").exists()
    with pytest.warns(StoreWarning):
        assert len(read_trials(tmp_path)) == 1


def test_the_lease(base: TrialResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    write_result(tmp_path, copy_of(base, 0))
    store = str(tmp_path)
    held = compaction_module._take_lease(store, STUDY, 60.0)
    assert held is not None and compaction_module._take_lease(store, STUDY, 60.0) is None
    (report,) = compact(store)
    assert report.skipped == "another process is compacting it" and own_files(tmp_path) != []
    assert "compaction skipped" in report.line()
    # a lease renewed longer ago than the lease is taken over; its old holder stops before changing anything
    monkeypatch.setattr(compaction_module.time, "time", lambda: 10_000_000_000.0)
    taker = compaction_module._take_lease(store, STUDY, 60.0)
    assert taker is not None
    with pytest.raises(CompactionLost):
        compact_study(store, STUDY, lease=held)
    assert parts(tmp_path) == [] and len(own_files(tmp_path)) == 1
    taker.release()
    monkeypatch.undo()
    # a holder that is a dead process of this host is taken over at once
    lease = Path(store) / "compaction" / f"study={STUDY}.json"
    lease.write_text(json.dumps({**holder_identity(), "pid": 999_999_999, "renewed_at": time.time(),
                                 "lease_seconds": 600}))
    (report,) = compact(store)
    assert report.skipped is None and report.trials_moved == 1 and not lease.exists()


def test_the_command_skips_a_study_another_process_compacts_with_its_own_exit_code(
        base: TrialResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from calib.exit_codes import ExitCode
    from calib.store.__main__ import main

    write_result(tmp_path, copy_of(base, 0))
    write_result(tmp_path, copy_of(base, 1))
    write_result(tmp_path, copy_of(base, 2, study="second"))
    held = compaction_module._take_lease(str(tmp_path), STUDY, 60.0)
    assert held is not None
    assert ExitCode.COMPACTION_SKIPPED == 4
    assert main(["compact", "--store", str(tmp_path), "--wait", "0"]) == ExitCode.COMPACTION_SKIPPED
    out = capsys.readouterr().out
    assert f"[{STUDY}] compaction skipped: another process is compacting it" in out
    assert "[second] compaction: 1 finished trials moved into parts" in out, "the other study is compacted all the same"
    assert len(own_files(tmp_path)) == 2 and parts(tmp_path) == [], "the held study is left as it was"
    held.release()
    assert main(["compact", "--store", str(tmp_path), "--wait", "0"]) == 0
    assert own_files(tmp_path) == [] and len(parts(tmp_path)) == 1


def test_the_command_waits_for_another_compaction_then_compacts(base: TrialResult, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]):
    """--wait: the lease is polled until the other process lets it go (here: during the command's second
    wait), then the study is compacted; the clock is the test's, so nothing depends on timing."""
    from calib.store.__main__ import main

    write_result(tmp_path, copy_of(base, 0))
    other = compaction_module._take_lease(str(tmp_path), STUDY, 60.0)
    now = [1000.0]
    waits = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds
        if len(waits) == 2 and other is not None:
            other.release()  # the other process finishes

    monkeypatch.setattr(compaction_module.time, "sleep", sleep)
    monkeypatch.setattr(compaction_module.time, "monotonic", lambda: now[0])
    assert main(["compact", "--store", str(tmp_path), "--wait", "30"]) == 0
    assert len(waits) == 2 and "1 finished trials moved into parts" in capsys.readouterr().out
    assert own_files(tmp_path) == [] and len(parts(tmp_path)) == 1
    # a lease held for all of --wait: polled about once a second, then skipped
    held = compaction_module._take_lease(str(tmp_path), STUDY, 60.0)
    assert held is not None
    other, waits[:] = None, []
    assert main(["compact", "--store", str(tmp_path), "--wait", "5"]) == 4
    assert sum(waits) == pytest.approx(5.0) and max(waits) <= 1.0
    assert "compaction skipped" in capsys.readouterr().out
    held.release()


def test_bad_lease_setting_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from calib._config import ConfigError

    monkeypatch.setenv("CALIB_COMPACTION_LEASE_SECONDS", "soon")
    with pytest.raises(ConfigError, match="CALIB_COMPACTION_LEASE_SECONDS must be a number of seconds > 0, got 'soon'"):
        compact(tmp_path)


def test_the_readme_one_liners_read_each_trial_once(base: TrialResult, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch):
    """pandas, a pyarrow dataset and DuckDB on a store holding parts, trials' own files (a failed one, new
    ones), temporaries and a lease, exactly as docs/how-to/result-store.md writes them."""
    import duckdb

    monkeypatch.chdir(tmp_path)
    for i in range(4):
        write_result("results", copy_of(base, i))
    compact("results")
    write_result("results", copy_of(base, 4))
    write_result("results", copy_of(base, 5, status="failed"))
    (tmp_path / "results" / "trials" / f"study={STUDY}" / f".part-{'a' * 32}.parquet.{'b' * 32}.tmp").write_bytes(b"x")
    (tmp_path / "results" / "compaction" / f"study={STUDY}.json").write_text("{}")
    wanted = sorted(copy_of(base, i).trial_id for i in range(6))

    assert sorted(pd.read_parquet("results/trials")["trial_id"]) == wanted
    assert sorted(pads.dataset("results/trials", partitioning="hive").to_table()["trial_id"].to_pylist()) == wanted
    rows = duckdb.sql("SELECT trial_id, study FROM read_parquet('results/trials/**/*.parquet', "
                      "hive_partitioning=true, union_by_name=true)").fetchall()
    assert sorted(r[0] for r in rows) == wanted and {r[1] for r in rows} == {STUDY}
    history = duckdb.sql("SELECT count(*) FROM read_parquet('results/history/**/*.parquet', hive_partitioning=true, "
                         "union_by_name=true)").fetchall()[0][0]
    assert history == len(pd.read_parquet("results/history")) == 6 * len(base.history)


# ---------------------------------------------------------------------------------------------------
# Crashes: a compaction killed at each of its steps


def _compact_and_die(store: str, kill_at: int) -> None:
    steps = iter(range(10_000))

    def on_step(step: str) -> None:
        if next(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    compact(store, on_step=on_step)


def _steps(store: Path) -> list[str]:
    probe = store.parent / f"{store.name}-probe"
    shutil.copytree(store, probe)
    seen: list[str] = []
    compact(probe, on_step=seen.append)
    return seen


@pytest.fixture(scope="module")
def crash_store(base: TrialResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with two parts (a merge is due) and three finished and one failed trial in their own files."""
    store = tmp_path_factory.mktemp("crash") / "store"
    for i in range(6):
        write_result(store, copy_of(base, i))
        if i % 2:
            compact(store)
    for i in range(6, 9):
        write_result(store, copy_of(base, i))
    write_result(store, copy_of(base, 9, status="failed"))
    return store


def test_a_compaction_killed_at_each_step_loses_nothing(crash_store: Path, base: TrialResult, tmp_path: Path):
    trials, history = read_trials(crash_store), read_history(crash_store)
    steps = _steps(crash_store)
    assert [s.split()[0] for s in steps] == ["write", "publish", "write", "publish", "delete", "delete"], steps
    fork = multiprocessing.get_context("fork")
    for kill_at in range(len(steps) + 1):
        store = tmp_path / f"killed-at-{kill_at}"
        shutil.copytree(crash_store, store)
        child = fork.Process(target=_compact_and_die, args=(str(store), kill_at))
        child.start()
        child.join()
        assert child.exitcode == (-signal.SIGKILL if kill_at < len(steps) else 0), (kill_at, steps)
        # pandas sees a table's moved rows twice from the publication of its part to the deletion of their files
        assert_reads(store, trials, history, pandas_once=kill_at != 4, history_once=not 2 <= kill_at <= 5)
        compact(store)  # the next compaction finishes the job, whatever the killed one left
        assert_reads(store, trials, history)
        hidden = [p for p in (store / "trials" / f"study={STUDY}").iterdir() if p.name.startswith(".")]
        assert hidden == [], (kill_at, hidden)  # a killed compaction's temporary part is gone too
        assert len(parts(store)) == 1  # the two old parts and the new rows: one part
        assert own_files(store) == [f"{copy_of(base, 9).trial_id}.parquet"]  # the failed trial's file stays


def test_a_killed_compaction_on_s3(s3, base: TrialResult):
    bucket, _ = s3
    store = f"s3://{bucket}/results"
    for i in range(4):
        write_result(store, copy_of(base, i))
    trials, history = read_trials(store), read_history(store)
    seen: list[str] = []

    def die_before_deleting(step: str) -> None:
        seen.append(step)
        if step.startswith("delete trials"):
            raise KeyboardInterrupt  # a kill between the publish and the deletes

    with pytest.raises(KeyboardInterrupt):
        compact(store, on_step=die_before_deleting)
    import boto3

    listing = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="results/trials/")
    keys = [o["Key"] for o in listing["Contents"]]
    assert sum("/part-" in k for k in keys) == 1 and len(keys) == 5  # the part and the four own files
    for reader, wanted in ((read_trials, trials), (read_history, history)):
        pd.testing.assert_frame_equal(canonical(reader(store)), canonical(wanted), check_dtype=False)
    compact(store)  # the lease of the interrupted one was released by its finally; this one finishes the job
    listing = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="results/")
    data = [o["Key"] for o in listing["Contents"] if o["Key"].endswith(".parquet")]
    assert len(data) == 2 and all("/part-" in k for k in data)
    for reader, wanted in ((read_trials, trials), (read_history, history)):
        pd.testing.assert_frame_equal(canonical(reader(store)), canonical(wanted), check_dtype=False)


# ---------------------------------------------------------------------------------------------------
# Two drivers at once


def _driver(store: str, base: TrialResult, first: int, count: int, every: int) -> None:
    """What a study's driver and its workers do to the store: write trials, compact every ``every``."""
    for i in range(first, first + count):
        write_result(store, copy_of(base, i))
        if (i - first + 1) % every == 0:
            compact(store, wait_seconds=0)


def _two_drivers(store: str, base: TrialResult, per_driver: int) -> None:
    spawn = multiprocessing.get_context("spawn")  # not fork: the reader thread below runs while they start
    drivers = [spawn.Process(target=_driver, args=(store, base, k * per_driver, per_driver, 3)) for k in range(2)]
    seen_counts: list[int] = []
    problems: list[str] = []
    done = threading.Event()

    def reader() -> None:  # every read during the run: each trial once, none lost once seen
        known: set[str] = set()
        while not done.is_set():
            ids = read_trials(store, columns=["trial_id"])["trial_id"]
            if not ids.is_unique:
                problems.append(f"duplicated: {sorted(ids[ids.duplicated()])}")
            if not known <= set(ids):
                problems.append(f"lost: {sorted(known - set(ids))}")
            known |= set(ids)
            seen_counts.append(len(ids))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for d in drivers:
            d.start()
        for d in drivers:
            d.join(timeout=300)
    finally:
        done.set()
        thread.join()
    assert [d.exitcode for d in drivers] == [0, 0]
    assert problems == [] and len(seen_counts) > 2
    compact(store, wait_seconds=30)
    wanted = {copy_of(base, i).trial_id for i in range(2 * per_driver)}
    rows = read_trials(store)
    assert set(rows["trial_id"]) == wanted and rows["trial_id"].is_unique
    assert len(read_history(store)) == len(wanted) * len(base.history)


def test_two_drivers_on_a_shared_directory(base: TrialResult, tmp_path: Path):
    _two_drivers(str(tmp_path), base, per_driver=12)
    assert own_files(tmp_path) == [] and 1 <= len(parts(tmp_path)) < compaction_module.FANOUT
    once = pd.read_parquet(tmp_path / "trials")["trial_id"]
    assert once.is_unique and len(once) == 24


def test_two_drivers_on_s3(s3, base: TrialResult):
    bucket, _ = s3
    store = f"s3://{bucket}/results"
    _two_drivers(store, base, per_driver=8)
    fs, path = pafs.FileSystem.from_uri(store)
    ids = pads.dataset(f"{path}/trials", filesystem=fs, format="parquet", partitioning="hive").to_table()["trial_id"]
    assert len(ids) == 16 and len(ids.unique()) == 16
