"""The trial engine: every study's trials run through Ray Tune from here, a table's grid directly (:func:`run_grid`)
and an Optuna search through :mod:`calib.search`, which is built on it. Ray loads lazily.

Modules: ``runtime`` (Ray on the driver), ``resources`` (a node for each trial), ``execution`` (the worker side of a
trial), ``events`` (trials' Stage-I waits to the driver), ``skeleton`` (the steps around a grid's or search's
Tuner), ``tuner`` (the run's summary, ``--check-only``'s result, Tune's run config), ``stopping`` (SIGTERM),
``progress`` (the progress callback), ``display`` (progress lines), ``trial_errors`` (what a failed trial died of),
``compaction`` (the study's store compacted during and after a run), ``grid`` (explicit configs), ``stage1_first``
(the grid's searcher: each Stage I before the trials that read it).
"""

from calib.run.execution import ExecutionOptions
from calib.run.grid import run_grid
from calib.run.runtime import init_ray
from calib.run.skeleton import TuneRun
from calib.run.stopping import StudyInterrupted
from calib.run.tuner import CheckedOnly, StudyRun

__all__ = ["CheckedOnly", "ExecutionOptions", "StudyInterrupted", "StudyRun", "TuneRun", "init_ray", "run_grid"]
