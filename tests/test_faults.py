"""Fault behaviour end to end, on the quick setup: failing trials, retries from checkpoints, killed
drivers, concurrent studies, changed configs, corrupt store files and bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--epochs", "2", "--stage2-epochs", "2"]


def study(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """A study run exactly as a user types it."""
    return subprocess.run([sys.executable, str(ROOT / "studies" / script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def trial_files(store: Path, name: str) -> list[Path]:
    folder = store / "trials" / f"study={name}"
    return sorted(folder.glob("*.parquet")) if folder.exists() else []


def session_processes(sid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process in session ``sid``."""
    out = subprocess.run(["ps", "-e", "-o", "sid=,pid=,args="], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()]
    return [(int(r[1]), r[2] if len(r) > 2 else "") for r in rows if len(r) >= 2 and r[0] == str(sid)]


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the driver's process group (the driver and the local Ray it started) and wait for all of it."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert session_processes(proc.pid) == []


# ---------------------------------------------------------------------------------- failing trials


@pytest.fixture(scope="module")
def ray_session():
    import ray

    from calib.search.tune import init_ray

    init_ray()
    yield
    ray.shutdown()


def tiny(tmp_path: Path, **changes) -> dict:
    from trial_fixtures import tiny_config

    config = tiny_config(tmp_path, study="faults", epochs=3, method={"name": "vanilla"})
    for section, values in changes.items():
        config[section] = {**config[section], **values}
    return config


@pytest.mark.ray
def test_diverging_and_out_of_memory_trials_are_failed_rows_with_their_epoch(ray_session, tmp_path):
    from calib.search import run_grid
    from calib.search.tune import ExecutionOptions
    from calib.store import read_trials

    ok = tiny(tmp_path)
    # lr 1e6 without clipping: the summed loss overflows within the first epochs.
    diverging = tiny(tmp_path, stage1={"lr": 1e6, "grad_clip": None, "loss_reduction": "sum"})
    # A bottleneck of 2^40 units cannot be allocated: the CPU allocator's out-of-memory error.
    oom = tiny(tmp_path, method={"name": "mac_cal", "bottleneck_width": 2**40, "epochs": 2})
    store = tmp_path / "results"
    run = run_grid([ok, diverging, oom], store=store, study="faults", options=ExecutionOptions(verbose=False))
    assert run.failed == 2
    rows = read_trials(store, study="faults").set_index("stage1_lr")
    assert rows.loc[0.1].query("method == 'vanilla'")["status"].item() == "ok"
    failed = rows.loc[1e6]
    assert failed["status"] == "failed" and "FloatingPointError" in failed["error"]
    assert failed["failed_stage"] == "stage1" and 0 <= failed["failed_epoch"] <= 2
    assert f"at epoch {int(failed['failed_epoch'])}" in failed["error"]
    memory = rows.loc[0.1].query("method == 'mac_cal'").iloc[0]
    assert memory["status"] == "failed" and "allocate" in memory["error"]
    assert memory["failed_stage"] == "stage2" and memory["failed_epoch"] == 0


@pytest.mark.ray
def test_a_killed_trial_is_retried_from_its_last_stage1_checkpoint(tmp_path):
    store = tmp_path / "results"
    args = ["--store", str(store), "--seeds", "1", "--gammas", "0.9", "--epochs", "30", "--stage2-epochs", "2",
            "--max-failures", "2", "--max-concurrent", "1"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "studies" / "sensitivity_gamma.py"), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list((store / "_ray").glob("*/*/checkpoint_*")):
            assert proc.poll() is None and time.monotonic() < deadline, "no Stage-I checkpoint appeared"
            time.sleep(0.2)
        time.sleep(1.0)  # a few more epochs past the first checkpoint
        workers = [pid for pid, args in session_processes(proc.pid) if "ImplicitFunc" in args]
        assert len(workers) == 1, session_processes(proc.pid)
        os.kill(workers[0], signal.SIGKILL)  # the trial's worker dies mid-training, the driver survives
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            kill_session(proc)
    assert proc.returncode == 0, out[-3000:]
    trials = pd.read_parquet(store / "trials")
    assert len(trials) == 2 and (trials["status"] == "ok").all() and trials["trial_id"].is_unique
    trainer = trials[~trials["stage1_cache_hit"]].iloc[0]
    assert 0 <= trainer["stage1_resumed_from_epoch"] < 29, "the retry resumed from a checkpoint, not from scratch"
    history = pd.read_parquet(store / "history")
    stage1 = history[(history["trial_id"] == trainer["trial_id"]) & (history["stage"] == "stage1")]
    assert sorted(stage1["epoch"]) == list(range(30)), "every epoch once, none repeated by the retry"


# ---------------------------------------------------------------------------------- killed drivers


