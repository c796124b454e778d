"""Parameter importances (fANOVA) and slice plots of a finished search, rebuilt from the store.

The search's trials are re-created as an in-memory Optuna study (parameters from the store's typed
columns, the validation objective as value), so importances can be computed for any search in the
store, also one whose Ray driver is long gone.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from calib.metrics import higher_is_better
from calib.search.space import SearchSpace

__all__ = ["importance_report", "optuna_study_from_trials"]


def _value(raw: Any, kind: str) -> Any:
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return None
    if kind == "int":
        return int(raw)
    if hasattr(raw, "item"):
        return raw.item()
    return raw


def optuna_study_from_trials(trials: pd.DataFrame, space: SearchSpace, objective: str) -> Any:
    """An in-memory Optuna study holding ``trials`` (store rows) as complete trials of ``space``."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    direction = "maximize" if higher_is_better(objective.split("_", 1)[1]) else "minimize"
    study = optuna.create_study(direction=direction)
    distributions = space.optuna_space()
    for _, row in trials.iterrows():
        params = {key: _value(row[key.replace(".", "_")], dist.kind) for key, dist in space.parameters.items()}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions,
                                                  value=float(row[objective])))
    return study


def importance_report(
    trials: pd.DataFrame, space: SearchSpace, objective: str, out: str | os.PathLike, name: str
) -> tuple[dict[str, float], list[Path]]:
    """fANOVA importances of the parameters for ``objective`` and a slice plot, written under ``out``.

    Returns the importances (summing to 1) and the files written: ``<name>_importances.md`` and
    ``<name>_slices.png``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization.matplotlib import plot_slice

    study = optuna_study_from_trials(trials, space, objective)
    importances = optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = out / f"{name}_importances.md"
    lines = [f"fANOVA importance of each parameter for {objective} ({len(trials)} trials)", "",
             "| parameter | importance |", "|---|---|"]
    lines += [f"| {key} | {value:.3f} |" for key, value in importances.items()]
    table.write_text("\n".join(lines) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        axes = plot_slice(study, params=list(space.parameters))
    figure = out / f"{name}_slices.png"
    fig = (axes.flat[0] if hasattr(axes, "flat") else axes).get_figure()
    fig.savefig(figure, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return {key: float(value) for key, value in importances.items()}, [table, figure]
