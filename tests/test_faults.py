"""Fault behaviour end to end, on the quick setup: failing trials, retries from checkpoints, killed
drivers, concurrent studies, changed configs, corrupt store files and bad input."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from in_process import run_refused, run_report, run_study, study_module

from calib.store import StoreWarning, read_trials

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--epochs", "2", "--stage2-epochs", "2"]


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

    from calib.run.runtime import init_ray

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
    from calib.run import run_grid
    from calib.run.execution import ExecutionOptions
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
            "--max-failures", "2", "--max-concurrent", "1", "--checkpoint-min-seconds", "0"]
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
    # The retry took the dead trial's Stage-I claim over, and the study's own output said so as it happened.
    (takeover,) = [line for line in out.splitlines() if "takes it over" in line]
    assert takeover.startswith(f"[sensitivity_gamma] trial {trainer['trial_id']}: Stage I {trainer['stage1_id']}: "
                               f"its holder "), out[-3000:]
    assert takeover.endswith(f"is a process of this host that is gone; this trial ({trainer['stage1_writer']}) "
                             f"takes it over")
    history = pd.read_parquet(store / "history")
    stage1 = history[(history["trial_id"] == trainer["trial_id"]) & (history["stage"] == "stage1")]
    assert sorted(stage1["epoch"]) == list(range(30)), "every epoch once, none repeated by the retry"


@pytest.mark.ray
def test_a_study_stopped_by_sigterm_hands_its_stage1_over_and_releases_the_claim(tmp_path):
    """A clean stop while a Stage I trains: its state at the end of the current epoch is handed over (not the
    one saved every 300 s) and its claim deleted before the study exits 3, so the next run takes it at once
    (tests/store/test_stage1_claims.py shows that run continuing to the uninterrupted model)."""
    import torch

    store = tmp_path / "results"
    args = ["--store", str(store), "--seeds", "1", "--gammas", "0.9", "--epochs", "5000", "--stage2-epochs", "2"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "studies" / "sensitivity_gamma.py"), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "CALIB_STAGE1_HANDOVER_SECONDS": "300"})
    stage1 = store / "artifacts" / "stage1"
    try:
        deadline = time.monotonic() + 240
        while not list(stage1.glob("*.claim")):
            assert proc.poll() is None and time.monotonic() < deadline, "no Stage-I claim appeared"
            time.sleep(0.2)
        time.sleep(2.0)  # a few epochs into the training
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill_session(proc)
    assert proc.returncode == 3, out[-3000:]
    assert "[sensitivity_gamma] 1 of 1 Stage-I training handed over" in out, out[-3000:]
    assert "its training is handed over after epoch" in out and "its claim released" in out
    assert not list(stage1.glob("*.claim")), "the claim was released: the next run need not wait out its lease"
    (handover,) = stage1.glob("*.handover.pt")
    assert torch.load(handover, weights_only=False)["epoch"] >= 0


# ---------------------------------------------------------------------------------- killed drivers


@pytest.mark.ray
def test_killed_driver_resumes_without_duplicates(tmp_path):
    store = tmp_path / "results"
    # One config per Ray trial: a population writes its rows within milliseconds, too fast to kill between.
    args = ["--store", str(store), "--seeds", "1", "2", "--gammas", "0.8", "0.9", "1.0", "--epochs", "4",
            "--stage2-epochs", "3", "--configs-per-trial", "1"]
    total = 2 * 4
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

    kept = read_trials(store, columns=["trial_id", "status", "finished_at"]).set_index("trial_id")
    kept = kept[kept["status"] == "ok"]
    resumed = run_study("sensitivity_gamma.py", *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{total} trials: {len(kept)} already in the store, {total - len(kept)} to run" in resumed.stdout
    df = pd.read_parquet(store / "trials")
    assert len(df) == total and df["trial_id"].is_unique and (df["status"] == "ok").all()
    finished = df.set_index("trial_id")["finished_at"]
    assert (finished[kept.index] == kept["finished_at"]).all(), "finished trials are never run or written again"
    history = pd.read_parquet(store / "history")
    assert history["trial_id"].nunique() == total
    assert not history.duplicated(["trial_id", "stage", "epoch"]).any()
    # the run ended with a compaction: every row is in a part (the killed run's trials are compacted when the
    # re-run starts, the others when it ends), no trial keeps its own file
    assert {p.name.startswith("part-") for p in trial_files(store, "sensitivity_gamma")} == {True}
    assert not list(store.rglob(".*.tmp")), "no temporary file is left visible"


def test_sigterm_becomes_tunes_graceful_stop_once_and_before_tune_an_immediate_interruption(monkeypatch, capfd):
    """``stoppable`` around ``tuner.fit()``: end to end (a study stopped by SIGTERM, exit 3, continued by
    its next run) in tests/cluster/test_slurm.py, where the job script sends it."""
    import io

    from calib.run.display import ProgressDisplay
    from calib.run.stopping import StudyInterrupted, stoppable

    watchers = []
    monkeypatch.setattr("calib.run.stopping._exit_when_ray_is_gone", lambda *args: watchers.append(args))
    before = signal.getsignal(signal.SIGTERM)
    previous_usr1 = signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # Tune has not installed its handler yet
    try:
        with pytest.raises(StudyInterrupted, match=r"^\[s\] interrupted by SIGTERM before any of its 3 trials "
                                                   r"started; run the same command again to run them$"):
            with stoppable("s", 3):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)
    assert signal.getsignal(signal.SIGTERM) is before and not watchers

    tune_stops = []
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda *_: tune_stops.append(time.monotonic()))
    display = ProgressDisplay("s", 3, "val_ece", stream=io.StringIO(), interactive=False)
    try:
        with stoppable("s", 3, display) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's and the job script's: one stop
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)
    assert stop == {"signal": "SIGTERM"} and len(tune_stops) == 1 and display.interrupted == "SIGTERM"
    # said at once, once: Ray may end the process before the run's own last line (tests/cluster/test_slurm.py)
    assert capfd.readouterr().out.splitlines() == [
        "[s] interrupted by SIGTERM: stopping the running trials (each keeps its Stage-I handover state); run the "
        "same command again to continue"]
    assert signal.getsignal(signal.SIGTERM) is before
    (study, signal_name, ended), = watchers
    assert (study, signal_name) == ("s", "SIGTERM") and ended.is_set()  # the run ended: its watcher stops


def test_ctrl_c_stops_the_run_as_sigterm_does_and_a_second_one_ends_the_driver(monkeypatch, capfd):
    """SIGINT is the same clean stop (Tune's own SIGINT handler, which would count the unfinished trials as failed,
    is off); a second Ctrl-C raises KeyboardInterrupt at once."""
    import calib.run.runtime  # noqa: F401  (sets TUNE_DISABLE_SIGINT_HANDLER, as every study's driver does)
    from calib.run.stopping import stoppable

    assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1"
    monkeypatch.setattr("calib.run.stopping._exit_when_ray_is_gone", lambda *args: None)
    before = signal.getsignal(signal.SIGINT)
    tune_stops = []
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda *_: tune_stops.append(time.monotonic()))
    try:
        with pytest.raises(KeyboardInterrupt):
            with stoppable("s", 3) as stop:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                assert stop == {"signal": "SIGINT"} and len(tune_stops) == 1
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)
    assert len(tune_stops) == 1 and signal.getsignal(signal.SIGINT) is before
    assert capfd.readouterr().out.splitlines() == [
        "[s] interrupted by SIGINT: stopping the running trials (each keeps its Stage-I handover state); run the "
        "same command again to continue"]


def test_the_stopping_line_is_out_while_the_main_thread_is_in_c_code_and_before_the_process_is_killed():
    """Slurm's SIGTERM reaches Ray's processes too: Ray's core worker may end the driver while its main thread
    waits inside Ray's C code, before Python runs the handler there. The line must be out by then. Here the main
    thread blocks SIGTERM and sleeps in libc (as inside Ray), and the process is killed 5 s after the signal."""
    code = ("import ctypes, signal\n"
            "from calib.run.stopping import stoppable\n"
            "signal.signal(signal.SIGUSR1, lambda *_: None)\n"  # Tune's handler: the run is listening
            "with stoppable('s', 3):\n"
            "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
            "    print('waiting in C', flush=True)\n"
            "    ctypes.CDLL(None).sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline() == "waiting in C\n"
        proc.send_signal(signal.SIGTERM)
        said = []
        threading.Thread(target=lambda: said.append(proc.stdout.readline()), daemon=True).start()
        deadline = time.monotonic() + 5
        while not said and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    assert said == ["[s] interrupted by SIGTERM: stopping the running trials (each keeps its Stage-I handover "
                    "state); run the same command again to continue\n"]


def test_a_stopping_driver_whose_ray_head_is_gone_says_so_and_exits_3():
    """Slurm's SIGTERM on preemption or requeue reaches Ray's head too: Tune cannot end the trials, so the
    driver must not hang until the scheduler kills it."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on: the head is gone
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = ("import threading, types, ray\n"
            f"ray.get_runtime_context = lambda: types.SimpleNamespace(gcs_address='127.0.0.1:{port}')\n"
            "from calib.run.stopping import _exit_when_ray_is_gone\n"
            "ended = threading.Event()\n"
            "threading.Timer(0.5, ended.set).start()\n"
            "_exit_when_ray_is_gone('s', 'SIGTERM', ended)\n"  # the run ended first: no exit
            "print('returned')\n"
            "_exit_when_ray_is_gone('s', 'SIGTERM', threading.Event())\n"
            "print('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.splitlines() == [
        "returned",
        "[s] interrupted by SIGTERM, which stopped Ray's head too (a preemption, a requeue or scancel stops every "
        "process of a job): the running trials could not end cleanly; run the same command again to continue "
        "(finished trials are skipped, a Stage I being trained continues from its last handover state)"]


