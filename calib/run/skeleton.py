"""The steps every study's run takes around its Ray Tune Tuner, written once for grids (:func:`calib.run.grid.run_grid`)
and searches (:func:`calib.search.optimize.run_search`): :class:`TuneRun`."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from calib import storage
from calib.run.compaction import compact_study_store
from calib.run.display import ProgressDisplay
from calib.run.execution import ExecutionOptions
from calib.run.resources import wait_for_resources
from calib.run.runtime import check_address, init_ray
from calib.run.stopping import StudyInterrupted, interrupted_message, stoppable
from calib.store.manifest import check_manifest, record_manifest

__all__ = ["TuneRun"]


class TuneRun:
    """The steps every grid and search takes around its Tuner, in this order: :meth:`check` before anything runs,
    then :meth:`fit` (Ray, the manifest recorded, the Tuner run under :func:`calib.run.stopping.stoppable`, the
    study's store compacted), or only :meth:`compact` when every trial is stored; :meth:`stop_if_interrupted`
    ends a run that a signal stopped. What runs (which configs, which searcher) is the caller's."""

    def __init__(self, store: str | os.PathLike, study: str, options: ExecutionOptions | None) -> None:
        self.store = storage.normalize(store)
        self.study = study
        self.options = options or ExecutionOptions()
        self._started = time.perf_counter()
        self._manifest: dict[str, Any] | None = None

    def check(self, manifest: dict[str, Any]) -> ExecutionOptions:
        """Before Ray starts: the cluster address, the trackers of ``--log-to`` started (not for ``--check-only``),
        the store writable and ``manifest`` (:mod:`calib.store.manifest`) that of the study's stored trials. Returns
        the options the trials run with (their ``tracking`` set)."""
        options = self.options
        check_address(options.address)
        if options.log_to and options.tracking is None and not options.check_only:
            # lazy: only a study with --log-to loads the trackers' module (and, through it, their clients)
            from calib.tracking import start_study

            self.options = dataclasses.replace(options, tracking=start_study(options.log_to, self.study, self.store))
        storage.check_writable(self.store)
        check_manifest(self.store, self.study, manifest)
        self._manifest = manifest
        return self.options

    def compact(self) -> None:
        """Compact the study's store: at the end of a run, and when every trial is stored already."""
        compact_study_store(self.store, self.study, verbose=self.options.verbose)

    def fit(self, make_tuner: Callable[[], tuple[Any, ProgressDisplay | None]], pending: int,
            after_fit: Callable[[], None] | None = None) -> str | None:
        """Start or join Ray (on a cluster, wait until some node fits each trial), record the manifest, then run
        the Tuner that ``make_tuner()`` builds (with the progress display its callbacks feed, None when quiet)
        until its ``pending`` trials end or a signal stops it; call ``after_fit`` and compact the study's store.
        Returns the name of the signal that stopped the run, None if none did."""
        if self._manifest is None:
            raise RuntimeError("TuneRun.fit before TuneRun.check: the store and manifest were never checked")
        init_ray(self.options.address)
        if self.options.address is not None:  # a cluster: some node must fit each trial (or join within the wait)
            wait_for_resources(self.options)
        record_manifest(self.store, self.study, self._manifest)
        tuner, display = make_tuner()
        with stoppable(self.study, pending, display) as stop:
            tuner.fit()
        if after_fit is not None:
            after_fit()
        self.compact()
        return stop.get("signal")

    def stop_if_interrupted(self, signal: str | None, finished: int, pending: int) -> None:
        """Raise :class:`calib.run.stopping.StudyInterrupted` (its line says ``finished`` of ``pending`` trials ran)
        when ``signal`` stopped the run."""
        if signal is not None:
            raise StudyInterrupted(interrupted_message(self.study, signal, finished, pending))

    @property
    def seconds(self) -> float:
        """Seconds since the run was created."""
        return time.perf_counter() - self._started
