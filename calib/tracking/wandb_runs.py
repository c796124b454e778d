"""Weights & Biases: one run per trial in the group of its study (W&B's parent of runs), ``wandb.init``
with the settings of ``WANDB_PROJECT`` (default ``calib``), ``WANDB_ENTITY``, ``WANDB_MODE`` and ``WANDB_DIR``."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["log", "start_study"]


def start_study(study: str, store: str) -> dict[str, Any]:
    return {"project": os.environ.get("WANDB_PROJECT") or "calib", "entity": os.environ.get("WANDB_ENTITY"),
            "mode": os.environ.get("WANDB_MODE"), "dir": os.environ.get("WANDB_DIR")}


def log(study: str, options: dict[str, Any], trial: Any) -> str:
    """The trial's run: config, tags, history per step, final metrics as its summary, the diagram."""
    # optional dependency (the `wandb` extra)
    import wandb

    run = wandb.init(project=options["project"], entity=options["entity"], mode=options["mode"],
                     dir=options["dir"], group=study, job_type="trial", name=trial.name, config=trial.params,
                     tags=[f"{k}:{v}"[:64] for k, v in trial.tags.items()], reinit="create_new",
                     settings=wandb.Settings(silent=True, console="off"))
    try:
        for step, values in trial.history:
            run.log(values, step=step)
        if trial.diagram is not None:
            run.log({"reliability": wandb.Image(str(trial.diagram))})
        run.summary.update({**trial.metrics, **{f"tag/{k}": v for k, v in trial.tags.items()}})
    finally:
        run.finish(exit_code=1 if trial.failed else 0)
    return run.id
