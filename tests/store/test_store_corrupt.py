"""Readers skip a corrupt or foreign file in the store with a warning naming it; they never crash or drop valid rows."""

from __future__ import annotations

import re
import shutil
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from trial_fixtures import tiny_config

from calib.store import (
    StoreWarning,
    completed_trial_ids,
    read_finished,
    read_history,
    read_trials,
    trial_schema,
    write_result,
)
from calib.trial import TrialResult, run_trial

FOREIGN = "0123456789abcdef"  # a trial id no result has: the name of the planted files


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[TrialResult]:
    """Two trials of study ``test`` and one of study ``other`` (sharing its Stage I with the first)."""
    root = tmp_path_factory.mktemp("trials")
    return [run_trial(tiny_config(root, method={"name": "vanilla"}, seed=1)),
            run_trial(tiny_config(root, method={"name": "mac_cal"}, seed=2)),
            run_trial(tiny_config(root, method={"name": "vanilla"}, seed=1, study="other"))]


@pytest.fixture(scope="module")
def pristine(results: list[TrialResult], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid store holding ``results``: each test copies it."""
    store = tmp_path_factory.mktemp("pristine")
    for r in results:
        write_result(store, r)
    return store


@pytest.fixture(scope="module")
def expected(pristine: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trials and history tables of the valid store, read without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)
        return read_trials(pristine), read_history(pristine)


@pytest.fixture
def store(pristine: Path, tmp_path: Path) -> Path:
    shutil.copytree(pristine, tmp_path / "store")
    return tmp_path / "store"


def canonical(df: pd.DataFrame) -> pd.DataFrame:
    keys = [k for k in ("trial_id", "stage", "epoch") if k in df.columns]
    return df.sort_values(keys).reset_index(drop=True)


def assert_same(actual: pd.DataFrame, wanted: pd.DataFrame, *, check_dtype: bool = True) -> None:
    pd.testing.assert_frame_equal(canonical(actual), canonical(wanted), check_dtype=check_dtype)


def valid_bytes(store: Path, kind: str) -> bytes:
    return next((store / kind / "study=test").glob("*.parquet")).read_bytes()


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def flipped(data: bytes) -> bytes:
    """``data`` with its first pages garbled: the footer (and so the schema) still reads."""
    return data[:4] + bytes(b ^ 0xFF for b in data[4:200]) + data[200:]


# (relative path under trials/ and history/, contents from a valid file of that kind, expected reason)
BAD_FILES: dict[str, tuple[str, Callable[[bytes], bytes], str]] = {
    "truncated": (f"study=test/{FOREIGN}.parquet", lambda ok: ok[: len(ok) // 2],
                  "corrupt or not a Parquet file (Parquet magic bytes not found in footer"),
    "zero-byte": (f"study=test/{FOREIGN}.parquet", lambda ok: b"",
                  "corrupt or not a Parquet file (Parquet file size is 0 bytes)"),
    "text named .parquet": ("study=test/x.parquet", lambda ok: b"not parquet at all\n", "not named like a store file"),
    "notes.txt": ("study=test/notes.txt", lambda ok: b"some notes\n", "not a Parquet file of the store"),
    "csv": ("study=test/export.csv", lambda ok: b"trial_id,seed\nab,1\n", "not a Parquet file of the store"),
    "README at the root": ("README.md", lambda ok: b"# results\n", "not a Parquet file of the store"),
    "parquet outside a study": (f"{FOREIGN}.parquet", lambda ok: ok, "not named like a store file"),
    "seed as string": (f"study=test/{FOREIGN}.parquet",
                       lambda ok: parquet_bytes(pa.table({"trial_id": [FOREIGN], "seed": ["x"], "status": ["ok"]})),
                       "column 'seed' is string, the store has int64"),
    "seed as numeric string": (f"study=test/{FOREIGN}.parquet",
                               lambda ok: parquet_bytes(pa.table({"trial_id": [FOREIGN], "seed": ["5"]})),
                               "column 'seed' is string, the store has int64"),
    "trial_id as int": (f"study=test/{FOREIGN}.parquet",
                        lambda ok: parquet_bytes(pa.table({"trial_id": [5], "seed": [1]})),
                        "column 'trial_id' is int64, the store has string"),
    "none of the store's columns": (f"study=test/{FOREIGN}.parquet",
                                    lambda ok: parquet_bytes(pa.table({"foo": [1], "bar": ["x"]})),
                                    "it has none of the store's columns (it has foo, bar)"),
    "no trial_id": (f"study=test/{FOREIGN}.parquet", lambda ok: parquet_bytes(pa.table({"seed": [1]})),
                    "it has no 'trial_id' column"),
    "another trial's file": (f"study=test/{FOREIGN}.parquet", lambda ok: ok, "is not its file name"),
    "garbled pages": (f"study=test/{FOREIGN}.parquet", flipped, "unreadable (Couldn't deserialize thrift"),
}


def read_skipping(read: Callable[..., Any], store: str | Path, skipped: list[str] | dict[str, str],
                  **kwargs: Any) -> Any:
    """``read(store, **kwargs)``, asserting exactly one StoreWarning per path of ``skipped``, naming it.

    ``skipped`` may map each path to a part of the reason its warning must give.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = read(store, **kwargs)
    messages = [str(w.message) for w in caught if issubclass(w.category, StoreWarning)]
    assert len(messages) == len(skipped), messages
    reasons = skipped if isinstance(skipped, dict) else dict.fromkeys(skipped, "")
    for path, reason in reasons.items():
        mine = [m for m in messages if m.startswith(f"skipped {path}: ")]
        assert len(mine) == 1 and reason in mine[0], (path, messages)
    return df


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_file_is_skipped_with_a_warning(case: str, store: Path, expected: tuple[pd.DataFrame, pd.DataFrame]):
    relative, contents, reason = BAD_FILES[case]
    for kind, read, wanted in (("trials", read_trials, expected[0]), ("history", read_history, expected[1])):
        bad = store / kind / relative
        bad.write_bytes(contents(valid_bytes(store, kind)))
        with pytest.warns(StoreWarning, match=re.escape(f"skipped {bad}: ")) as record:
            df = read(store)
        messages = [str(w.message) for w in record if issubclass(w.category, StoreWarning)]
        assert len(messages) == 1 and reason in messages[0], messages
        assert_same(df, wanted)


def test_valid_store_reads_without_warnings(pristine: Path, results: list[TrialResult]):
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)
        trials = read_trials(pristine)
        history = read_history(pristine)
        assert completed_trial_ids(pristine, "test") == {r.trial_id for r in results[:2]}
    assert len(trials) == 3 and len(history) == sum(len(r.history) for r in results)
    by_id = {r.trial_id: r for r in results}
    for _, row in trials.iterrows():
        assert row["test_ece"] == pytest.approx(by_id[row["trial_id"]].metrics["test_ece"])


