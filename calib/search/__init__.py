"""Search spaces (YAML) and running trials through Ray Tune with Optuna. Ray and Optuna load lazily."""

from calib.search.space import Distribution, SearchSpace, load_search_space, parse_search_space
from calib.search.tune import (
    SAMPLERS,
    SCHEDULERS,
    ExecutionOptions,
    SchedulerSettings,
    StudyRun,
    init_ray,
    run_grid,
    run_search,
)

__all__ = [
    "SAMPLERS",
    "SCHEDULERS",
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
