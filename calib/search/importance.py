"""Parameter importances (fANOVA), slice and history plots of a finished search, rebuilt from its trials.

The search's trials are re-created as an in-memory Optuna study (parameters from typed columns, the
validation objective as value), so importances can be computed for any search in the store, also one
whose Ray driver is long gone. A search passes one row per Optuna trial with the value Optuna saw
(:func:`calib.search.chosen.completed_trials`: a replicated search's aggregate over its replicates),
so the importances, slices and history are those of the objective the search optimised.

A search's trials are stored before this report runs, so the report never fails: where importances
or the plot cannot be made (one trial, equal objective values, nothing varied, NaN objectives), the
returned :class:`ImportanceReport` says why in one line each.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calib.metrics import higher_is_better
from calib.search.space import SearchSpace

__all__ = ["ImportanceReport", "importance_report", "optuna_study_from_trials"]


def _value(raw: Any, kind: str) -> Any:
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return None
    if kind == "int":
        return int(raw)
    if hasattr(raw, "item"):
        return raw.item()
    return raw


def _column(key: str) -> str:
    return key.replace(".", "_")


def optuna_study_from_trials(trials: pd.DataFrame, space: SearchSpace, objective: str,
                             params: list[str] | None = None) -> Any:
    """An in-memory Optuna study holding ``trials`` (store rows) as complete trials of ``space``
    (of its parameters ``params`` only, when given)."""
    # lazy: optuna loads only for a search
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    direction = "maximize" if higher_is_better(objective.split("_", 1)[1]) else "minimize"
    study = optuna.create_study(direction=direction)
    keys = params if params is not None else list(space.parameters)
    distributions = {key: space.optuna_space()[key] for key in keys}
    for _, row in trials.iterrows():
        values = {key: _value(row[_column(key)], space.parameters[key].kind) for key in keys}
        study.add_trial(optuna.trial.create_trial(params=values, distributions=distributions,
                                                  value=float(row[objective])))
    return study


@dataclass
class ImportanceReport:
    """What :func:`importance_report` made: importances (summing to 1; empty when not computed), the
    files written, and one line per thing it could not make, saying why."""

    importances: dict[str, float] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _usable(trials: pd.DataFrame, space: SearchSpace, objective: str, notes: list[str]) -> pd.DataFrame:
    """The ok trials with a finite objective and a value for every numeric parameter."""
    rows = trials[trials["status"] == "ok"] if "status" in trials else trials
    rows = rows[np.isfinite(pd.to_numeric(rows[objective], errors="coerce").to_numpy(dtype=float))]
    for key, dist in space.parameters.items():
        if dist.kind in ("uniform", "loguniform", "int"):
            rows = rows[rows[_column(key)].notna()]
    if len(rows) < len(trials):
        notes.append(f"{len(trials) - len(rows)} of {len(trials)} trials left out: failed, or no finite "
                     f"{objective}, or no value for a parameter of the space")
    return rows


def _varying(rows: pd.DataFrame, space: SearchSpace) -> list[str]:
    """Parameters that took at least two different values (None counts as a value)."""
    return [key for key, dist in space.parameters.items()
            if len({_value(v, dist.kind) for v in rows[_column(key)]}) > 1]


def _fanova(rows: pd.DataFrame, space: SearchSpace, objective: str, notes: list[str]) -> dict[str, float]:
    # lazy: optuna loads only for a search
    import optuna

    values = rows[objective].to_numpy(dtype=float)
    if len(rows) < 2:
        notes.append(f"importances not computed: they need 2 trials with a finite {objective}, "
                     f"{'got 1' if len(rows) == 1 else 'got none'}")
        return {}
    varying = _varying(rows, space)
    if not varying:
        notes.append("importances not computed: no parameter took two different values")
        return {}
    if np.ptp(values) == 0:
        notes.append(f"importances not computed: every trial has {objective} = {values[0]:.6g}, "
                     "so no parameter explains any of its variance")
        return {}
    constant = [key for key in space.parameters if key not in varying]
    if constant:
        notes.append(f"left out of the importances (one value in every trial): {', '.join(constant)}")
    try:
        study = optuna_study_from_trials(rows, space, objective, varying)
        importances = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
    except Exception as err:  # fANOVA has degenerate cases of its own (e.g. zero variance in its trees)
        notes.append(f"importances not computed: {type(err).__name__}: {err}".splitlines()[0])
        return {}
    return {key: float(value) for key, value in importances.items()}


def _slice_plot(rows: pd.DataFrame, space: SearchSpace, objective: str, path: Path, notes: list[str]) -> Path | None:
    """The slice plot at ``path`` (its suffix the figure format's): the path written, or None with a note saying
    why it was not drawn."""
    # lazy: calib.report.figures imports matplotlib, seconds; only a figure needs it
    from calib.report.figures import plot_slices

    if rows.empty:
        notes.append("slice plot not drawn: no trial to plot")
        return None
    values = pd.DataFrame({key: [_value(v, d.kind) for v in rows[_column(key)]] for key, d in space.parameters.items()})
    values[objective] = rows[objective].to_numpy(dtype=float)
    log = [key for key, d in space.parameters.items() if d.kind == "loguniform" or d.spec.get("log")]
    categorical = [key for key, d in space.parameters.items() if d.kind in ("categorical", "grid")]
    try:
        with warnings.catch_warnings():  # matplotlib's, for a parameter that took one value
            warnings.simplefilter("ignore", UserWarning)
            return plot_slices(values, objective, path, log=log, categorical=categorical)
    except Exception as err:  # a figure never stops the report: the table is written all the same
        notes.append(f"slice plot not drawn: {type(err).__name__}: {err}".splitlines()[0])
        return None


def _history_plot(rows: pd.DataFrame, objective: str, path: Path, notes: list[str]) -> Path | None:
    """The optimisation history at ``path`` (its suffix the figure format's): each Optuna trial's objective and the
    best so far; the path written, or None with a note saying why it was not drawn."""
    # lazy: calib.report.figures imports matplotlib, seconds; only a figure needs it
    from calib.report.figures import plot_history

    if rows.empty:
        notes.append("history plot not drawn: no trial to plot")
        return None
    numbers = rows["search_trial"] if "search_trial" in rows else pd.Series(range(len(rows)), index=rows.index)
    values = pd.Series(rows[objective].to_numpy(dtype=float), index=numbers.to_numpy())
    try:
        return plot_history(values, objective, path, minimize=not higher_is_better(objective.split("_", 1)[1]))
    except Exception as err:  # a figure never stops the report: the table is written all the same
        notes.append(f"history plot not drawn: {type(err).__name__}: {err}".splitlines()[0])
        return None

def importance_report(
    trials: pd.DataFrame, space: SearchSpace, objective: str, out: str | os.PathLike, name: str,
    value: str = "",
) -> ImportanceReport:
    """fANOVA importances of the parameters for ``objective``, a slice plot and an optimisation-history plot of
    ``trials`` (one row per Optuna trial, in trial order: ``search_trial`` when it has one), written under ``out``
    as ``<name>_importances.md``, ``<name>_slices.<format>`` and ``<name>_history.<format>`` (``--format``).
    ``value``: what a trial's value is, when not one run's (``"each the mean of 2 replicates"``). Never raises for
    degenerate trials: what cannot be made is named in ``notes``."""
    report = ImportanceReport()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if "search_trial" in trials:
        trials = trials.sort_values("search_trial", kind="stable")
    rows = _usable(trials, space, objective, report.notes)
    report.importances = _fanova(rows, space, objective, report.notes)
    drawn = [path for path in (_slice_plot(rows, space, objective, out / f"{name}_slices.png", report.notes),
                               _history_plot(rows, objective, out / f"{name}_history.png", report.notes)) if path]
    table = out / f"{name}_importances.md"
    lines = [f"fANOVA importance of each parameter for {objective} ({len(rows)} trials"
             f"{', ' + value if value else ''})", ""]
    if report.importances:
        lines += ["| parameter | importance |", "|---|---|"]
        lines += [f"| {key} | {value:.3f} |" for key, value in report.importances.items()]
    lines += [f"- {note}" for note in report.notes]
    table.write_text("\n".join(lines) + "\n")
    report.files = [table, *drawn]
    return report