@pytest.mark.ray
def test_killed_driver_resumes_without_duplicates(tmp_path):
    store = tmp_path / "results"
    args = ["--store", str(store), "--seeds", "1", "2", "3", "--gammas", "0.8", "0.85", "0.9", "0.95", "1.0",
            "--epochs", "4", "--stage2-epochs", "3"]
    total = 3 * 6
    proc = subprocess.Popen([sys.executable, str(ROOT / "studies" / "sensitivity_gamma.py"), *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(trial_files(store, "sensitivity_gamma")) < 3 and time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail("the study finished before it could be killed")
            time.sleep(0.2)
        assert 3 <= len(trial_files(store, "sensitivity_gamma")) < total
    finally:
        kill_session(proc)  # every Ray process of that session goes too

    kept = {p: p.stat().st_mtime_ns for p in trial_files(store, "sensitivity_gamma")}
    resumed = study("sensitivity_gamma.py", *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{total} trials: {len(kept)} already in the store, {total - len(kept)} to run" in resumed.stdout
    df = pd.read_parquet(store / "trials")
    assert len(df) == total and df["trial_id"].is_unique and (df["status"] == "ok").all()
    assert all(p.stat().st_mtime_ns == m for p, m in kept.items()), "finished trials are never rewritten"
    history = pd.read_parquet(store / "history")
    assert history["trial_id"].nunique() == total
    assert not history.duplicated(["trial_id", "stage", "epoch"]).any()
    assert not list(store.rglob(".*.tmp")), "no temporary file is left visible"


# ---------------------------------------------------------------------------------- concurrent studies


@pytest.mark.ray
def test_two_studies_write_one_store_at_the_same_time(tmp_path):
    store = tmp_path / "results"
    common = ["--store", str(store), "--seeds", "1", "2", *TINY]
    runs = [
        [sys.executable, str(ROOT / "studies" / "sensitivity_gamma.py"), *common, "--gammas", "0.9"],
        [sys.executable, str(ROOT / "studies" / "compare_methods.py"), *common, "--methods", "Vanilla (CE)",
         "CE+TS", "MaC-Cal"],
    ]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd in runs]
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outputs]
    trials = pd.read_parquet(store / "trials")
    assert trials.groupby("study", observed=True).size().to_dict() == {"compare_methods": 6, "sensitivity_gamma": 4}
    assert (trials["status"] == "ok").all()
    assert not trials.duplicated(["study", "trial_id"]).any()
    # Both studies use the same CE Stage I per seed: trained once in all, whichever driver got there first.
    assert (~trials["stage1_cache_hit"]).sum() == 2
    assert len(list((store / "artifacts" / "stage1").iterdir())) == 2 + 2  # two artifacts and their lock files


# ---------------------------------------------------------------------------------- changed configs


@pytest.mark.ray
def test_a_changed_study_is_refused_and_a_new_study_name_runs(tmp_path):
    store = tmp_path / "results"
    args = ["--store", str(store), "--seeds", "1", "--gammas", "0.9", *TINY]
    assert study("sensitivity_gamma.py", *args).returncode == 0
    files = {p: p.stat().st_mtime_ns for p in store.rglob("*.parquet")}

    changed = study("sensitivity_gamma.py", "--store", str(store), "--seeds", "1", "--gammas", "0.9",
                    "--epochs", "3", "--stage2-epochs", "2")
    assert changed.returncode == 2
    assert "stage1.epochs: 2 → 3" in changed.stderr and "--study NEW_NAME" in changed.stderr
    assert "Traceback" not in changed.stderr
    assert {p: p.stat().st_mtime_ns for p in store.rglob("*.parquet")} == files, "the store is untouched"

    extended = study("sensitivity_gamma.py", *args[:3], "1", "2", "--gammas", "0.9", "0.95", *TINY)
    assert extended.returncode == 0, "more seeds and γ values extend the study"
    renamed = study("sensitivity_gamma.py", "--store", str(store), "--seeds", "1", "--gammas", "0.9",
                    "--epochs", "3", "--stage2-epochs", "2", "--study", "gamma_3_epochs")
    assert renamed.returncode == 0, renamed.stderr[-2000:]


@pytest.mark.ray
def test_a_changed_search_space_is_refused(tmp_path):
    store = tmp_path / "results"
    space = tmp_path / "space.yaml"
    space.write_text("parameters:\n  method.accuracy_weight: {distribution: uniform, low: 0.8, high: 1.0}\n"
                     "base:\n  method.name: mac_cal\n")
    args = ["--space", str(space), "--num-trials", "2", "--store", str(store), "--seeds", "1", *TINY]
    first = study("search.py", *args)
    assert first.returncode == 0, first.stderr[-2000:]
    space.write_text(space.read_text().replace("high: 1.0", "high: 1.2"))
    again = study("search.py", *args)
    assert again.returncode == 2 and "search space" in again.stderr and "--study NEW_NAME" in again.stderr


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("store_kind", ["under_a_file", "read_only_fs"])
def test_an_unwritable_store_exits_2_before_anything_runs(tmp_path, store_kind):
    if store_kind == "under_a_file":
        (tmp_path / "file.txt").write_text("not a directory")
        store = tmp_path / "file.txt" / "results"
    else:
        store = Path("/proc/calib-results")  # procfs refuses new files, even to root
    out = study("sensitivity_gamma.py", "--store", str(store), "--seeds", "1", *TINY)
    assert out.returncode == 2
    assert f"The result store {store} is not writable" in out.stderr and "Traceback" not in out.stderr
    assert not store.exists()


@pytest.mark.parametrize("address, message", [
    ("not-an-address", "must be 'auto', HOST:PORT"),
    ("127.0.0.1:1", "Nothing answers at --address='127.0.0.1:1'"),
    ("ray://127.0.0.1:99999", "must be 'auto', HOST:PORT"),
])
def test_an_invalid_address_exits_2_before_anything_runs(tmp_path, address, message):
    store = tmp_path / "results"
    out = study("sensitivity_gamma.py", "--store", str(store), "--address", address, "--seeds", "1", *TINY,
                timeout=120)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    assert not store.exists()
