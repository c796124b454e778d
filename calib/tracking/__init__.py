"""Following a study in MLflow, TensorBoard or Weights & Biases (``--log-to``).

One parent per study and one child run per trial: tags (study, method, loss, dataset, arch, seed,
stage1_id, trial_id, label, status), the trial config as parameters, the per-epoch Stage-I and
Stage-II history, the final metrics, and the trial's reliability diagram. The driver opens the
study's parent (:func:`start_study`); the worker that stores a trial logs its child run
(:func:`log_trial`) just before it writes the row, which records the run's id (``mlflow_run_id``,
``tensorboard_run``, ``wandb_run_id``). A trial is the unit, not a Ray Tune trial: one Tune trial runs
a population of up to ``--configs-per-trial`` trials, each its own child run.

Where the runs go comes from each tracker's usual settings, read on the driver and handed to the
workers: ``MLFLOW_TRACKING_URI`` (and ``MLFLOW_EXPERIMENT_NAME``, default the study), ``WANDB_MODE``,
``WANDB_PROJECT`` (default ``calib``), ``WANDB_ENTITY``, ``WANDB_DIR``; TensorBoard event files go to
``$CALIB_TENSORBOARD_DIR`` (default ``<store>/tensorboard``). Credentials stay in each node's environment.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calib import storage
from calib._config import ConfigError

__all__ = [
    "TRACKERS",
    "TrackedTrial",
    "Tracker",
    "TrackingSettings",
    "TrackingWarning",
    "check_trackers",
    "log_trial",
    "start_study",
]


@dataclass(frozen=True)
class Tracker:
    """A tracker calib can log to: its module here, the package it needs, the extra that installs it."""

    module: str
    package: str
    extra: str
    column: str
    settings: str
    """Where the tracker reads where its runs go: named in the error when it cannot be opened."""


TRACKERS: dict[str, Tracker] = {
    "mlflow": Tracker("calib.tracking.mlflow_runs", "mlflow", "mlflow", "mlflow_run_id",
                      "MLFLOW_TRACKING_URI: a tracking server, or sqlite:///mlflow.db (MLflow 3 refuses a ./mlruns "
                      "folder unless MLFLOW_ALLOW_FILE_STORE=true)"),
    "tensorboard": Tracker("calib.tracking.tensorboard_runs", "tensorboardX", "tensorboard", "tensorboard_run",
                           "CALIB_TENSORBOARD_DIR: a writable directory (default <store>/tensorboard)"),
    "wandb": Tracker("calib.tracking.wandb_runs", "wandb", "wandb", "wandb_run_id",
                     "WANDB_MODE (offline works without an account), WANDB_PROJECT, WANDB_ENTITY, WANDB_DIR, and "
                     "wandb login"),
}


class TrackingWarning(UserWarning):
    """A trial's run could not be logged; the trial itself is stored as usual."""


def check_trackers(names: Sequence[str]) -> None:
    """``ConfigError`` for an unknown tracker or one whose package is not installed (naming the extra)."""
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"`--log-to` must be one of {', '.join(TRACKERS)}, got --log-to {name}.")
        tracker = TRACKERS[name]
        if importlib.util.find_spec(tracker.package) is None:
            raise ConfigError(f"`--log-to {name}` needs the package {tracker.package}, which is not installed: "
                              f"pip install -e \".[{tracker.extra}]\" (or pip install \"calib[{tracker.extra}]\").")


@dataclass(frozen=True)
class TrackingSettings:
    """What the workers need to log a study's trials: the trackers, and per tracker where its runs go."""

    study: str
    names: tuple[str, ...]
    options: dict[str, dict[str, Any]] = field(default_factory=dict)


