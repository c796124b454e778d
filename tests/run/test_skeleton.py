"""``TuneRun``, the steps every grid and search takes around its Tuner (calib/run/skeleton.py): their order, what
is checked before Ray starts, and a signal's stop turned into the run's last line. Ray itself is not started: the
steps that would start it are recorded instead (the studies' tests run it for real)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from trial_fixtures import tiny_config

import calib.run.skeleton as skeleton
import calib.tracking
from calib._config import ConfigError
from calib.config import parse_trial_config
from calib.run import ExecutionOptions, StudyInterrupted, TuneRun
from calib.store.manifest import StudyChangedError, check_manifest, manifest_of


def manifest(tmp_path, epochs: int = 2) -> dict:
    return manifest_of([parse_trial_config(tiny_config(tmp_path, method={"name": "vanilla"}, seed=1, epochs=epochs))])


@pytest.fixture
def steps(monkeypatch) -> list:
    """What the run did, in order: Ray started (its address), a cluster waited for, the store compacted."""
    done: list = []
    monkeypatch.setattr(skeleton, "init_ray", lambda address: done.append(("init_ray", address)))
    monkeypatch.setattr(skeleton, "wait_for_resources", lambda options: done.append("wait_for_resources"))
    monkeypatch.setattr(skeleton, "compact_study_store",
                        lambda store, study, verbose: done.append(("compact", study, verbose)))
    return done


def test_fit_starts_ray_records_the_manifest_then_runs_the_tuner_and_compacts(tmp_path, steps):
    store = tmp_path / "results"
    run = TuneRun(store, "s", ExecutionOptions(verbose=False))
    assert run.store == str(store) and run.check(manifest(tmp_path)) is run.options
    check_manifest(store, "s", manifest(tmp_path, epochs=3))  # checked, not recorded: nothing is stored yet

    class Tuner:
        def fit(self) -> None:
            steps.append("fit")
            with pytest.raises(StudyChangedError):  # recorded before the first trial runs
                check_manifest(store, "s", manifest(tmp_path, epochs=3))

    def make_tuner():
        steps.append("make_tuner")
        return Tuner(), None

    assert run.fit(make_tuner, 2, after_fit=lambda: steps.append("after_fit")) is None
    assert steps == [("init_ray", None), "make_tuner", "fit", "after_fit", ("compact", "s", False)]
    run.stop_if_interrupted(None, 2, 2)  # no signal: nothing to raise
    assert run.seconds > 0


def test_on_a_cluster_it_waits_for_a_node_that_fits_each_trial(tmp_path, steps, monkeypatch):
    monkeypatch.setattr(skeleton, "check_address", lambda address: steps.append(("check_address", address)))
    run = TuneRun(tmp_path / "results", "s", ExecutionOptions(address="10.0.0.1:6379", verbose=True))
    run.check(manifest(tmp_path))
    run.fit(lambda: (type("Tuner", (), {"fit": lambda self: steps.append("fit")})(), None), 1)
    assert steps == [("check_address", "10.0.0.1:6379"), ("init_ray", "10.0.0.1:6379"), "wait_for_resources", "fit",
                     ("compact", "s", True)]


def test_a_bad_address_is_refused_before_the_store_is_touched(tmp_path, steps):
    store = tmp_path / "results"
    run = TuneRun(store, "s", ExecutionOptions(address="no-port"))
    with pytest.raises(ConfigError, match=r"`--address` must be 'auto', HOST:PORT .* got --address='no-port'"):
        run.check(manifest(tmp_path))
    assert not store.exists() and steps == []
    with pytest.raises(RuntimeError, match=r"TuneRun\.fit before TuneRun\.check"):
        run.fit(lambda: pytest.fail("a Tuner was built"), 1)


def test_the_trackers_start_for_a_run_and_never_for_check_only(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(calib.tracking, "start_study",
                        lambda log_to, study, store: started.append((log_to, study, store)) or "settings")
    checked = TuneRun(tmp_path / "results", "s", ExecutionOptions(log_to=("mlflow",), check_only=True))
    assert checked.check(manifest(tmp_path)).tracking is None and started == []
    run = TuneRun(tmp_path / "results", "s", ExecutionOptions(log_to=("mlflow",)))
    options = run.check(manifest(tmp_path))
    assert options.tracking == "settings" and run.options is options
    assert started == [(("mlflow",), "s", str(tmp_path / "results"))]


def test_a_signal_during_fit_is_returned_after_the_store_is_compacted_and_ends_the_run(tmp_path, steps, monkeypatch,
                                                                                      capsys):
    monkeypatch.setattr("calib.run.stopping._exit_when_ray_is_gone", lambda *args: None)
    run = TuneRun(tmp_path / "results", "s", ExecutionOptions(verbose=False))
    run.check(manifest(tmp_path))
    tune_stops = []

    class Tuner:
        def fit(self) -> None:  # Tune's graceful stop is its SIGUSR1 handler
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            steps.append("fit")

    previous_usr1 = signal.signal(signal.SIGUSR1, lambda *_: tune_stops.append(True))
    try:
        stopped_by = run.fit(lambda: (Tuner(), None), 3)
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)
    assert stopped_by == "SIGTERM" and tune_stops == [True]
    assert steps == [("init_ray", None), "fit", ("compact", "s", False)]
    with pytest.raises(StudyInterrupted) as raised:
        run.stop_if_interrupted(stopped_by, 1, 3)
    assert str(raised.value).startswith("[s] interrupted by SIGTERM: 1 of the 3 trials of this run are in the store;")