def test_check_only_checks_and_counts_without_starting_ray(tmp_path, monkeypatch, capsys):
    import calib.run.skeleton as skeleton  # where every grid and search starts Ray (TuneRun.fit)

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started by --check-only")

    monkeypatch.setattr(skeleton, "init_ray", no_ray)
    main = study_module("sensitivity_gamma.py").main
    store = tmp_path / "results"
    code = main(["--store", str(store), "--seeds", "1", "2", "--gammas", "0.9", *TINY, "--check-only"])
    out = capsys.readouterr().out
    assert code == 0 and out.strip().splitlines()[-1] == (
        "[sensitivity_gamma] checked: 4 trials to run; nothing was started (--check-only)")
    assert sorted(p.name for p in store.rglob("*")) == [], "--check-only wrote to the store"
    code = main(["--store", str(store), "--seeds", "1", "2", "--gammas", "0", *TINY, "--check-only"])
    assert code == 2 and "`method.accuracy_weight` must be > 0" in capsys.readouterr().err


def test_a_study_returns_checked_only_and_guarded_main_prints_it_and_exits_0(capsys):
    """``--check-only`` is a return value (``run_grid``/``run_search`` return it, the study's ``main`` returns it);
    ``guarded_main`` prints its line and exits 0, passes other codes on, and turns bad input into exit 2."""
    from calib._config import ConfigError
    from calib.exit_codes import ExitCode
    from calib.run import CheckedOnly
    from calib.study.main import guarded_main

    assert guarded_main(lambda argv: CheckedOnly("s", 4))([]) == ExitCode.OK == 0
    assert capsys.readouterr().out == "[s] checked: 4 trials to run; nothing was started (--check-only)\n"
    assert guarded_main(lambda argv: ExitCode.FAILED)([]) == 1

    def refused(argv):
        raise ConfigError("`x` must be > 0")

    assert guarded_main(refused)([]) == 2 and capsys.readouterr().err == "error: `x` must be > 0\n"


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
    # Two artifacts, their lock files and their claims' lock files (the claims go once published).
    listing = sorted(p.name for p in (store / "artifacts" / "stage1").iterdir())
    ids = sorted(set(trials["stage1_id"]))
    assert listing == sorted([*ids, *(f"{i}.lock" for i in ids), *(f"{i}.claim.lock" for i in ids)])


