"""The searcher of a grid's Tune trials: every Stage I trained by one trial before the trials that read it.

:class:`Stage1FirstSearcher` hands Tune a grid's trials (:func:`calib.run.grid.batch_roles`), each trial that
reads a Stage I only once the trial that trains it has ended. Imports Ray: :func:`calib.run.grid.run_grid` loads it
where a grid runs.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

from ray.tune.search import Searcher

from calib.artifacts import stage1_exists
from calib.config import parse_trial_config

__all__ = ["Stage1FirstSearcher"]


def _stage1_published(trial: dict[str, Any]) -> bool:
    return stage1_exists(parse_trial_config(trial["configs"][0]))


class Stage1FirstSearcher(Searcher):
    """A grid's Tune trials (:func:`calib.run.grid.batch_roles`), in order, each ``"cached"`` one
    only once the ``"stage1"`` trial of its Stage I has ended: no dependent starts, on any node,
    before its artifact is published, so none trains it again.

    A trainer that ends without its Stage I published (it failed for good, its retries spent; or a
    population whose Stage I failed) releases its dependents, and the first of them becomes the
    trainer (with a Stage-I trial's resources) while the others wait for it in turn.
    ``published(trial)``: whether a trial's Stage I is stored (default
    :func:`calib.artifacts.stage1_exists` of its first config).
    """

    def __init__(self, trials: Sequence[dict[str, Any]],
                 published: Callable[[dict[str, Any]], bool] | None = None) -> None:
        super().__init__()
        self._published = published or _stage1_published
        self._queue = [dict(trial) for trial in trials]
        self._training = {trial["stage1_id"] for trial in trials if trial["role"] == "stage1"}
        self._failed: set[str] = set()
        self._trainer_of: dict[str, tuple[str, dict[str, Any]]] = {}  # Tune trial id -> (stage1_id, trial)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        for position, trial in enumerate(self._queue):
            stage1_id = trial["stage1_id"]
            if trial["role"] == "stage1" or stage1_id not in self._training:
                del self._queue[position]
                if stage1_id in self._failed:  # its trainer failed: this one trains it instead
                    self._failed.discard(stage1_id)
                    trial["role"] = "stage1"
                if trial["role"] == "stage1":
                    self._training.add(stage1_id)
                    self._trainer_of[trial_id] = (stage1_id, trial)
                return {"trial": trial}
        return Searcher.FINISHED if not self._queue else None

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        entry = self._trainer_of.pop(trial_id, None)
        if entry is not None:
            stage1_id, trial = entry
            self._training.discard(stage1_id)
            if error or not self._published(trial):
                self._failed.add(stage1_id)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as out:
            pickle.dump({k: v for k, v in self.__dict__.items() if k != "_published"}, out)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as source:
            self.__dict__.update(pickle.load(source))
