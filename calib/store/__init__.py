"""The Parquet result store: ``trials`` and ``history`` tables, hive-partitioned by study; each trial written
to its own file, finished trials compacted into a few large parts (:mod:`calib.store.compaction`)."""

from calib.store.compaction import CompactionReport, compact
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
    "CompactionReport",
    "StoreWarning",
    "compact",
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