# ---------------------------------------------------------------------------------- changed configs


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory) -> tuple[Path, list[str]]:
    """A finished quick γ study (1 seed: vanilla and γ 0.9) and its arguments; tests copy it before changing it."""
    store = tmp_path_factory.mktemp("finished") / "results"
    args = ["--seeds", "1", "--gammas", "0.9", *TINY]
    done = run_study("sensitivity_gamma.py", "--store", str(store), *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return store, args


def copy_of(finished: tuple[Path, list[str]], tmp_path: Path) -> tuple[Path, list[str]]:
    store, args = finished
    shutil.copytree(store, tmp_path / "results")
    return tmp_path / "results", ["--store", str(tmp_path / "results"), *args]


@pytest.mark.ray
def test_a_changed_study_is_refused_and_a_new_study_name_runs(finished_study, tmp_path):
    # That more seeds, rows and γ values extend a study is checked without Ray in tests/store/test_manifest.py.
    store, _ = copy_of(finished_study, tmp_path)
    files = {p: p.stat().st_mtime_ns for p in store.rglob("*.parquet")}

    changed = run_study("sensitivity_gamma.py", "--store", str(store), "--seeds", "1", "--gammas", "0.9",
                    "--epochs", "3", "--stage2-epochs", "2")
    assert changed.returncode == 2
    assert "stage1.epochs: 2 → 3" in changed.stderr and "Traceback" not in changed.stderr
    assert {p: p.stat().st_mtime_ns for p in store.rglob("*.parquet")} == files, "the store is untouched"
    new_name = re.search(r"--study (\S+)$", changed.stderr.strip()).group(1)  # the name the refusal gives
    assert new_name.startswith("sensitivity_gamma--epochs-3")

    renamed = run_study("sensitivity_gamma.py", "--store", str(store), "--seeds", "1", "--gammas", "0.9",
                    "--epochs", "3", "--stage2-epochs", "2", "--study", new_name)
    assert renamed.returncode == 0, renamed.stderr[-2000:]
    studies = pd.read_parquet(store / "trials").groupby("study", observed=True).size().to_dict()
    assert studies == {new_name: 2, "sensitivity_gamma": 2}


# A changed search space is refused: tests/studies/test_study_output.py (after its failing-trial search).


# ---------------------------------------------------------------------------------- corrupt artifacts
# (every kind of bad artifact file, locally and on S3, is in tests/core/test_artifact_integrity.py and
# tests/store/test_artifact_integrity_s3.py)


@pytest.mark.ray
def test_a_truncated_stage1_cache_is_moved_aside_and_rebuilt_by_the_study(finished_study, tmp_path):
    """The issue's case: a truncated cache.pt failed every trial that used it, in every later run."""
    store, args = copy_of(finished_study, tmp_path)
    (artifact,) = [p for p in (store / "artifacts" / "stage1").iterdir() if p.is_dir()]
    cache = artifact / "cache.pt"
    cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])
    truncated = cache.read_bytes()

    rerun = run_study("sensitivity_gamma.py", *[a if a != "0.9" else "0.7" for a in args])
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    (quarantined,) = (store / "artifacts" / "quarantine").iterdir()
    assert (quarantined / "cache.pt").read_bytes() == truncated, "the bad file is kept, not deleted"
    notes = [line for line in rerun.stdout.splitlines() if "failed its check" in line]
    assert len(notes) == 1 and f"moved it to {quarantined}" in notes[0], rerun.stdout
    trials = pd.read_parquet(store / "trials")
    new = trials[trials["method_accuracy_weight"] == 0.7]
    assert new["status"].tolist() == ["ok"] and not new["stage1_cache_hit"].item()


# ---------------------------------------------------------------------------------- corrupt store files
# (every kind of bad file, locally and on S3, is in tests/store/test_store_corrupt.py)


@pytest.mark.ray
def test_corrupt_and_foreign_files_are_skipped_with_a_warning_and_rerun(finished_study, tmp_path):
    store, args = copy_of(finished_study, tmp_path)
    (part,) = trial_files(store, "sensitivity_gamma")  # the finished study's rows, compacted into one part
    part.write_bytes(part.read_bytes()[:100])
    foreign = store / "trials" / "study=sensitivity_gamma" / "notes.txt"
    foreign.write_text("not a trial")

    report = run_report("--store", str(store))
    assert report.returncode == 0, report.stderr[-2000:]
    assert f"skipped {part}" in report.stderr and f"skipped {foreign}" in report.stderr

    rerun = run_study("sensitivity_gamma.py", *args)
    assert rerun.returncode == 0 and "2 trials: 0 already in the store, 2 to run" in rerun.stdout
    with pytest.warns(StoreWarning, match=re.escape(f"skipped {part}")):  # left as it was, for its owner to see
        trials = read_trials(store)
    assert trials["status"].tolist() == ["ok", "ok"] and part.stat().st_size == 100


