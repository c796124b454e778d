"""The Parquet store: typed schema, atomic one-file-per-trial writes, ok trials never rewritten."""

import datetime as dt
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from trial_fixtures import tiny_config

from calib._config import ConfigError
from calib.config import parse_trial_config
from calib.store import (
    completed_trial_ids,
    read_history,
    read_trials,
    trial_columns,
    trial_schema,
    validate_study_name,
    write_result,
)
from calib.trial import TrialResult, run_trial


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("trials")
    return [run_trial(tiny_config(root, method=m, seed=s)) for s in (1, 2)
            for m in ({"name": "vanilla"}, {"name": "mac_cal", "accuracy_weight": 0.9})]


def test_round_trip_with_pandas(results, tmp_path):
    for r in results:
        write_result(tmp_path, r)
    df = pd.read_parquet(tmp_path / "trials")  # what the README tells users to run
    assert len(df) == 4 and set(df["study"].astype(str)) == {"test"}
    assert set(df.columns) == {c for c, _, _ in trial_columns()} | {"study"}
    mac = df[df["method"] == "mac_cal"]
    assert mac["method_accuracy_weight"].tolist() == [0.9, 0.9]
    assert df[df["method"] == "vanilla"]["method_accuracy_weight"].isna().all()
    assert df["stage1_epochs"].dtype == "int64" and df["test_ece"].dtype == "float64"
    assert list(df["stage1_milestones"].iloc[0]) == []
    by_id = {r.trial_id: r for r in results}
    for _, row in df.iterrows():
        assert row["test_ece"] == pytest.approx(by_id[row["trial_id"]].metrics["test_ece"])
    history = pd.read_parquet(tmp_path / "history")
    assert len(history) == sum(len(r.history) for r in results)
    assert history[history["stage"] == "stage2"]["retention_prob"].notna().all()


def test_every_file_has_the_full_schema(results, tmp_path):
    path = Path(write_result(tmp_path, results[0]))
    assert [(f.name, f.type) for f in pq.read_schema(path)] == [(f.name, f.type) for f in trial_schema()]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]


def test_reader_filters(results, tmp_path):
    for r in results:
        write_result(tmp_path, r)
    df = read_trials(tmp_path, study="test", filters=pads.field("method") == "mac_cal")
    assert len(df) == 2
    assert read_trials(tmp_path, study="other").empty
    assert read_trials(tmp_path / "missing").empty
    h = read_history(tmp_path, filters=(pads.field("stage") == "stage2"), columns=["trial_id", "retention_prob"])
    assert list(h.columns) == ["trial_id", "retention_prob"] and len(h) == 2 * 3
    assert completed_trial_ids(tmp_path, "test") == {r.trial_id for r in results}


def test_ok_trial_is_never_rewritten(results, tmp_path):
    path = Path(write_result(tmp_path, results[0]))
    stamp = path.stat().st_mtime_ns
    write_result(tmp_path, results[0])
    assert path.stat().st_mtime_ns == stamp


def test_failed_trial_is_replaced_by_its_rerun(results, tmp_path):
    ok = results[1]
    failed = TrialResult.failed(ok.config, RuntimeError("boom"), dt.datetime.now(dt.timezone.utc))
    write_result(tmp_path, failed)
    df = read_trials(tmp_path)
    assert df["status"].tolist() == ["failed"] and "RuntimeError: boom" in df["error"].iloc[0]
    assert completed_trial_ids(tmp_path, "test") == set()
    write_result(tmp_path, ok)
    df = read_trials(tmp_path)
    assert df["status"].tolist() == ["ok"] and df["error"].isna().all()


def test_hidden_temporary_files_are_invisible(results, tmp_path):
    write_result(tmp_path, results[0])
    partial = tmp_path / "trials" / "study=test" / ".abc.parquet.123.tmp"
    partial.write_bytes(b"PAR1 half a file")
    assert len(read_trials(tmp_path)) == 1


def test_study_names(results):
    assert validate_study_name("sensitivity_gamma-2.v1") == "sensitivity_gamma-2.v1"
    for bad in ["", "../x", "a/b", "x y", ".hidden"]:
        with pytest.raises(ConfigError, match="`study` must start with a letter or digit"):
            validate_study_name(bad)


def test_history_schema_types():
    from calib.store import history_schema

    schema = history_schema()
    assert schema.field("epoch").type == pa.int64() and schema.field("retention_prob").type == pa.float64()


def test_trial_config_is_stored_as_json(results, tmp_path):
    import json

    write_result(tmp_path, results[1])
    row = read_trials(tmp_path).iloc[0]
    assert parse_trial_config(json.loads(row["config_json"])) == results[1].config


def test_read_finished_keeps_this_runs_ok_trials(results, tmp_path):
    for r in results:
        write_result(tmp_path, r)
    failed = TrialResult.failed(results[0].config, RuntimeError("x"), dt.datetime.now(dt.timezone.utc))
    failed.trial_id = "f" * 16
    write_result(tmp_path, failed)
    from calib.store import read_finished

    ids = [results[0].trial_id, results[1].trial_id, failed.trial_id, "0" * 16]
    df = read_finished(tmp_path, "test", ids)
    assert sorted(df["trial_id"]) == sorted(ids[:2])
