"""The trial engine: every study's trials run through Ray Tune from here, a table's grid directly (:func:`run_grid`)
and an Optuna search through :mod:`calib.search`, which is built on it. Ray loads lazily.

Modules: ``runtime`` (Ray on the driver), ``resources`` (a node for each trial), ``execution`` (the worker side of a
trial), ``events`` (trials' Stage-I waits to the driver; its mailbox actor in ``mailbox``), ``skeleton`` (the steps
around a grid's or search's Tuner), ``tuner`` (the run's summary, ``--check-only``'s result, Tune's run config),
``stopping`` (SIGTERM), ``progress`` (the progress callback), ``display`` (progress lines), ``trial_errors`` (what a
failed trial died of), ``compaction`` (the study's store compacted during and after a run), ``grid`` (explicit
configs), ``stage1_first`` (the grid's searcher: each Stage I before the trials that read it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["CheckedOnly", "ExecutionOptions", "StudyInterrupted", "StudyRun", "TuneRun", "init_ray", "run_grid"]

_HOMES = {"ExecutionOptions": "execution", "run_grid": "grid", "init_ray": "runtime", "TuneRun": "skeleton",
          "StudyInterrupted": "stopping", "CheckedOnly": "tuner", "StudyRun": "tuner"}
"""Each public name's module, imported at its first use: a Ray worker that imports one light module of this
package (the driver's mailbox, :mod:`calib.run.mailbox`) does not import torch with the rest."""

if TYPE_CHECKING:
    from calib.run.execution import ExecutionOptions
    from calib.run.grid import run_grid
    from calib.run.runtime import init_ray
    from calib.run.skeleton import TuneRun
    from calib.run.stopping import StudyInterrupted
    from calib.run.tuner import CheckedOnly, StudyRun


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'calib.run' has no attribute {name!r}")
    return getattr(importlib.import_module(f"calib.run.{_HOMES[name]}"), name)