# ---------------------------------------------------------------------------------- bad input
# Each case is a study command line as a user types it. A few run as real subprocesses; the rest call the
# study's ``main(argv)`` in this process (the same function, wrapped by ``calib.study.main.guarded_main``), with
# Ray's start replaced by a failure so a mistakenly accepted input fails fast instead of training.

SHORT = ["--epochs", "2", "--stage2-epochs", "2"]  # a mistakenly accepted input must not run long

MAC_CAL = "base: {method.name: mac_cal}\nparameters:\n"
SPACES = {
    "q0_low_0": MAC_CAL + "  method.retention_init: {distribution: uniform, low: 0, high: 1.0}\n",
    "q0_high_1.5": MAC_CAL + "  method.retention_init: {distribution: uniform, low: 0.5, high: 1.5}\n",
    "gamma_low_negative": MAC_CAL + "  method.accuracy_weight: {distribution: uniform, low: -0.5, high: 1.0}\n",
    "theta0_choice_negative": MAC_CAL + "  method.clip_init: {distribution: categorical, choices: [0.05, -0.1]}\n",
    "width_low_0": MAC_CAL + "  method.bottleneck_width: {distribution: int, low: 0, high: 64}\n",
    "stage2_epochs_negative": MAC_CAL + "  method.epochs: {distribution: int, low: -1, high: 5}\n",
    "mixup_alpha_0": "base: {method: {name: vanilla}}\nparameters:\n"
                     "  stage1.mixup_alpha: {distribution: uniform, low: 0.0, high: 1.0}\n",
    "stage1_epochs_0": "base: {method: {name: vanilla}, stage1.epochs: 0}\nparameters:\n"
                       "  stage1.mixup_alpha: {distribution: uniform, low: 0.1, high: 1.0}\n",
    "gaussian": MAC_CAL + "  method.accuracy_weight: {distribution: gaussian, mean: 0.9, std: 0.05}\n",
    "malformed": "base: {method.name: mac_cal\nparameters:\n"
                 "  method.accuracy_weight: {distribution: uniform, low: 0.8, high: 1.0}\n",
    "not_a_field": MAC_CAL + "  method.acuracy_weight: {distribution: uniform, low: 0.8, high: 1.0}\n",
    "no_choices": MAC_CAL + "  stage1.mixup_alpha: {distribution: categorical, choices: []}\n",
    "int_float_bound": MAC_CAL + "  method.bottleneck_width: {distribution: int, low: 0.5, high: 64}\n",
    "method_foo": "base: {method.name: foo}\nparameters:\n"
                  "  method.accuracy_weight: {distribution: uniform, low: 0.8, high: 1.0}\n",
    "loss_focall": "base: {loss.name: focall, method: {name: vanilla}}\nparameters:\n"
                   "  loss.gamma: {distribution: uniform, low: 0.5, high: 5.0}\n",
    "not_a_mapping": "- method.accuracy_weight\n- 0.9\n",
    "seed_2_32": MAC_CAL + "  seed: {distribution: grid, values: [1, 4294967296]}\n",
    "train_size_5": MAC_CAL + "  stage1.train_size: {distribution: int, low: 5, high: 100}\n",
}
LADDERS = {
    "q0_1.5": "baseline: {name: Vanilla, set: {method: {name: vanilla}}}\ncomponents:\n"
              "  - {name: +MaC-Cal, set: {method: {name: mac_cal, retention_init: 1.5}}}\n",
    "width_0": "baseline: {name: Vanilla, set: {method: {name: vanilla}}}\ncomponents:\n"
               "  - {name: +MaC-Cal, set: {method: {name: mac_cal}}}\n"
               "  - {name: +narrow, set: {method.bottleneck_width: 0}}\n",
    "method_foo": "baseline: {name: Vanilla, set: {method: {name: vanilla}}}\ncomponents:\n"
                  "  - {name: +Foo, set: {method: {name: foo}}}\n",
    "malformed": "baseline: {name: Vanilla, set: {method: {name: vanilla}}\ncomponents: [\n",
}

