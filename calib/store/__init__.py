"""The Parquet result store: ``trials`` and ``history`` tables, one file per trial, hive-partitioned by study."""

from calib.store.parquet import (
    StoreWarning,
    completed_trial_ids,
    read_finished,
    read_history,
    read_trials,
    trial_row,
    validate_study_name,
    write_result,
)
from calib.store.schema import HISTORY_COLUMNS, history_schema, trial_columns, trial_schema

__all__ = [
    "HISTORY_COLUMNS",
    "StoreWarning",
    "completed_trial_ids",
    "history_schema",
    "read_finished",
    "read_history",
    "read_trials",
    "trial_columns",
    "trial_row",
    "trial_schema",
    "validate_study_name",
    "write_result",
]
