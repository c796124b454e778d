"""Search spaces (YAML) and running trials through Ray Tune with Optuna. Ray and Optuna load lazily.

Modules: ``space`` (YAML spaces), ``runtime`` (Ray on the driver), ``execution`` (the worker side of a
trial), ``tuner`` (what grids and searches share: the run's summary, ``--check-only``'s result, Tune's run
config), ``stopping`` (SIGTERM), ``progress`` (the progress callback), ``trial_errors`` (what a failed trial
died of), ``compaction`` (the study's store compacted during and after a run), ``grid`` (explicit configs),
``optimize`` (Optuna searches and schedulers), ``searcher`` (calib's Tune searchers), ``journal`` (the Optuna
study in the store), ``display`` (progress lines), ``importance`` (parameter importances).
"""

from calib.search.execution import ExecutionOptions
from calib.search.grid import run_grid
from calib.search.optimize import SAMPLERS, SCHEDULERS, SchedulerSettings, run_search
from calib.search.runtime import init_ray
from calib.search.space import Distribution, SearchSpace, load_search_space, parse_search_space
from calib.search.tuner import CheckedOnly, StudyRun

__all__ = [
    "SAMPLERS",
    "SCHEDULERS",
    "CheckedOnly",
    "Distribution",
    "ExecutionOptions",
    "SchedulerSettings",
    "SearchSpace",
    "StudyRun",
    "init_ray",
    "load_search_space",
    "parse_search_space",
    "run_grid",
    "run_search",
]