# (id, script, argv with {tmp} for the test's directory, regex the error must match)
CASES = [
    # MaC-Cal's hyperparameters from the study flags
    ("gamma_negative", "sensitivity_gamma.py", ["--gammas", "-1"],
     r"`method\.accuracy_weight` must be > 0 \(it is γ\), got method\.accuracy_weight=-1\.0"),
    ("gamma_zero", "sensitivity_gamma.py", ["--gammas", "0.9", "0"],
     r"`method\.accuracy_weight` must be > 0 \(it is γ\), got method\.accuracy_weight=0\.0"),
    ("gamma_nan", "sensitivity_gamma.py", ["--gammas", "nan"],
     r"`method\.accuracy_weight` must be (a finite number|> 0).*got method\.accuracy_weight=nan"),
    ("mixup_alpha_zero", "mixup_alpha.py", ["--alphas", "0"],
     r"`stage1\.mixup_alpha` must be > 0, or null to train without Mixup, got stage1\.mixup_alpha=0\.0"),
    ("mixup_alpha_negative", "mixup_alpha.py", ["--alphas", "0.2", "-0.5"],
     r"`stage1\.mixup_alpha` must be > 0.*got stage1\.mixup_alpha=-0\.5"),
    ("compact_every_negative", "sensitivity_gamma.py", ["--compact-every", "-5"],
     r"`--compact-every` must be >= 0 \(finished trials; 0: compact only at the end\), got -5"),
    ("tpe_window_negative", "search.py", ["--space", "search_spaces/mac_cal_head.yaml", "--tpe-window", "-1"],
     r"--tpe-window must be >= 0 \(finished trials; 0: all\), got -1"),
    # epochs: Stage I and Stage II, negative and zero
    ("epochs_negative", "sensitivity_gamma.py", ["--epochs", "-3", "--stage2-epochs", "2"],
     r"`(--epochs|stage1\.epochs)` must be an integer >= 1.*got (--epochs|stage1\.epochs)=-3"),
    ("epochs_zero", "compare_methods.py", ["--epochs", "0", "--stage2-epochs", "2", "--methods", "Vanilla (CE)"],
     r"`(--epochs|stage1\.epochs)` must be an integer >= 1.*got (--epochs|stage1\.epochs)=0"),
    ("stage2_epochs_negative", "sensitivity_gamma.py", ["--epochs", "2", "--stage2-epochs", "-1"],
     r"`(--stage2-epochs|method\.epochs)` must be an integer >= 1.*got (--stage2-epochs|method\.epochs)=-1"),
    ("stage2_epochs_zero_tst", "compare_methods.py", ["--epochs", "2", "--stage2-epochs", "0", "--methods", "TST"],
     r"`(--stage2-epochs|method\.epochs)` must be an integer >= 1.*got (--stage2-epochs|method\.epochs)=0"),
    ("stage2_epochs_zero_vtst", "compare_methods.py", ["--epochs", "2", "--stage2-epochs", "0", "--methods", "V-TST"],
     r"`(--stage2-epochs|method\.epochs)` must be an integer >= 1.*got (--stage2-epochs|method\.epochs)=0"),
    # a study whose methods have no Stage II must not ignore a negative --stage2-epochs
    ("stage2_epochs_negative_ts_only", "compare_methods.py",
     ["--epochs", "2", "--stage2-epochs", "-1", "--methods", "CE+TS"],
     r"`--stage2-epochs` must be an integer >= 1.*got --stage2-epochs=-1"),
    ("seed_negative", "sensitivity_gamma.py", ["--seeds", "-1"],
     r"`--seeds` must be integers with 0 <= seed < 2\*\*32 = 4294967296 \(NumPy's seeding takes no other\), "
     r"got --seeds=-1\."),
    # unknown names list the valid ones
    ("dataset_unknown", "sensitivity_gamma.py", ["--datasets", "cifar11"],
     r"Unknown dataset 'cifar11'\. Did you mean 'cifar10'.*Valid dataset names: .*cifar10, cifar100"),
    ("arch_unknown", "sensitivity_gamma.py", ["--archs", "resnet51"],
     r"Unknown architecture 'resnet51'\..*Valid architecture names: .*resnet50"),
    ("method_row_unknown", "compare_methods.py", ["--methods", "Foo"],
     r"argument --methods: invalid choice: 'Foo' \(choose from .*'MaC-Cal'"),
    ("loss_row_unknown", "combine.py", ["--losses", "focall"],
     r"argument --losses: invalid choice: 'focall' \(choose from .*'FL'"),
    ("ablation_mode_unknown", "ablation.py", ["--mode", "foo"],
     r"argument --mode: invalid choice: 'foo' \(choose from .*'incremental'"),
    # a missing dataset
    ("dataset_missing", "sensitivity_gamma.py", ["--datasets", "cifar10"],
     r"CIFAR-10 not found: expected the directory .*cifar-10-batches-py.* Pass --download"),
    # search-space files
    ("space_q0_low_0", "search.py", ["--space", "{tmp}/q0_low_0.yaml"],
     r"q0_low_0\.yaml: parameter `method\.retention_init` .*low=0.*must be in \(0, 1\].*"
     r"got method\.retention_init=0\.0"),
    ("space_q0_high_1.5", "search.py", ["--space", "{tmp}/q0_high_1.5.yaml"],
     r"parameter `method\.retention_init` .*high=1\.5.*must be in \(0, 1\].*got method\.retention_init=1\.5"),
    ("space_gamma_negative", "search.py", ["--space", "{tmp}/gamma_low_negative.yaml"],
     r"parameter `method\.accuracy_weight` .*must be > 0 \(it is γ\), got method\.accuracy_weight=-0\.5"),
    ("space_theta0_negative", "search.py", ["--space", "{tmp}/theta0_choice_negative.yaml"],
     r"parameter `method\.clip_init` .*choice -0\.1.*must be >= 0 \(it is θ_0\), got method\.clip_init=-0\.1"),
    ("space_width_0", "search.py", ["--space", "{tmp}/width_low_0.yaml"],
     r"parameter `method\.bottleneck_width` .*must be an integer >= 1, got method\.bottleneck_width=0"),
    ("space_stage2_epochs_negative", "search.py", ["--space", "{tmp}/stage2_epochs_negative.yaml"],
     r"parameter `method\.epochs` .*must be an integer >= 1, got method\.epochs=-1"),
    ("space_mixup_alpha_0", "search.py", ["--space", "{tmp}/mixup_alpha_0.yaml"],
     r"parameter `stage1\.mixup_alpha` .*must be > 0, or null to train without Mixup, got stage1\.mixup_alpha=0\.0"),
    ("space_stage1_epochs_0", "search.py", ["--space", "{tmp}/stage1_epochs_0.yaml"],
     r"`stage1\.epochs` must be an integer >= 1, got stage1\.epochs=0"),
    ("space_unknown_distribution", "search.py", ["--space", "{tmp}/gaussian.yaml"],
     r"gaussian\.yaml: parameter `method\.accuracy_weight` has unknown distribution 'gaussian'; "
     r"allowed: categorical, grid, int, loguniform, uniform"),
    ("space_malformed_yaml", "search.py", ["--space", "{tmp}/malformed.yaml"],
     r"malformed\.yaml: not valid YAML: expected ',' or '\}', but got ':' at line 2, column \d+"),
    ("space_not_a_field", "search.py", ["--space", "{tmp}/not_a_field.yaml"],
     r"Unknown key 'method\.acuracy_weight' for MacCalConfig\. Valid keys: .*Did you mean 'method\.accuracy_weight'"),
    ("space_no_choices", "search.py", ["--space", "{tmp}/no_choices.yaml"],
     r"parameter `stage1\.mixup_alpha` \(categorical\) needs a non-empty list of choices, got choices=\[\]"),
    ("space_int_float_bound", "search.py", ["--space", "{tmp}/int_float_bound.yaml"],
     r"parameter `method\.bottleneck_width` \(int\): `low` must be an integer, got low=0\.5"),
    ("space_method_unknown", "search.py", ["--space", "{tmp}/method_foo.yaml"],
     r"Unknown method 'foo'\. Valid method names: bbq, .*mac_cal, .*vanilla"),
    ("space_loss_unknown", "search.py", ["--space", "{tmp}/loss_focall.yaml"],
     r"Unknown loss 'focall'\. Did you mean 'focal'.*Valid loss names: .*cross_entropy"),
    ("space_not_a_mapping", "search.py", ["--space", "{tmp}/not_a_mapping.yaml"],
     r"a search space must be a mapping with a `parameters` key"),
    ("space_missing_file", "search.py", ["--space", "{tmp}/nope.yaml"],
     r"Search space file not found: '.*nope\.yaml'"),
    # ablation ladders
    ("ladder_q0_1.5", "ablation.py", ["--ladder", "{tmp}/q0_1.5.yaml"],
     r"'\+MaC-Cal'.*`method\.retention_init` must be in \(0, 1\].*got method\.retention_init=1\.5"),
    ("ladder_width_0", "ablation.py", ["--ladder", "{tmp}/width_0.yaml"],
     r"'\+narrow'.*`method\.bottleneck_width` must be an integer >= 1, got method\.bottleneck_width=0"),
    ("ladder_method_unknown", "ablation.py", ["--ladder", "{tmp}/method_foo.yaml"],
     r"'\+Foo'.*Unknown method 'foo'\. Valid method names: bbq, .*mac_cal"),
    ("ladder_malformed_yaml", "ablation.py", ["--ladder", "{tmp}/malformed.yaml"],
     r"malformed\.yaml: not valid YAML: .* at line \d+, column \d+"),
    ("ladder_missing_file", "ablation.py", ["--ladder", "{tmp}/nope.yaml"], r"Ladder file not found: '.*nope\.yaml'"),
    # where results go and which Ray cluster runs them
    ("store_under_a_file", "sensitivity_gamma.py", ["--store", "{tmp}/file.txt/results"],
     r"The result store .*/file\.txt/results is not writable"),
    ("store_read_only_fs", "sensitivity_gamma.py", ["--store", "/proc/calib-results"],  # procfs refuses even root
     r"The result store /proc/calib-results is not writable"),
    ("address_malformed", "sensitivity_gamma.py", ["--address", "not-an-address"], r"must be 'auto', HOST:PORT"),
    ("address_port_out_of_range", "sensitivity_gamma.py", ["--address", "ray://127.0.0.1:99999"],
     r"must be 'auto', HOST:PORT.*got --address='ray://127\.0\.0\.1:99999' \(the port must be 1-65535, got 99999\)"),
    ("address_nothing_answers", "sensitivity_gamma.py", ["--address", "127.0.0.1:1"],
     r"Nothing answers at --address='127\.0\.0\.1:1'"),
    # resources no node could grant (Ray would keep the trial pending forever) and GPUs the trials would not see
    ("gpus_per_trial_no_gpu", "sensitivity_gamma.py", ["--gpus-per-trial", "1"],
     r"`--gpus-per-trial` asks for 1 GPU per Stage-I trial, but this machine has 0 GPUs \(torch sees no CUDA "
     r"device\).*use at most 0 \(--gpus-per-trial 0\), or --address"),
    ("gpus_per_cached_trial_no_gpu", "compare_methods.py", ["--gpus-per-cached-trial", "1", "--methods", "CE+TS"],
     r"`--gpus-per-cached-trial` asks for 1 GPU per trial on a trained Stage I, but this machine has 0 GPUs"),
    ("gpus_per_trial_fraction", "sensitivity_gamma.py", ["--gpus-per-trial", "1.5"],
     r"`--gpus-per-trial` must be at most 1 \(a share of one GPU\) or a whole number of GPUs.*"
     r"got --gpus-per-trial=1\.5\. Use 1 or 2\."),
    ("gpus_per_trial_fraction_cluster", "ablation.py", ["--gpus-per-trial", "2.5", "--address", "auto"],
     r"`--gpus-per-trial` must be at most 1 .*got --gpus-per-trial=2\.5\. Use 2 or 3\."),
    ("cpus_per_trial_too_many", "sensitivity_gamma.py", ["--cpus-per-trial", "4096"],
     r"`--cpus-per-trial` asks for 4096 CPUs per Stage-I trial, but this machine has \d+ CPUs.*"
     r"use at most \d+ \(--cpus-per-trial \d+\)"),
    ("device_cuda_no_gpu", "compare_methods.py", ["--device", "cuda", "--methods", "Vanilla (CE)", "CE+TS"],
     r"`--device cuda` needs a CUDA GPU, but torch sees none on this machine: use --device cpu or auto"),
    ("device_cuda_index_no_gpu", "search.py", ["--device", "cuda:1", "--space", str(ROOT / "search_spaces" /
                                                                                   "mac_cal.yaml")],
     r"`--device cuda:1` needs a CUDA GPU, but torch sees none on this machine"),
    ("device_cuda_cluster_no_gpus", "sensitivity_gamma.py", ["--device", "cuda", "--address", "auto"],
     r"`--device cuda` needs a GPU in every trial, but --gpus-per-trial is 0 \(the quick preset's\): on a cluster "
     r"a Stage-I trial that asks Ray for no GPU may run on a node without one"),
    # a data root that is not a directory
    ("data_root_a_file", "sensitivity_gamma.py", ["--data-root", "{tmp}/file.txt", "--download"],
     r"`--data-root` must be a directory \(it holds the datasets\), but .*/file\.txt is a file"),
    ("data_root_under_a_file", "compare_methods.py", ["--data-root", "{tmp}/file.txt/data", "--methods", "CE+TS"],
     r"`--data-root` must be a directory .*/file\.txt/data lies under the file .*/file\.txt"),
    # seeds outside what NumPy's seeding takes
    ("seed_too_large", "sensitivity_gamma.py", ["--seeds", "99999999999999999999"],
     r"`--seeds` must be integers with 0 <= seed < 2\*\*32 = 4294967296 .*got --seeds=99999999999999999999\."),
    ("seed_2_32", "compare_methods.py", ["--seeds", "1", "4294967296", "--methods", "Vanilla (CE)"],
     r"`--seeds` must be integers with 0 <= seed < 2\*\*32 .*got --seeds=4294967296\."),
    ("space_seed_2_32", "search.py", ["--space", "{tmp}/seed_2_32.yaml"],
     r"seed_2_32\.yaml: parameter `seed` \(grid, at value 4294967296\): `seed` must be an integer with "
     r"0 <= seed < 2\*\*32"),
    ("sampler_seed_too_large", "search.py", ["--space", str(ROOT / "search_spaces" / "mac_cal.yaml"),
                                             "--sampler-seed", "4294967296"],
     r"--sampler-seed must be an integer with 0 <= seed < 2\*\*32 .*got 4294967296"),
    # a training sample that cannot hold every class
    ("train_size_below_classes", "sensitivity_gamma.py", ["--train-size", "5"],
     r"`--train-size` must be at least the 10 classes of digits-noisy \(Stage I trains on a stratified sample that "
     r"holds every class\), got --train-size=5\."),
    ("space_train_size_below_classes", "search.py", ["--space", "{tmp}/train_size_5.yaml"],
     r"`stage1\.train_size` must be at least the 10 classes of digits-noisy .*got stage1\.train_size=5\."),
]
# These run as real command lines (started together when the module's first test starts, so they run
# while the in-process cases do); the rest in-process.
# Your own model and data (studies/calibrate.py, and every study's --checkpoint / --plugin)
OWN = ["--seeds", "1", "--stage2-epochs", "2"]
CASES += [
    ("checkpoint_missing", "calibrate.py",
     ["--checkpoint", "{tmp}/absent.pt", "--archs", "small_cnn", "--datasets", "digits-noisy", *OWN],
     r"`--checkpoint` file not found: '.*absent\.pt'"),
    ("checkpoint_unreadable", "calibrate.py",
     ["--checkpoint", "{tmp}/file.txt", "--archs", "small_cnn", "--datasets", "digits-noisy", *OWN],
     r"file\.txt.*(cannot be loaded|not a checkpoint|could not be read|cannot be read)"),
    ("checkpoint_head_has_other_classes", "calibrate.py",
     ["--checkpoint", "{tmp}/small_cnn_3_classes.pt", "--archs", "small_cnn", "--datasets", "digits-noisy", *OWN],
     r"head\.weight has 3 outputs, the dataset has 10 classes"),
    ("checkpoint_head_not_found", "calibrate.py",
     ["--checkpoint", "{tmp}/small_cnn_3_classes.pt", "--archs", "torchvision:squeezenet1_0", "--datasets",
      "digits-noisy", *OWN],
     r"torchvision:squeezenet1_0.*no nn\.Linear.*--head"),
    ("checkpoint_loss_row", "calibrate.py",
     ["--checkpoint", "{tmp}/small_cnn_10_classes.pt", "--archs", "small_cnn", "--datasets", "digits-noisy",
      "--methods", "FL", *OWN],
     r"`loss`='focal' is a way to train Stage I, but this trial's Stage I comes from a checkpoint file"),
    ("calibrate_without_a_model", "calibrate.py", OWN, r"calibrates a given model: pass --checkpoint FILE"),
    ("checkpoint_and_features", "calibrate.py",
     ["--checkpoint", "{tmp}/small_cnn_10_classes.pt", "--features", "{tmp}/features.pt", *OWN],
     r"`--checkpoint` and `--features` exclude each other"),
    ("features_with_ood", "ood.py", ["--features", "{tmp}/features.pt", *OWN],
     r"`--datasets` and `--archs` do not apply to --features|`ood_datasets` must be empty for a features Stage I|"
     r"No OOD sets are defined for 'features'"),
    ("plugin_fails_to_import", "compare_methods.py", ["--plugin", "{tmp}/broken_plugin.py", *OWN],
     r"The plugin '.*broken_plugin\.py' failed to import: ModuleNotFoundError: No module named "
     r"'a_package_that_is_not_installed' \(.*broken_plugin\.py, line 1\)"),
    ("imagefolder_splits_disagree", "compare_methods.py",
     ["--datasets", "imagefolder", "--data-root", "{tmp}/disagreeing_folder", "--methods", "Vanilla (CE)", *OWN],
     r"ImageFolder splits disagree on the classes: test/ lacks 'c'"),
]