def start_study(names: Sequence[str], study: str, store: str) -> TrackingSettings | None:
    """On the driver: check the trackers and open the study's parent in each; None without ``names``."""
    if not names:
        return None
    check_trackers(names)
    names = tuple(dict.fromkeys(names))
    options = {}
    for name in names:
        try:
            options[name] = importlib.import_module(TRACKERS[name].module).start_study(study, store)
        except Exception as err:  # whatever the tracker raises, it cannot log this study: bad input, before any trial
            said = " ".join(str(err).split()) or type(err).__name__
            raise ConfigError(f"`--log-to {name}`: {name} could not be opened: {said} Check "
                              f"{TRACKERS[name].settings}.") from err
    return TrackingSettings(study, names, options)


@dataclass
class TrackedTrial:
    """One trial as a tracker logs it."""

    name: str
    tags: dict[str, str]
    params: dict[str, str]
    history: list[tuple[int, dict[str, float]]]
    metrics: dict[str, float]
    failed: bool
    diagram: Path | None


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return out


def _history(rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """Per-epoch values as ``(step, {"<stage>/<key>": value})``: Stage II continues Stage I's steps."""
    stage1 = [r for r in rows if r.get("stage") == "stage1"]
    offset = 1 + max((int(r["epoch"]) for r in stage1), default=-1)
    steps = []
    for row in rows:
        stage = row.get("stage", "stage2")
        values = {f"{stage}/{k}": float(v) for k, v in row.items()
                  if k not in ("stage", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool)
                  and v == v}
        steps.append((int(row.get("epoch", 0)) + (offset if stage == "stage2" else 0), values))
    return steps


def _diagram(result: Any, folder: Path) -> Path | None:
    details = result.details
    if not details.get("test_bin_count"):
        return None
    # lazy: matplotlib takes seconds to import; only a figure needs it
    import pandas as pd

    from calib.report.figures import plot_reliability

    bins = pd.DataFrame({"label": result.config.label or result.config.method.name,
                         "bin": range(len(details["test_bin_count"])), "count": details["test_bin_count"],
                         "confidence": details["test_bin_confidence"], "accuracy": details["test_bin_accuracy"]})
    for bound in ("lower", "upper"):
        if f"test_bin_accuracy_{bound}" in details:
            bins[f"accuracy_{bound}"] = details[f"test_bin_accuracy_{bound}"]
    return plot_reliability(bins, folder / "reliability.png", title=f"{result.trial_id} (test)")


def tracked(result: Any, folder: Path) -> TrackedTrial:
    """The tags, parameters, history, metrics and reliability diagram of a :class:`calib.trial.TrialResult`."""
    # lazy: calib.config imports torch and the registries; the tracking backends load without it
    from calib.config import trial_identity

    cfg = result.config
    tags = {"study": cfg.study, "method": cfg.method.name, "loss": cfg.loss.name, "dataset": cfg.dataset,
            "arch": cfg.arch, "seed": str(cfg.seed), "stage1_id": result.stage1_id, "trial_id": result.trial_id,
            "label": cfg.label, "status": result.status}
    metrics = {k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float)) and v == v}
    return TrackedTrial(name=f"{cfg.label or cfg.method.name} seed {cfg.seed} · {result.trial_id}", tags=tags,
                        params=_flat(trial_identity(cfg)), history=_history(result.history), metrics=metrics,
                        failed=result.status != "ok", diagram=_diagram(result, folder))


def log_trial(settings: TrackingSettings | None, result: Any) -> dict[str, str]:
    """On the worker, before the row is written: one child run per tracker; returns the store columns of
    the run ids. A tracker that fails is a :class:`TrackingWarning`: the trial is stored all the same."""
    if settings is None:
        return {}
    ids: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as folder:
        trial = tracked(result, Path(folder))
        for name in settings.names:
            try:
                module = importlib.import_module(TRACKERS[name].module)
                ids[TRACKERS[name].column] = module.log(settings.study, settings.options[name], trial)
            except Exception as err:  # the trial is finished and must be stored
                warnings.warn(f"{name}: trial {result.trial_id} was not logged ({type(err).__name__}: {err}); it is "
                              f"stored as usual", TrackingWarning, stacklevel=2)
    return ids


def default_tensorboard_dir(store: str) -> str:
    return os.environ.get("CALIB_TENSORBOARD_DIR") or storage.join(store, "tensorboard")
