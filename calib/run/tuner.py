"""What grids and searches share on the driver: the run's summary (:class:`StudyRun`), what ``--check-only``
returns instead (:class:`CheckedOnly`), and Tune's run config (its callbacks: :mod:`calib.run.progress`,
:mod:`calib.run.compaction`). The steps around the Tuner are :mod:`calib.run.skeleton`; stopping on SIGTERM is
:mod:`calib.run.stopping`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from calib import storage
from calib.run.compaction import compaction_callback
from calib.run.execution import ExecutionOptions

__all__ = ["CheckedOnly", "StudyRun", "run_config", "trial_dirname"]


@dataclass
class StudyRun:
    """What a call scheduled: trial ids in order, how many were skipped as already stored, failures."""

    trial_ids: list[str] = field(default_factory=list)
    skipped: int = 0
    failed: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class CheckedOnly:
    """What a run returns for ``--check-only``: its configs, resources and store were checked and nothing was
    started. ``str()`` is the line the study prints (then it exits 0, :func:`calib.study.main.guarded_main`)."""

    study: str
    pending: int
    """The trials the run would start."""
    detail: str = ""
    """What they are, when more than a count says (a replicated search: `` (4 Optuna trials × 2 replicates)``)."""

    def __str__(self) -> str:
        return f"[{self.study}] checked: {self.pending} trials to run{self.detail}; nothing was started (--check-only)"


def trial_dirname(trial: Any) -> str:
    return trial.trial_id


# Tune's own loggers, and the integrations Ray counts by class name in its usage statistics.
_RAY_CALLBACK_NAMES = ("WandbLoggerCallback", "MLflowLoggerCallback", "CometLoggerCallback", "AimLoggerCallback",
                       "CSVLoggerCallback", "JsonLoggerCallback", "TBXLoggerCallback")


def count_callbacks_by_name(callbacks: list | None) -> dict[str, int]:
    """Ray Tune's count of a run's callbacks for its usage statistics (``ray.air._internal.usage._count_callbacks``),
    the same counts by the same class names, without importing Ray's W&B, MLflow, Comet and Aim integrations to
    learn those names: with wandb and mlflow installed (calib's trackers) those imports cost each study's driver
    about a second of CPU, for one usage tag."""
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    from ray.tune import Callback
    from ray.tune.logger import LoggerCallback

    counts: dict[str, int] = {}
    for callback in callbacks or []:
        if not isinstance(callback, Callback):
            continue
        name = type(callback).__name__
        key = name if name in _RAY_CALLBACK_NAMES else (
            "CustomLoggerCallback" if isinstance(callback, LoggerCallback) else "CustomCallback")
        counts[key] = counts.get(key, 0) + 1
    return counts


def run_config(store: str, study: str, options: ExecutionOptions, callbacks: list) -> Any:
    # lazy: ray takes seconds to import; only what starts or runs Ray Tune loads it
    from ray import tune
    from ray.air._internal import usage

    usage._count_callbacks = count_callbacks_by_name  # what Tune calls with the callbacks below
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return tune.RunConfig(
        name=f"{study}-{stamp}",
        storage_path=options.storage or storage.join(store, "_ray"),
        verbose=0,
        callbacks=[*callbacks, compaction_callback(store, study, options.compact_every)],
        failure_config=tune.FailureConfig(max_failures=options.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
    )