def test_hidden_files_are_ignored_silently(store: Path, expected: tuple[pd.DataFrame, pd.DataFrame]):
    for kind in ("trials", "history"):
        (store / kind / "study=test" / ".DS_Store").write_bytes(b"\x00\x01junk")
        (store / kind / "_SUCCESS").write_bytes(b"")
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)
        assert_same(read_trials(store), expected[0])
        assert_same(read_history(store), expected[1])


def test_several_bad_files_at_once(store: Path, expected: tuple[pd.DataFrame, pd.DataFrame]):
    for kind, read, wanted in (("trials", read_trials, expected[0]), ("history", read_history, expected[1])):
        ok = valid_bytes(store, kind)
        planted = {store / kind / "study=test" / f"{FOREIGN}.parquet": ok[:100],
                   store / kind / "study=test" / f"{'e' * 16}.parquet": flipped(ok),
                   store / kind / "study=test" / f"{'d' * 16}.parquet": ok,
                   store / kind / "study=other" / "notes.txt": b"notes"}
        for path, data in planted.items():
            path.write_bytes(data)
        assert_same(read_skipping(read, store, [str(p) for p in planted]), wanted)


def test_filters_and_columns_in_the_fallback(store: Path, results: list[TrialResult],
                                             expected: tuple[pd.DataFrame, pd.DataFrame]):
    trials, history = expected
    for kind in ("trials", "history"):
        (store / kind / "study=test" / f"{FOREIGN}.parquet").write_bytes(valid_bytes(store, kind)[:50])
        (store / kind / "study=other" / f"{'e' * 16}.parquet").write_bytes(b"")
    bad_test = [str(store / kind / "study=test" / f"{FOREIGN}.parquet") for kind in ("trials", "history")]
    bad_other = [str(store / kind / "study=other" / f"{'e' * 16}.parquet") for kind in ("trials", "history")]
    vanilla, mac, other = results

    df = read_skipping(read_trials, store, bad_test[:1], study="test", filters=pads.field("method") == "mac_cal",
                       columns=["trial_id", "test_ece", "study"])
    assert list(df.columns) == ["trial_id", "test_ece", "study"]
    assert df["trial_id"].tolist() == [mac.trial_id] and df["study"].tolist() == ["test"]
    assert df["test_ece"].iloc[0] == pytest.approx(mac.metrics["test_ece"])

    # columns without trial_id; a study whose folder holds a bad file warns only when it is read
    df = read_skipping(read_trials, store, bad_other[:1], study="other", columns=["seed", "method"])
    assert list(df.columns) == ["seed", "method"] and df.values.tolist() == [[1, "vanilla"]]
    df = read_skipping(read_trials, store, bad_test[:1] + bad_other[:1])
    assert_same(df, trials)

    h = read_skipping(read_history, store, bad_test[1:], study="test",
                      filters=(pads.field("stage") == "stage2"), columns=["trial_id", "retention_prob"])
    assert list(h.columns) == ["trial_id", "retention_prob"] and len(h) == 3 and set(h["trial_id"]) == {mac.trial_id}
    wanted = history[(history["study"] == "test") & (history["stage"] == "stage2")][["trial_id", "retention_prob"]]
    assert_same(h, wanted)

    assert read_skipping(completed_trial_ids, store, bad_test[:1], study="test") == {vanilla.trial_id, mac.trial_id}
    ids = [vanilla.trial_id, FOREIGN, other.trial_id]
    df = read_skipping(read_finished, store, bad_test[:1], study="test", trial_ids=ids)
    assert df["trial_id"].tolist() == [vanilla.trial_id]


