"""What a search chose: its completed Optuna trials with the values Optuna saw (a replicated search's aggregates),
the best one (one objective) or the Pareto front (several), and the seeds it never used. Imports Optuna: load it
where a search's results are read."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from calib import storage
from calib.metrics import higher_is_better

__all__ = ["chosen_trials", "completed_trials", "fresh_seeds", "pareto_front"]


def pareto_front(df: pd.DataFrame, objectives: Sequence[str]) -> pd.DataFrame:
    """Rows not dominated on ``objectives`` (each oriented by its metric's direction)."""
    values = np.column_stack([df[o].to_numpy(dtype=float) * (-1 if higher_is_better(o.split("_", 1)[1]) else 1)
                              for o in objectives])
    keep = [not any(np.all(other <= row) and np.any(other < row) for other in values) for row in values]
    return df[keep]


def completed_trials(store: str | os.PathLike, study: str, test_metrics: Sequence[str] = ("test_ece", "test_accuracy")
                     ) -> pd.DataFrame:
    """One row per COMPLETE Optuna trial of the search ``study``: ``search_trial`` (its number), ``trial_id`` (its
    first replicate's store id), ``replicate_ids``, each objective as Optuna saw it (the aggregate over the
    replicates), each parameter (dots as underscores), and the mean over the replicates' stored rows of
    ``test_metrics`` (shown, never chosen on)."""
    # lazy: optuna (and the journal, which imports it) take seconds to import; only a finished search needs them
    import optuna
    from optuna.trial import TrialState

    from calib.search.journal import optuna_storage
    from calib.store import read_finished

    store = storage.normalize(store)
    opened = optuna.load_study(study_name=study, storage=optuna_storage(store, study))
    objectives = list(opened.user_attrs.get("objectives", ["val_ece"]))
    rows = []
    for trial in opened.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        ids = list(trial.user_attrs.get("calib_replicate_ids") or [trial.user_attrs.get("calib_trial_id")])
        rows.append({"search_trial": trial.number, "trial_id": ids[0], "replicate_ids": ids,
                     **dict(zip(objectives, trial.values, strict=True)),
                     **{key.replace(".", "_"): value for key, value in trial.params.items()}})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    stored = read_finished(store, study, [i for ids in table["replicate_ids"] for i in ids]).set_index("trial_id")
    for metric in test_metrics:
        table[metric] = [float(stored[metric].reindex(ids).mean()) if metric in stored else float("nan")
                         for ids in table["replicate_ids"]]
    return table


def chosen_trials(completed: pd.DataFrame, objectives: Sequence[str]) -> pd.DataFrame:
    """The search's choice: the best completed trial by its one objective (ties: the earliest), or the Pareto
    front of several objectives (in trial order)."""
    if completed.empty:
        return completed
    if len(objectives) == 1:
        objective = objectives[0]
        ordered = completed.sort_values(objective, ascending=not higher_is_better(objective.split("_", 1)[1]),
                                        kind="stable")
        return ordered.head(1)
    return pareto_front(completed, objectives).sort_values("search_trial")


def fresh_seeds(given: Sequence[int], used: Iterable[int], count: int) -> list[int]:
    """``count`` seeds a search never used: those of ``given`` it did not use, in order, then the integers after
    the largest seed seen, in order."""
    used = set(used)
    seeds = [s for s in given if s not in used][:count]
    following = max([*used, *given], default=0) + 1
    while len(seeds) < count:
        if following not in used and following not in seeds:
            seeds.append(following)
        following += 1
    return seeds
