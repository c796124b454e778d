"""The study's store compacted while it runs (a Tune callback, in a background thread of the driver) and when it
ends (:mod:`calib.store.compaction` does the work); a failed compaction never fails the study."""

from __future__ import annotations

import json
import threading
from typing import Any

from calib.store.compaction import compact

__all__ = ["END_OF_RUN_WAIT_SECONDS", "compact_study_store", "compaction_callback"]


END_OF_RUN_WAIT_SECONDS = 120.0
"""How long the end-of-run compaction waits for another process's compaction of the study to end."""


def compact_study_store(store: str, study: str, *, verbose: bool, wait_seconds: float = END_OF_RUN_WAIT_SECONDS
                        ) -> None:
    """Compact ``study`` in ``store`` (:func:`calib.store.compaction.compact`); a failure is reported in one
    line and never fails the study: every row stays readable in its own file."""
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
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
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