def test_compatible_subset_is_read(store: Path, expected: tuple[pd.DataFrame, pd.DataFrame]):
    """A file with some of the store's columns, of compatible types, is read; the others are null."""
    subset = pa.table({"trial_id": [FOREIGN], "status": ["ok"], "seed": pa.array([7], pa.int32()), "extra": [1.0]})
    pq.write_table(subset, store / "trials" / "study=test" / f"{FOREIGN}.parquet")
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)
        df = read_trials(store)
        assert FOREIGN in completed_trial_ids(store, "test")
    row = df[df["trial_id"] == FOREIGN].iloc[0]
    assert row["seed"] == 7 and row["status"] == "ok" and pd.isna(row["test_ece"]) and "extra" not in df.columns
    # its nulls make the other rows' integer columns float in pandas; the values are the same
    assert_same(df[df["trial_id"] != FOREIGN], expected[0], check_dtype=False)


def test_corrupt_trial_counts_as_not_completed_and_is_replaced(store: Path, results: list[TrialResult],
                                                               expected: tuple[pd.DataFrame, pd.DataFrame]):
    vanilla = results[0]
    for kind in ("trials", "history"):
        path = store / kind / "study=test" / f"{vanilla.trial_id}.parquet"
        path.write_bytes(path.read_bytes()[:-10])
    path = store / "trials" / "study=test" / f"{vanilla.trial_id}.parquet"
    assert read_skipping(completed_trial_ids, store, [str(path)], study="test") == {results[1].trial_id}
    with pytest.warns(StoreWarning, match=re.escape(str(path))):
        assert write_result(store, vanilla) == str(path)
    assert pq.read_schema(path).names == trial_schema().names
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)
        trials, history = read_trials(store), read_history(store)
    # the re-written files hold the same rows as before the corruption
    assert_same(trials, expected[0])
    assert_same(history, expected[1])


def test_bad_column_or_filter_is_still_an_error(store: Path):
    (store / "trials" / "study=test" / "notes.txt").write_bytes(b"notes")
    with pytest.raises(pa.ArrowInvalid, match="nope"):
        read_trials(store, columns=["trial_id", "nope"])
    with pytest.raises(pa.ArrowInvalid, match="nope"):
        read_trials(store, filters=pads.field("nope") == 1)


def test_bad_files_on_s3(s3, results: list[TrialResult], expected: tuple[pd.DataFrame, pd.DataFrame]):
    bucket, _ = s3
    prefix = f"results-{uuid.uuid4().hex}"
    store = f"s3://{bucket}/{prefix}"
    client = boto3.client("s3")
    for r in results:
        write_result(store, r)
    mac = results[1]
    for kind in ("trials", "history"):
        ok = client.get_object(Bucket=bucket, Key=f"{prefix}/{kind}/study=test/{mac.trial_id}.parquet")["Body"].read()
        planted = {f"{prefix}/{kind}/study=test/{FOREIGN}.parquet": ok[: len(ok) // 2],
                   f"{prefix}/{kind}/study=test/notes.txt": b"notes",
                   f"{prefix}/{kind}/study=test/{'e' * 16}.parquet": parquet_bytes(
                       pa.table({"trial_id": ["e" * 16], "seed": ["x"]}))}
        for key, data in planted.items():
            client.put_object(Bucket=bucket, Key=key, Body=data)
    reasons = {f"{FOREIGN}.parquet": "corrupt or not a Parquet file", "notes.txt": "not a Parquet file of the store",
               f"{'e' * 16}.parquet": "column 'seed' is string, the store has int64"}
    paths = {kind: {f"{store}/{kind}/study=test/{name}": reason for name, reason in reasons.items()}
             for kind in ("trials", "history")}
    assert_same(read_skipping(read_trials, store, paths["trials"]), expected[0])
    assert_same(read_skipping(read_history, store, paths["history"]), expected[1])
    df = read_skipping(read_trials, store, paths["trials"], study="test",
                       filters=pads.field("method") == "mac_cal", columns=["trial_id", "test_ece"])
    assert df["trial_id"].tolist() == [mac.trial_id]
    assert df["test_ece"].iloc[0] == pytest.approx(mac.metrics["test_ece"])
    assert read_skipping(completed_trial_ids, store, paths["trials"], study="test") == {
        r.trial_id for r in results[:2]}
    assert read_skipping(read_trials, store, [], study="other")["trial_id"].tolist() == [results[2].trial_id]