SUBPROCESS = {"gamma_negative", "space_q0_high_1.5", "store_under_a_file", "address_nothing_answers",
              "gpus_per_trial_no_gpu", "device_cuda_no_gpu", "data_root_a_file"}
# These are bad input only on a machine where torch sees no CUDA device (as on CI); skipped elsewhere.
WITHOUT_A_GPU = {"gpus_per_trial_no_gpu", "gpus_per_cached_trial_no_gpu", "device_cuda_no_gpu",
                 "device_cuda_index_no_gpu"}


def runs_here(case: str) -> bool:
    """Whether ``case`` is bad input on this machine."""
    import torch

    return case not in WITHOUT_A_GPU or torch.cuda.device_count() == 0


def case_param(case: tuple, *values: object) -> pytest.param:
    return pytest.param(*values, id=case[0], marks=pytest.mark.skipif(not runs_here(case[0]),
                                                                      reason="bad input only without a GPU"))


def write_inputs(tmp: Path, script: str) -> None:
    for name, text in (LADDERS if script == "ablation.py" else SPACES).items():
        (tmp / f"{name}.yaml").write_text(text)
    (tmp / "file.txt").write_text("not a directory")
    if script in ("calibrate.py", "compare_methods.py", "ood.py"):
        write_own_model_inputs(tmp)


