"""Optuna searches over YAML search spaces, run through the trial engine (:mod:`calib.run`). Optuna loads lazily.

Modules: ``space`` (YAML spaces), ``optimize`` (Optuna searches and schedulers), ``searcher`` (the Tune searcher
around Optuna's ask-and-tell), ``tpe`` (TPE on a window of the finished trials), ``journal`` (the Optuna study in
the store), ``replicates`` (replicated objectives), ``chosen`` (a search's completed trials and its choice),
``importance`` (parameter importances).

The engine's names that scripts imported from here before it had its own package (``run_grid``, ``init_ray``,
``CheckedOnly``, ``StudyRun``, ``ExecutionOptions``) are still here; :mod:`calib.run` is their home.
"""

from calib.run import CheckedOnly, ExecutionOptions, StudyRun, init_ray, run_grid
from calib.search.optimize import SAMPLERS, SCHEDULERS, SchedulerSettings, run_search
from calib.search.space import Distribution, SearchSpace, load_search_space, parse_search_space

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
