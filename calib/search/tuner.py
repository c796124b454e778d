"""What grids and searches share on the driver: the run's summary, Tune's run config, the callback that
turns Tune's trial events into the progress display and stores the trials a scheduler pruned, and the
compaction of the study's store while it runs and when it ends."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow.dataset as pads

from calib import storage
from calib.config import parse_trial_config
from calib.search.display import ProgressDisplay
from calib.search.events import EventFeed
from calib.search.execution import ExecutionOptions
from calib.store import completed_trial_ids, write_result
from calib.trial import TrialResult, trial_id

__all__ = ["INTERRUPTED_EXIT_CODE", "CheckedOnly", "StudyInterrupted", "StudyRun", "compact_study_store",
           "compaction_callback", "progress_callback", "run_config", "stoppable", "trial_dirname"]

INTERRUPTED_EXIT_CODE = 3
"""A study's exit code when a signal stopped it before its trials ended (2 is bad input, 1 failed trials)."""


class StudyInterrupted(Exception):
    """A run that SIGTERM stopped before its trials ended; the message says how far it got."""


class CheckedOnly(Exception):
    """``--check-only``: the run's configs, resources and store were checked; the message says what would run."""

    def __init__(self, study: str, pending: int) -> None:
        super().__init__(f"[{study}] checked: {pending} trials to run; nothing was started (--check-only)")


