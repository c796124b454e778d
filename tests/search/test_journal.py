"""The Optuna journal in the store: snapshots restore the state a full replay gives, and batched appends."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
from locations import local_or_s3_location
from optuna.distributions import CategoricalDistribution, FloatDistribution

from calib.search.journal import journal_location, optuna_storage, snapshot_location

SPACE = {"x": FloatDistribution(0.0, 1.0), "w": CategoricalDistribution([64, 128, 256])}


def grow(store: str, trials: int, seed: int = 0) -> None:
    """``trials`` more asked-and-told TPE trials in the study "s" of ``store`` (as a search writes them)."""
    storage = optuna_storage(store, "s")
    study = optuna.create_study(study_name="s", storage=storage, load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=3))
    for _ in range(trials):
        trial = study.ask(fixed_distributions=SPACE)
        trial.set_user_attr("calib_trial_id", f"id-{trial.number}")
        study.tell(trial, (trial.params["x"] - 0.3) ** 2 + trial.params["w"] / 1000)


def state(storage) -> tuple:
    study_id = storage.get_study_id_from_name("s")
    return storage.get_all_trials(study_id, deepcopy=False), storage.get_study_user_attrs(study_id)


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    return local_or_s3_location(request, tmp_path, "store")


def test_a_snapshot_restores_what_the_journal_replays_and_reads_only_what_follows(store):
    grow(store, 12)
    opened = optuna_storage(store, "s")
    records = opened.logs_since_snapshot
    assert opened.restored_logs == 0 and records > 12
    assert not opened.snapshot_if_due(every=10**6) and opened.snapshot_if_due(every=1)
    assert opened.logs_since_snapshot == 0
    restored = optuna_storage(store, "s")
    assert restored.restored_logs == records and restored.logs_since_snapshot == 0
    assert state(restored) == state(optuna_storage(store, "s", snapshot=False))

    grow(store, 5, seed=1)  # records after the snapshot: replayed on top of it
    again = optuna_storage(store, "s")
    assert again.restored_logs == restored.restored_logs and again.logs_since_snapshot > 5
    full = optuna_storage(store, "s", snapshot=False)
    assert state(again) == state(full) and len(state(full)[0]) == 17

    if not store.startswith("s3://"):  # the same proposals from either (each in its own copy: an ask writes)
        proposals = []
        for snapshot in (True, False):
            copy = shutil.copytree(store, f"{store}-{snapshot}")
            storage = optuna_storage(str(copy), "s", snapshot=snapshot)
            assert (storage.restored_logs > 0) == snapshot
            study = optuna.load_study(study_name="s", storage=storage,
                                      sampler=optuna.samplers.TPESampler(seed=7, n_startup_trials=3))
            proposals.append(study.ask(fixed_distributions=SPACE).params)
        assert proposals[0] == proposals[1]


def test_a_snapshot_of_another_journal_or_optuna_version_is_ignored(tmp_path, monkeypatch):
    store = str(tmp_path / "store")
    grow(store, 6)
    assert optuna_storage(store, "s").save_snapshot()
    monkeypatch.setattr(optuna, "__version__", "0.0.0")
    assert optuna_storage(store, "s").restored_logs == 0
    monkeypatch.undo()
    assert optuna_storage(store, "s").restored_logs > 0

    Path(journal_location(store, "s")).unlink()  # a lost journal, rebuilt with other trials
    grow(store, 4, seed=3)
    rebuilt = optuna_storage(store, "s")
    assert rebuilt.restored_logs == 0 and len(state(rebuilt)[0]) == 4
    assert state(rebuilt) == state(optuna_storage(store, "s", snapshot=False))

    snapshot = Path(snapshot_location(store, "s"))
    assert rebuilt.save_snapshot()
    snapshot.write_bytes(snapshot.read_bytes()[:-100])  # cut short
    assert optuna_storage(store, "s").restored_logs == 0


def test_batched_appends_write_once_and_read_back_the_same(store):
    grow(store, 3)
    storage = optuna_storage(store, "s")
    study = optuna.load_study(study_name="s", storage=storage)
    with storage.batched():
        for number in range(4):
            study.add_trial(optuna.trial.create_trial(params={"x": number / 10, "w": 64}, distributions=SPACE,
                                                      value=float(number), user_attrs={"calib_trial_id": f"t{number}"}))
        assert len(study.trials) == 7  # visible inside the batch
        assert len(state(optuna_storage(store, "s", snapshot=False))[0]) == 3  # not written yet
    assert state(optuna_storage(store, "s", snapshot=False)) == state(storage)
    assert len(state(storage)[0]) == 7
    grow(store, 2)  # the storage reads on after the batch
    assert len(optuna_storage(store, "s").get_all_trials(0)) == 9