def write_own_model_inputs(tmp: Path) -> None:
    """Checkpoints of small_cnn (3 and 10 classes), a features file, a plugin that fails to import, and an
    ImageFolder tree whose test split lacks a class."""
    import torch
    from PIL import Image

    from calib.models import create_model

    for classes in (3, 10):
        torch.save(create_model("small_cnn", num_classes=classes, in_channels=1).state_dict(),
                   tmp / f"small_cnn_{classes}_classes.pt")
    g = torch.Generator().manual_seed(0)
    torch.save({f"{s}_{k}": v for s in ("train", "val", "test")
                for k, v in (("features", torch.randn(6, 4, generator=g)), ("labels", torch.arange(6) % 3),
                             ("logits", torch.randn(6, 3, generator=g)))}, tmp / "features.pt")
    (tmp / "broken_plugin.py").write_text("import a_package_that_is_not_installed\n")
    for split, classes in (("train", "abc"), ("test", "ab")):
        for name in classes:
            (tmp / "disagreeing_folder" / split / name).mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(tmp / "disagreeing_folder" / split / name / "0.png")


def command(tmp: Path, argv: list[str]) -> list[str]:
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]
    short = [] if {"--epochs", "--stage2-epochs"} & set(argv) else SHORT
    store = [] if "--store" in argv else ["--store", str(tmp / "results")]
    data_root = [] if "--data-root" in argv else ["--data-root", str(tmp / "data")]
    return [*argv, *store, *data_root, *short]


