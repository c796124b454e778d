"""TensorBoard: event files per trial under ``<dir>/<study>/<trial_id>/`` (``tensorboardX.SummaryWriter``,
the writer Ray Tune's ``TBXLoggerCallback`` uses); the study is the parent folder TensorBoard groups by."""

from __future__ import annotations

from typing import Any

from calib import storage
from calib.tracking import default_tensorboard_dir

__all__ = ["log", "start_study"]


def start_study(study: str, store: str) -> dict[str, Any]:
    return {"dir": storage.join(default_tensorboard_dir(store), study)}


def log(study: str, options: dict[str, Any], trial: Any) -> str:
    """Scalars per epoch, final metrics, tags as text, hyperparameters and the reliability diagram; returns
    the run's folder (what TensorBoard lists as the run)."""
    # optional dependency (the `tensorboard` extra)
    import matplotlib.image
    from tensorboardX import SummaryWriter
    from tensorboardX.summary import hparams

    run = storage.join(options["dir"], trial.tags["trial_id"])
    with SummaryWriter(logdir=run) as writer:
        for step, values in trial.history:
            for key, value in values.items():
                writer.add_scalar(key, value, step)
        for key, value in trial.metrics.items():
            writer.add_scalar(f"final/{key}", value, 0)
        writer.add_text("tags", "  \n".join(f"{k}: {v}" for k, v in trial.tags.items()), 0)
        if trial.diagram is not None:
            writer.add_image("reliability", matplotlib.image.imread(trial.diagram)[..., :3], 0, dataformats="HWC")
    # What SummaryWriter.add_hparams(..., name=".") writes, in the same run but a file of its own: add_hparams opens a
    # second writer on the run's folder, whose event file has the same name when both start in the same second (the
    # name holds the time in seconds), so the two truncated and overwrote each other's records.
    metrics = {f"hparam/{k}": v for k, v in trial.metrics.items() if k.startswith("test_")}
    with SummaryWriter(logdir=run, filename_suffix=".hparams") as writer:
        for summary in hparams({**trial.params, **trial.tags}, metrics):
            writer.file_writer.add_summary(summary)
        for key, value in metrics.items():
            writer.add_scalar(key, value)
    return run
