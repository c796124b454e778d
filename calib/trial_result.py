"""``TrialResult``: what one trial produced, the record the store writes (``calib.store.write_result``).

It lives below both the trial that makes it (:mod:`calib.trial`) and the store that writes it, so that
neither imports the other.
"""

from __future__ import annotations

import datetime as dt
import traceback
from dataclasses import dataclass, field
from typing import Any

from calib import progress
from calib._versions import run_environment
from calib.config import TrialConfig, config_hash, stage1_identity, trial_id
from calib.plugins import plugins_of
from calib.registries import DATASETS, LOSSES, METHODS, MODELS, OOD_SETS, PROCEDURES
from calib.stage1_source import FILE_KINDS

__all__ = ["TrialResult", "used_plugins"]


@dataclass
class TrialResult:
    """What one trial produced: val_*/test_* (and ood_*) metrics as fractions, list-valued ``details``
    (test reliability bins, per-OOD-set values), per-epoch history, timings, provenance."""

    config: TrialConfig
    trial_id: str
    stage1_id: str
    status: str = "ok"
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, list] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    stage1_cache_hit: bool | None = None
    stage1_writer: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    started_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    finished_at: dt.datetime | None = None
    device: str | None = None
    stage1_device: str | None = None
    stage1_execution: dict[str, Any] = field(default_factory=dict)
    stage1_resumed_from_epoch: int | None = None
    failed_stage: str | None = None
    failed_epoch: int | None = None
    environment: dict[str, str | None] = field(default_factory=run_environment)

    population_size: int = 1
    pruned_epoch: int | None = None
    tracker_runs: dict[str, str] = field(default_factory=dict)
    """The ``--log-to`` runs of the trial by store column (``mlflow_run_id``, ``tensorboard_run``, ``wandb_run_id``)."""
    fit_details: dict[str, Any] = field(default_factory=dict)
    """The method's fit columns (``fit_degenerate``, ``fit_degenerate_reason``, ``fitted_*``, ``cv_nll``)."""
    predictions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Split (``val``, ``test``) -> ``probs`` (N, C float64, what the metrics were computed from), ``labels`` (N,)
    and ``indices`` (the validation samples covered, None: all): kept in the store on request."""

    @property
    def plugins(self) -> list[str]:
        """``"<module> <version>"`` of the plugins whose components the trial used (:mod:`calib.plugins`)."""
        return used_plugins(self.config)

    @classmethod
    def failed(cls, config: TrialConfig, error: BaseException, started_at: dt.datetime,
               where: tuple[str, int | None] | None = None) -> TrialResult:
        """A ``failed`` result carrying the exception, its traceback's last frames, and the (stage, epoch)
        the trial had reached: ``where``, else :mod:`calib.training.progress`'s last record."""
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        frames = "".join(traceback.format_tb(error.__traceback__)[-3:])
        stage, epoch = where or progress.last() or (None, None)
        return cls(
            config=config, trial_id=trial_id(config), stage1_id=config_hash(stage1_identity(config)),
            status="failed", error=f"{text}\n{frames}", started_at=started_at,
            finished_at=dt.datetime.now(dt.timezone.utc), failed_stage=stage, failed_epoch=epoch,
        )

    @classmethod
    def pruned(cls, config: TrialConfig, epoch: int, metrics: dict[str, float],
               started_at: dt.datetime) -> TrialResult:
        """A ``pruned`` result: a scheduler stopped the trial after Stage-I epoch ``epoch`` (0-based);
        ``metrics`` are the Stage-I model's validation values at that epoch."""
        return cls(
            config=config, trial_id=trial_id(config), stage1_id=config_hash(stage1_identity(config)),
            status="pruned", metrics=dict(metrics), started_at=started_at,
            finished_at=dt.datetime.now(dt.timezone.utc), pruned_epoch=epoch,
        )


def used_plugins(cfg: TrialConfig) -> list[str]:
    """The plugins that registered the trial's dataset, architecture, loss, training procedures, method and OOD
    sets."""
    names = [(LOSSES, cfg.loss.name), (METHODS, cfg.method.name), *((OOD_SETS, n) for n in cfg.ood_datasets),
             *((PROCEDURES, name) for name, _ in cfg.stage1.on())]
    if cfg.source.kind not in FILE_KINDS:
        names += [(DATASETS, cfg.dataset), (MODELS, cfg.arch)]
    return plugins_of((registry, name) for registry, name in names if name in registry)
