"""The Tune callback of a run's progress: Tune's trial events, and the trials' Stage-I waits and takeovers
(:mod:`calib.run.events`), to the progress display (:mod:`calib.run.display`), what a failed trial died of
(:mod:`calib.run.trial_errors`), and the trials a scheduler pruned stored as ``pruned`` rows."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any

from calib.config import parse_trial_config
from calib.run.display import ProgressDisplay
from calib.run.events import EventFeed
from calib.run.trial_errors import TrialError, failure_line
from calib.store import completed_trial_ids, write_result
from calib.trial import TrialResult, trial_id

__all__ = ["WORKER_DEATH_GRACE_SECONDS", "progress_callback"]


WORKER_DEATH_GRACE_SECONDS = 1.0
"""How long the driver waits before it reports a trial whose worker process died: a SIGTERM that ends a
whole job (a preemption, a requeue, scancel) kills the workers a moment before it reaches the driver, and
their trials are then stopped, not failed."""


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
    trials' Stage-I waits and takeovers (:mod:`calib.run.events`), to ``display`` (None: store only);
    ``configs_of(trial.config)`` are the trial configs a Tune trial runs, whose rows in ``store`` say what
    a failed one died of."""
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    from ray import tune

    def failed(config: dict[str, Any], error: TrialError) -> tuple[str, str]:
        calib_id = trial_id(config)
        return calib_id, failure_line(store, study, calib_id, error)

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
            error = TrialError(trial)
            for config, summary in zip(configs_of(trial.config), json.loads(result["calib_results"]), strict=True):
                if summary.get("degenerate_fit"):
                    display.degenerate_fit(summary["degenerate_fit"])
                if summary["status"] == "ok":
                    display.trial_finished(trial.trial_id, summary["calib_trial_id"], summary.get(display.objective))
                else:
                    display.trial_failed(trial.trial_id, *failed(config, error))

        def _grace(self, error: TrialError) -> None:
            if display.interrupted is None and error.worker_died():
                time.sleep(WORKER_DEATH_GRACE_SECONDS)  # the signal handler runs meanwhile, if one is coming

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            if not display:
                return
            error = TrialError(trial)
            self._grace(error)
            configs = configs_of(trial.config)
            done = completed_trial_ids(store, study, trial_ids=[trial_id(c) for c in configs])
            for config in configs:
                if trial_id(config) not in done:
                    display.trial_failed(trial.trial_id, *failed(config, error))
                else:
                    display.trial_finished(trial.trial_id, trial_id(config), None)

        def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            if display:
                error = TrialError(trial)
                self._grace(error)
                if display.interrupted:  # no retry comes: the run is stopping
                    return
                calib_id, line = failed(configs_of(trial.config)[0], error)
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
