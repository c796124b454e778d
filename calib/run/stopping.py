"""Stopping a study cleanly on SIGTERM or SIGINT: :func:`stoppable` around ``tuner.fit()`` turns the signal (a
scheduler's time-limit warning or preemption, ``scancel``, Ctrl-C) into Ray Tune's graceful stop, says so at once
from a thread, and ends the driver when the signal stopped Ray's head too; :class:`StudyInterrupted` carries the
run's last line."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from calib.exit_codes import ExitCode
from calib.run.display import ProgressDisplay
from calib.run.events import hand_over_stage1, release_stopped_claims

__all__ = ["RAY_HEAD_CHECKS", "RAY_HEAD_CHECK_SECONDS", "StudyInterrupted", "interrupted_message", "stoppable",
           "stopping_message"]


class StudyInterrupted(Exception):
    """A run that SIGTERM or SIGINT stopped before its trials ended; the message says how far it got."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop a run cleanly: a scheduler's SIGTERM and Ctrl-C's SIGINT (Tune's own SIGINT handler is
off, ``TUNE_DISABLE_SIGINT_HANDLER`` in :mod:`calib.run.runtime`, so that the run says it was interrupted
rather than counting its unfinished trials as failed)."""



@contextlib.contextmanager
def stoppable(study: str, pending: int, display: ProgressDisplay | None = None) -> Iterator[dict[str, Any]]:
    """Around ``tuner.fit()``: SIGTERM (a scheduler's time-limit warning or preemption, ``scancel``) or SIGINT
    (Ctrl-C; a second one ends the driver at once with ``KeyboardInterrupt``) stops the run cleanly through Ray
    Tune's own graceful stop (its SIGUSR1 handler: running trials end, their Stage-I handover state stays for the
    next run), after the trials that train a Stage I have handed it over at the end of their epoch and released
    their claims (at most ``$CALIB_STAGE1_HANDOVER_WAIT_SECONDS``; the claims of those that could not are deleted
    once Tune has ended them). The yielded dict gets ``"signal"`` when that happened; a SIGTERM before Tune listens
    raises :class:`StudyInterrupted` at once. When the signal stopped Ray's head as well (a preempted or requeued
    Slurm job signals every process of its nodes), Tune cannot end the trials: the driver then says so and exits
    with :attr:`calib.exit_codes.ExitCode.INTERRUPTED` (3) within seconds, not when the scheduler kills it. Main
    thread only."""
    state: dict[str, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    ended = threading.Event()
    said = threading.Lock()  # held once the stopping line is out: by the first of the handler and the listener

    def say_stopping(signal_name: str) -> None:
        if said.acquire(blocking=False):
            _write_now(stopping_message(study, signal_name))

    def on_stop_signal(signum: int, frame: Any) -> None:
        if "signal" in state:  # already stopping (a scheduler and the job script may both send SIGTERM)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        state["signal"] = signal.Signals(signum).name
        if display is not None:
            display.interrupted = state["signal"]
        if callable(signal.getsignal(signal.SIGUSR1)):  # Tune's handler: it stops the run and returns
            say_stopping(state["signal"])
            threading.Thread(target=_hand_over_then_stop, args=(study,), daemon=True, name="stage1-handover").start()
            threading.Thread(target=_exit_when_ray_is_gone, args=(study, state["signal"], ended), daemon=True,
                             name="ray-head-watch").start()
        else:
            raise StudyInterrupted(f"[{study}] interrupted by {state['signal']} before any of its {pending} trials "
                                   f"started; run the same command again to run them")

    previous = {signum: signal.signal(signum, on_stop_signal) for signum in STOP_SIGNALS}
    listening = _listen_for_stop_signals(say_stopping)
    try:
        yield state
    finally:
        ended.set()  # the run ended on its own: the watcher stops
        if "signal" in state and (released := release_stopped_claims()):
            print(f"[{study}] released {released} Stage-I claim{'s' if released > 1 else ''} of trials that ended "
                  f"before they could hand over: the next run takes {'them' if released > 1 else 'it'} at once",
                  flush=True)
        listening()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _hand_over_then_stop(study: str) -> None:
    """Ask the run's trials to hand their Stage-I trainings over (:func:`calib.run.events.hand_over_stage1`,
    bounded), then stop the run through Ray Tune's graceful stop (its SIGUSR1 handler)."""
    if line := hand_over_stage1():
        print(f"[{study}] {line}", flush=True)
    os.kill(os.getpid(), signal.SIGUSR1)


def _listen_for_stop_signals(say_stopping: Callable[[str], None]) -> Callable[[], None]:
    """The stopping line written from a thread the moment SIGTERM (or SIGINT) arrives; the returned function stops it.

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
                stop = next((s for s in STOP_SIGNALS if s in received), None)
                if stop is not None and callable(signal.getsignal(signal.SIGUSR1)):  # Tune listens
                    say_stopping(stop.name)

    thread = threading.Thread(target=listen, daemon=True, name="stop-signal-listener")
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
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
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
    os._exit(ExitCode.INTERRUPTED)


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
