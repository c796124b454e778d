"""MLflow: an experiment per study (``MLFLOW_EXPERIMENT_NAME`` overrides), a parent run per study, nested
child runs (``mlflow.parentRunId``), through ``mlflow.MlflowClient``."""

from __future__ import annotations

import os
import time
from typing import Any

__all__ = ["log", "start_study"]


def _client(uri: str) -> Any:
    # optional dependency (the `mlflow` extra)
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def start_study(study: str, store: str) -> dict[str, Any]:
    """The experiment and the study's parent run (the one of an earlier run of the study, else a new one)."""
    # optional dependency (the `mlflow` extra)
    import mlflow

    uri = mlflow.get_tracking_uri()
    client = _client(uri)
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or study
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
    parents = client.search_runs([experiment_id], filter_string=f"tags.`calib.parent` = '{study}'", max_results=1)
    parent = parents[0].info.run_id if parents else client.create_run(
        experiment_id, run_name=study, tags={"calib.parent": study, "study": study}).info.run_id
    return {"uri": uri, "experiment_id": experiment_id, "parent_run_id": parent}


def log(study: str, options: dict[str, Any], trial: Any) -> str:
    """The trial's child run of the study's parent; returns its run id."""
    # optional dependency (the `mlflow` extra)
    from mlflow.entities import Metric, Param

    client = _client(options["uri"])
    run = client.create_run(options["experiment_id"], run_name=trial.name,
                            tags={**trial.tags, "mlflow.parentRunId": options["parent_run_id"]})
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    history = [Metric(key, value, now, step) for step, values in trial.history for key, value in values.items()]
    metrics = history + [Metric(key, value, now, 0) for key, value in trial.metrics.items()]
    params = [Param(key, value[:6000]) for key, value in trial.params.items()]
    for start in range(0, len(params), 100):  # MLflow takes at most 100 params and 1000 metrics per batch
        client.log_batch(run_id, params=params[start:start + 100])
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start:start + 1000])
    if trial.diagram is not None:
        client.log_artifact(run_id, str(trial.diagram))
    client.set_terminated(run_id, status="FAILED" if trial.failed else "FINISHED")
    return run_id