def check_message(stderr: str, message: str) -> None:
    """One `error:` paragraph on stderr, matching ``message``; no traceback."""
    assert "Traceback" not in stderr, stderr
    text = stderr.strip()
    lines = text.splitlines()
    errors = [line for line in lines if re.match(r"^(\S+: )?error: ", line)]
    assert len(errors) == 1, f"expected one error line on stderr, got:\n{stderr}"
    paragraph = text[text.index(errors[0]):]
    assert "\n\n" not in paragraph and paragraph == lines[-1], f"the error is not one paragraph:\n{stderr}"
    if not errors[0].startswith("error: "):  # argparse: usage lines, then "<prog>: error: ..."
        assert "usage:" in text, stderr
    else:
        assert len(lines) == 1, f"stderr holds more than the error:\n{stderr}"
    assert re.search(message, paragraph), f"{message!r} not found in:\n{paragraph}"


@pytest.fixture(scope="module")
def command_lines(tmp_path_factory):
    """Start every real command line at once (each spends seconds importing torch), keyed by case id."""
    started = {}
    for case, script, argv, _ in (c for c in CASES if c[0] in SUBPROCESS and runs_here(c[0])):
        tmp = tmp_path_factory.mktemp(case)
        write_inputs(tmp, script)
        env = {**os.environ, "RAY_TMPDIR": str(tmp / "ray")}  # where a Ray started by mistake leaves its files
        started[case] = tmp, subprocess.Popen([sys.executable, f"studies/{script}", *command(tmp, argv)], cwd=ROOT,
                                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield started
    for _, proc in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize(("script", "argv", "message"),
                         [case_param(c, *c[1:]) for c in CASES if c[0] not in SUBPROCESS])
def test_bad_input_in_process(tmp_path, monkeypatch, capsys, script, argv, message):
    write_inputs(tmp_path, script)
    argv = command(tmp_path, argv)
    code, stderr = run_refused(script, argv, monkeypatch, capsys)
    assert code == 2, stderr
    check_message(stderr, message)
    assert not Path(argv[argv.index("--store") + 1]).exists(), "the store was created"


@pytest.mark.parametrize(("case", "message"), [case_param(c, c[0], c[3]) for c in CASES if c[0] in SUBPROCESS])
def test_bad_input_command_line(command_lines, case, message):
    tmp, proc = command_lines[case]
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{' '.join(proc.args)} still runs after 120 s: the bad input was accepted")
    assert proc.returncode == 2, stderr
    check_message(stderr, message)
    assert not Path(proc.args[proc.args.index("--store") + 1]).exists(), "the store was created"
    assert not (tmp / "ray").exists(), "Ray was started"