@contextlib.contextmanager
def stoppable(study: str, pending: int, display: ProgressDisplay | None = None) -> Iterator[dict[str, Any]]:
    """Around ``tuner.fit()``: SIGTERM (a scheduler's time-limit warning or preemption, ``scancel``) stops
    the run cleanly through Ray Tune's own graceful stop (its SIGUSR1 handler: running trials end, their
    Stage-I handover state stays for the next run). The yielded dict gets ``"signal"`` when that happened;
    a SIGTERM before Tune listens raises :class:`StudyInterrupted` at once. When the signal stopped Ray's
    head as well (a preempted or requeued Slurm job signals every process of its nodes), Tune cannot end
    the trials: the driver then says so and exits with :data:`INTERRUPTED_EXIT_CODE` within seconds, not
    when the scheduler kills it. Main thread only."""
    state: dict[str, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    ended = threading.Event()
    said = threading.Lock()  # held once the stopping line is out: by the first of the handler and the listener

    def say_stopping(signal_name: str) -> None:
        if said.acquire(blocking=False):
            _write_now(stopping_message(study, signal_name))

    def on_sigterm(signum: int, frame: Any) -> None:
        if "signal" in state:  # already stopping (a scheduler and the job script may both send it)
            return
        state["signal"] = signal.Signals(signum).name
        if display is not None:
            display.interrupted = state["signal"]
        if callable(signal.getsignal(signal.SIGUSR1)):  # Tune's handler: it stops the run and returns
            say_stopping(state["signal"])
            os.kill(os.getpid(), signal.SIGUSR1)
            threading.Thread(target=_exit_when_ray_is_gone, args=(study, state["signal"], ended), daemon=True,
                             name="ray-head-watch").start()
        else:
            raise StudyInterrupted(f"[{study}] interrupted by {state['signal']} before any of its {pending} trials "
                                   f"started; run the same command again to run them")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    listening = _listen_for_sigterm(say_stopping)
    try:
        yield state
    finally:
        ended.set()  # the run ended on its own: the watcher stops
        listening()
        signal.signal(signal.SIGTERM, previous)


def _listen_for_sigterm(say_stopping: Callable[[str], None]) -> Callable[[], None]:
    """The stopping line written from a thread the moment SIGTERM arrives; the returned function stops it.

    Python runs a signal handler only in the main thread, and only once that thread is back in the interpreter:
    inside Ray's blocking calls that is up to a second later. By then Slurm's SIGTERM to the job's every process
    may have ended this node's raylet, and Ray's core worker ends this process without a word. CPython's C-level
    handler writes each signal's number to the wakeup file descriptor at once, in any thread's state; a thread
    reading it says the line. Where something else already owns the wakeup descriptor, only the handler says it."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        previous = None
    if previous != -1:
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
        return lambda: None

    def listen() -> None:
        with open(read_end, "rb", buffering=0) as wakeups:
            while received := wakeups.read(64):
                if signal.SIGTERM in received and callable(signal.getsignal(signal.SIGUSR1)):  # Tune listens
                    say_stopping(signal.SIGTERM.name)

    thread = threading.Thread(target=listen, daemon=True, name="sigterm-listener")
    thread.start()

    def stop() -> None:
        signal.set_wakeup_fd(-1)
        os.close(write_end)  # the listener reads the end of the pipe and returns
        thread.join(timeout=5)

    return stop


RAY_HEAD_CHECKS = 3
"""Failed connections to Ray's head, :data:`RAY_HEAD_CHECK_SECONDS` apart, after which a stopping driver gives
up on it: about 1.5 s after the head ended, well inside a scheduler's ``KillWait`` (often 10 to 30 s)."""
RAY_HEAD_CHECK_SECONDS = 0.5


def _exit_when_ray_is_gone(study: str, signal_name: str, ended: threading.Event) -> None:
    """After a stop signal: end this process (exit 3, one line) once Ray's head stops answering, unless
    the run ends first (``ended``)."""
    import socket

    import ray

    try:
        host, port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
    except Exception:  # Ray not started by this process: nothing to watch
        return
    failures = 0
    while failures < RAY_HEAD_CHECKS:
        if ended.wait(RAY_HEAD_CHECK_SECONDS):
            return
        try:
            socket.create_connection((host, int(port)), timeout=2.0).close()
            failures = 0
        except OSError:
            failures += 1
    if ended.is_set():
        return
    print(f"[{study}] interrupted by {signal_name}, which stopped Ray's head too (a preemption, a requeue or "
          f"scancel stops every process of a job): the running trials could not end cleanly; run the same command "
          f"again to continue (finished trials are skipped, a Stage I being trained continues from its last "
          f"handover state)", flush=True)
    os._exit(INTERRUPTED_EXIT_CODE)


def _write_now(line: str) -> None:
    """``line`` on standard output from a signal handler: straight to its file descriptor where it has one (the
    progress lines before it are flushed as they are written)."""
    try:
        os.write(sys.stdout.fileno(), f"{line}\n".encode())
    except (AttributeError, OSError, ValueError):  # a stream without a descriptor (a test's capture)
        print(line, flush=True)


def stopping_message(study: str, signal_name: str) -> str:
    """The line a driver writes the moment a stop signal reaches it during a run."""
    return (f"[{study}] interrupted by {signal_name}: stopping the running trials (each keeps its Stage-I "
            f"handover state); run the same command again to continue")


def interrupted_message(study: str, signal_name: str, stored: int, pending: int) -> str:
    return (f"[{study}] interrupted by {signal_name}: {stored} of the {pending} trials of this run are in the "
            f"store; run the same command again to continue (finished trials are skipped, a Stage I being "
            f"trained continues from its last handover state)")


@dataclass
class StudyRun:
    """What a call scheduled: trial ids in order, how many were skipped as already stored, failures."""

    trial_ids: list[str] = field(default_factory=list)
    skipped: int = 0
    failed: int = 0
    seconds: float = 0.0


def _failure_line(store: str, study: str, calib_id: str, trial: Any) -> str:
    """What a failed trial died of, in one line: its stored row's stage, epoch and first error line,
    or, when the trial could not store a row (its worker was killed), the first line of Ray's error."""
    from calib.store import read_trials

    rows = read_trials(store, study=study, columns=["error", "failed_stage", "failed_epoch"],
                       filters=(pads.field("trial_id") == calib_id) & (pads.field("status") == "failed"))
    if not rows.empty:
        row = rows.iloc[0]
        where = "" if pd.isna(row["failed_stage"]) else f"in {row['failed_stage']}"
        where += "" if pd.isna(row["failed_epoch"]) else f" at epoch {int(row['failed_epoch'])}"
        return (f"{where.strip()}: " if where else "") + str(row["error"]).strip().splitlines()[0]
    error = None
    path = getattr(trial, "pickled_error_file", None)  # Tune writes it locally before calling back
    if path and os.path.exists(path):
        import cloudpickle

        with open(path, "rb") as f:
            error = cloudpickle.load(f)
    cause = getattr(error, "cause", None) or error
    if cause is None:
        return "no error recorded"
    return f"{type(cause).__name__}: {cause}".strip().splitlines()[0]


WORKER_DEATH_GRACE_SECONDS = 1.0
"""How long the driver waits before it reports a trial whose worker process died: a SIGTERM that ends a
whole job (a preemption, a requeue, scancel) kills the workers a moment before it reaches the driver, and
their trials are then stopped, not failed."""


def _worker_died(trial: Any) -> bool:
    """Whether ``trial`` ended because its worker process died (Ray's actor error), not of its own error."""
    from ray.exceptions import RayActorError

    path = getattr(trial, "pickled_error_file", None)
    if not path or not os.path.exists(path):
        return False
    import cloudpickle

    try:
        with open(path, "rb") as f:
            error = cloudpickle.load(f)
    except Exception:
        return False
    return isinstance(getattr(error, "cause", None) or error, RayActorError)


def _store_pruned(store: str, config: dict[str, Any], result: dict[str, Any]) -> str:
    """Store a trial that a scheduler stopped during Stage I as a ``pruned`` row; returns its id."""
    cfg = parse_trial_config(config)
    started = result.get("calib_started_at")
    epoch = result.get("stage1_epoch")
    pruned = TrialResult.pruned(
        cfg, epoch=None if epoch is None else int(epoch),
        metrics={k.removeprefix("stage1_"): float(v) for k, v in result.items()
                 if k.startswith("stage1_val_") and isinstance(v, (int, float))},
        started_at=dt.datetime.fromisoformat(started) if started else dt.datetime.now(dt.timezone.utc),
    )
    write_result(store, pruned)
    return pruned.trial_id


def progress_callback(display: ProgressDisplay | None, configs_of: Callable[[dict[str, Any]], list[dict[str, Any]]],
                       store: str, study: str, max_failures: int) -> Any:
    """A Tune callback that stores the trials a scheduler pruned and feeds Tune's trial events, and the
    trials' Stage-I waits and takeovers (:mod:`calib.search.events`), to ``display`` (None: store only);
    ``configs_of(trial.config)`` are the trial configs a Tune trial runs, whose rows in ``store`` say what
    a failed one died of."""
    from ray import tune

    def failed(trial: Any, config: dict[str, Any]) -> tuple[str, str]:
        calib_id = trial_id(config)
        return calib_id, _failure_line(store, study, calib_id, trial)

    class ProgressCallback(tune.Callback):
        feed: EventFeed | None = None

        def setup(self, **info: Any) -> None:
            if display:
                try:
                    self.feed = EventFeed()
                except Exception as err:  # the run goes on; waits are then reported when their trial ends
                    display.note(f"Stage-I waits will show when their trial ends: no mailbox for them "
                                 f"({type(err).__name__}: {err})")

        def _show(self, events: list[dict[str, Any]]) -> None:
            for event in events:
                display.stage1_event(event["trial"], event["kind"], event["label"], event["message"])

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            if display:
                display.trial_started(trial.trial_id, len(configs_of(trial.config)))

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            result = trial.last_result or {}
            if "calib_results" not in result:  # stopped before its final report: a scheduler pruned it
                for config in configs_of(trial.config):
                    _store_pruned(store, config, result)
                if display:
                    display.trial_pruned(trial.trial_id)
                return
            if not display:
                return
            for note in filter(None, str(result.get("calib_notes", "")).splitlines()):
                display.note(note)
            for config, summary in zip(configs_of(trial.config), json.loads(result["calib_results"]), strict=True):
                if summary.get("degenerate_fit"):
                    display.degenerate_fit(summary["degenerate_fit"])
                if summary["status"] == "ok":
                    display.trial_finished(trial.trial_id, summary["calib_trial_id"], summary.get(display.objective))
                else:
                    display.trial_failed(trial.trial_id, *failed(trial, config))

        def _grace(self, trial: Any) -> None:
            if display.interrupted is None and _worker_died(trial):
                time.sleep(WORKER_DEATH_GRACE_SECONDS)  # the signal handler runs meanwhile, if one is coming

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            if not display:
                return
            self._grace(trial)
            configs = configs_of(trial.config)
            done = completed_trial_ids(store, study, trial_ids=[trial_id(c) for c in configs])
            for config in configs:
                if trial_id(config) not in done:
                    display.trial_failed(trial.trial_id, *failed(trial, config))
                else:
                    display.trial_finished(trial.trial_id, trial_id(config), None)

        def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            if display:
                self._grace(trial)
                if display.interrupted:  # no retry comes: the run is stopping
                    return
                calib_id, line = failed(trial, configs_of(trial.config)[0])
                display.trial_retrying(trial.trial_id, calib_id, trial.run_metadata.num_failures, max_failures, line)

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            if display:
                if self.feed is not None:
                    self._show(self.feed.poll())
                display.tick()

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            if display:
                if self.feed is not None:  # the last events; briefly when a signal is stopping the run
                    self._show(self.feed.drain(timeout=0.5 if display.interrupted else 5.0))
                display.close()

    return ProgressCallback()


END_OF_RUN_WAIT_SECONDS = 120.0
"""How long the end-of-run compaction waits for another process's compaction of the study to end."""


def compact_study_store(store: str, study: str, *, verbose: bool, wait_seconds: float = END_OF_RUN_WAIT_SECONDS
                        ) -> None:
    """Compact ``study`` in ``store`` (:func:`calib.store.compaction.compact`); a failure is reported in one
    line and never fails the study: every row stays readable in its own file."""
    from calib.store.compaction import compact

    try:
        (report,) = compact(store, [study], wait_seconds=wait_seconds)
    except Exception as err:
        print(f"[{study}] compaction failed ({type(err).__name__}: {err}); the rows stay in their own files "
              f"and are read as they are: run `python -m calib.store compact --store {store} --study {study}` "
              f"later", flush=True)
        return
    if verbose and (report.skipped or report.trials_moved or report.parts_merged):
        print(report.line(), flush=True)


def compaction_callback(store: str, study: str, every: int) -> Any:
    """A Tune callback that compacts ``study`` in a background thread of the driver: when the run starts
    (what an earlier, killed run left) and every ``every`` finished trials (0: never during the run).
    One compaction at a time; Tune's loop never waits for one, except at the end of the run for the last."""
    from ray import tune

    class CompactionCallback(tune.Callback):
        def __init__(self) -> None:
            self._thread: threading.Thread | None = None
            self._finished = self._at_last = 0

        def _start(self) -> None:
            if self._thread is not None and self._thread.is_alive():
                return
            self._at_last = self._finished
            self._thread = threading.Thread(target=compact_study_store, args=(store, study),
                                            kwargs={"verbose": False, "wait_seconds": 0.0},
                                            name=f"compact-{study}", daemon=True)
            self._thread.start()

        def setup(self, **info: Any) -> None:
            self._start()

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._finished += len(json.loads((trial.last_result or {}).get("calib_results", "[0]")))
            if every and self._finished - self._at_last >= every:
                self._start()

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            if self._thread is not None:
                self._thread.join()

    return CompactionCallback()


def trial_dirname(trial: Any) -> str:
    return trial.trial_id


def run_config(store: str, study: str, options: ExecutionOptions, callbacks: list) -> Any:
    from ray import tune

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return tune.RunConfig(
        name=f"{study}-{stamp}",
        storage_path=options.storage or storage.join(store, "_ray"),
        verbose=0,
        callbacks=[*callbacks, compaction_callback(store, study, options.compact_every)],
        failure_config=tune.FailureConfig(max_failures=options.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
    )
