"""Seconds a resumed Optuna search spends before its first Ray Tune trial, with N configs already stored.

For each N, builds what a re-run of ``run_search`` finds (a search over
``search_spaces/mac_cal_head.yaml``, one objective ``val_ece``, TPE as calib configures it): an Optuna
journal in ``<store>/optuna/<study>.journal`` holding N COMPLETE trials, and the DataFrame of the
finished rows the result store hands over (the Parquet read itself is not measured). Then, ``--repeats``
times on a fresh copy of that journal, runs the resume's steps with calib's own functions in
``run_search``'s order and times each (the table shows the median):

  replay    ``optuna_storage`` on a journal without a snapshot: the whole journal is replayed
  snapshot  ``SnapshotJournalStorage.save_snapshot`` (what the previous run's end wrote; absent in calib
            before journal snapshots, which this script also measures for the comparison)
  open      ``optuna_storage`` + ``_open_study`` (``optuna.create_study(load_if_exists=True)``), as
            ``run_search`` opens the study: from the snapshot, when there is one
  seed      ``study_history``, ``resumed_seed``
  sync      ``sync_with_store`` (inside ``batched``, as ``run_search`` calls it) with the N rows the journal
            holds (the normal resume), then with 1% more rows it lacks (a search killed before it told
            them; ``--missing``)
  suggest   ``PopulationSearcher.suggest`` of one Tune trial: 16 ``study.ask`` (TPE), twice, and the
            tells (``on_trial_complete``) of the first
  rebuild   ``sync_with_store`` of the N rows into an empty journal (a lost journal), up to ``--rebuild-up-to``

Each repeat prints a digest of the 32 configs it proposed: the same journal gives the same proposals,
with or without a snapshot and in calib before it. The journal is written as a search writes it: per trial
the records of an ask (create, TPE's relative params, 4 params, ``calib_trial_id``) and of its tell,
through Optuna's storage API on an in-memory backend, then appended to the journal file with Optuna's
``JournalFileBackend`` (``--form added``: one ``add_trial`` record per trial, what ``sync_with_store``
writes). Building is timed apart. ``--profile DIR``: cProfile stats of each step of the largest size.

    python benchmarks/search_resume_scale.py                        # N = 1,000 10,000 100,000; ~6 min on 2 cores
    python benchmarks/search_resume_scale.py --sizes 1000 10000 --repeats 1 --profile prof
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import math
import re
import shutil
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend, JournalFileOpenLock
from optuna.trial import TrialState

from calib._help import HelpFormatter
from calib.config import config_hash
from calib.search import load_search_space
from calib.search.journal import journal_location, optuna_storage
from calib.search.optimize import _open_study, _sampler, _search_config, resumed_seed, study_history
from calib.search.searcher import PopulationSearcher, sync_with_store
from calib.study.presets import PRESETS, base_config
from calib.trial import trial_id

try:  # calib with journal snapshots (this script also measures calib before them, for the comparison)
    from calib.search.journal import SnapshotJournalStorage  # noqa: F401
    SNAPSHOTS = True
except ImportError:
    SNAPSHOTS = False

SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "mac_cal_head.yaml"
STUDY = "resume_scale"
OBJECTIVES = ["val_ece"]
MODES = ["min"]
CONFIGS_PER_TRIAL = 16


class _MemoryBackend(BaseJournalBackend):
    """Journal records in a list: building the journal without a file append (and fsync) per record."""

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        return self.logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self.logs.extend(logs)


def _draw(dist: BaseDistribution, rng: np.random.Generator) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[int(rng.integers(len(dist.choices)))]
    if isinstance(dist, FloatDistribution) and dist.log:
        return float(math.exp(rng.uniform(math.log(dist.low), math.log(dist.high))))
    if isinstance(dist, FloatDistribution):
        return float(rng.uniform(dist.low, dist.high))
    assert isinstance(dist, IntDistribution)
    return int(dist.low + dist.step * rng.integers((dist.high - dist.low) // dist.step + 1))


def stored_rows(base: dict[str, Any], space: dict[str, BaseDistribution], n: int, seed: int) -> pd.DataFrame:
    """``n`` finished ``ok`` rows as the store hands them to ``run_search`` (the columns it reads).
    ``trial_id``: the hash of the sampled config (calib's ``trial_id`` costs 0.7 ms a config here)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        params = {key: _draw(dist, rng) for key, dist in space.items()}
        config = _search_config(base, params)
        rows.append({"trial_id": config_hash(config), "status": "ok", "config_json": json.dumps(config, sort_keys=True),
                     "val_ece": float(rng.uniform(0.01, 0.3)), "pruned_epoch": np.nan, "params": params})
    return pd.DataFrame(rows)


def write_journal(store: str, rows: pd.DataFrame, space: dict[str, BaseDistribution], form: str) -> int:
    """The journal of a search that ran ``rows`` (in order); returns its number of records."""
    backend = _MemoryBackend()
    study = optuna.create_study(study_name=STUDY, storage=JournalStorage(backend), directions=["minimize"])
    study.set_user_attr("objectives", OBJECTIVES)
    storage, study_id = study._storage, study._study_id
    for row in rows.itertuples(index=False):
        if form == "added":
            study.add_trial(optuna.trial.create_trial(params=row.params, distributions=space, values=[row.val_ece],
                                                      user_attrs={"calib_trial_id": row.trial_id}))
            continue
        # What PopulationSearcher's ask (TPE, constant liar) and tell write, through the same storage calls.
        number = storage.create_new_trial(study_id)
        storage.set_trial_system_attr(number, "tpe:relative_params:0", json.dumps(row.params))
        for key, dist in space.items():
            storage.set_trial_param(number, key, dist.to_internal_repr(row.params[key]), dist)
        storage.set_trial_user_attr(number, "calib_trial_id", row.trial_id)
        storage.set_trial_state_values(number, TrialState.COMPLETE, [row.val_ece])
    location = journal_location(store, STUDY)
    Path(location).parent.mkdir(parents=True, exist_ok=True)
    target = JournalFileBackend(location, lock_obj=JournalFileOpenLock(location))
    for start in range(0, len(backend.logs), 20_000):
        target.append_logs(backend.logs[start:start + 20_000])
    return len(backend.logs)


class Steps:
    """Seconds per named step, and cProfile stats per step when ``profile_dir`` is set."""

    def __init__(self, profile_dir: Path | None) -> None:
        self.seconds: dict[str, float] = {}
        self.profile_dir = profile_dir

    @contextmanager
    def __call__(self, name: str):
        profiler = cProfile.Profile() if self.profile_dir else None
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        try:
            yield
        finally:
            if profiler:
                profiler.disable()
            self.seconds[name] = time.perf_counter() - start
            if profiler and self.profile_dir:
                self.profile_dir.mkdir(parents=True, exist_ok=True)
                profiler.dump_stats(self.profile_dir / (re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") + ".prof"))
            print(f"  {name:<34} {self.seconds[name]:9.3f} s", flush=True)


def measure(n: int, args: argparse.Namespace, root: Path, profile_dir: Path | None) -> dict[str, float]:
    """The median seconds of each step over ``args.repeats`` resumes of one journal of ``n`` trials."""
    space_file = load_search_space(SPACE)
    space = space_file.optuna_space()
    base = base_config(PRESETS.get("quick"), study=STUDY, dataset="digits-noisy", seed=1, method={"name": "mac_cal"},
                       data_root="/unused/data", artifact_root="/unused/artifacts", device="cpu")
    base = _search_config(base, space_file.base)
    built = str(root / f"built-{n}")
    step = Steps(None)
    missing = max(1, round(n * args.missing))
    print(f"N = {n} ({missing} more rows stored than the journal holds)", flush=True)
    with step("build: rows"):
        rows = stored_rows(base, space, n + missing, seed=n)
    finished = rows.drop(columns="params")
    with step("build: journal"):
        records = write_journal(built, rows.iloc[:n], space, args.form)
    size = Path(journal_location(built, STUDY)).stat().st_size
    print(f"  journal: {records} records, {size / 2**20:.1f} MiB ({args.form})", flush=True)
    build = dict(step.seconds)
    runs = []
    for repeat in range(args.repeats):
        store = str(root / f"store-{n}-{repeat}")
        shutil.copytree(built, store)
        step = Steps(profile_dir if repeat == args.repeats - 1 else None)
        proposals = resume(store, step, n, missing, args.seed, base, space_file, finished,
                           rebuild=str(root / f"rebuilt-{n}-{repeat}") if n <= args.rebuild_up_to else None)
        print(f"  repeat {repeat + 1}: proposals {proposals}", flush=True)
        runs.append((step.seconds, proposals))
        shutil.rmtree(store)
    assert len({p for _, p in runs}) == 1, "the same journal gave different proposals"
    args.runs[n] = [seconds for seconds, _ in runs]
    return build | {name: statistics.median(seconds[name] for seconds, _ in runs) for name in runs[0][0]}


def resume(store: str, step: Steps, n: int, missing: int, search_seed: int, base: dict[str, Any],
           space_file: Any, finished: pd.DataFrame, rebuild: str | None) -> str:
    """One resume of the journal in ``store``, as ``run_search`` does it, timed by ``step``; returns a
    digest of the configs it proposed."""
    space = space_file.optuna_space()
    batched = contextlib.nullcontext
    with step("replay: full journal"):  # a resume without a snapshot (the first one, or calib before them)
        replayed = optuna_storage(store, STUDY)
    if SNAPSHOTS:
        assert replayed.restored_logs == 0
        with step("snapshot: save"):  # what the previous run's end paid, when due
            assert replayed.save_snapshot()
    del replayed
    with step("open: _open_study"):
        journal = optuna_storage(store, STUDY) if SNAPSHOTS else None
        study = _open_study(store, STUDY, OBJECTIVES, MODES, None, journal) if SNAPSHOTS else \
            _open_study(store, STUDY, OBJECTIVES, MODES, None)
    if SNAPSHOTS:
        assert journal.restored_logs > 0, "the snapshot was not restored"
        batched = journal.batched
    with step("seed: study_history"):
        history = study_history(study)
    with step("seed: resumed_seed"):
        seed = resumed_seed(search_seed, history)
    study.sampler = _sampler("tpe", space_file, seed)
    with step("sync: all rows known"), batched():
        told = sync_with_store(study, finished.iloc[:n], space, OBJECTIVES)
    assert told == 0, told
    with step("sync: 1% rows missing"), batched():
        told = sync_with_store(study, finished, space, OBJECTIVES)
    assert told == missing, told

    searcher = PopulationSearcher(
        study, space, objectives=OBJECTIVES, modes=MODES, budget=4 * CONFIGS_PER_TRIAL,
        configs_per_trial=CONFIGS_PER_TRIAL, calib_id_of=lambda params: trial_id(_search_config(base, params)),
        stored=set(finished["trial_id"]))
    with step("suggest: 1st Tune trial (16 asks)"):
        first = searcher.suggest("tune-1")
    assert isinstance(first, dict) and len(first["population"]) == CONFIGS_PER_TRIAL
    results = [{"calib_trial_id": trial_id(_search_config(base, m["params"])), "status": "ok", "val_ece": 0.05}
               for m in first["population"]]
    with step("tell: 16 results"):
        searcher.on_trial_complete("tune-1", {"calib_results": json.dumps(results)})
    with step("suggest: 2nd Tune trial (16 asks)"):
        second = searcher.suggest("tune-2")
    proposals = config_hash({"first": first, "second": second})

    if rebuild is not None:
        empty = optuna_storage(rebuild, STUDY) if SNAPSHOTS else None
        fresh = _open_study(rebuild, STUDY, OBJECTIVES, MODES, None, empty) if SNAPSHOTS else \
            _open_study(rebuild, STUDY, OBJECTIVES, MODES, None)
        with step("rebuild: sync into empty journal"), (empty.batched() if SNAPSHOTS else contextlib.nullcontext()):
            told = sync_with_store(fresh, finished.iloc[:n], space, OBJECTIVES)
        assert told == n
        shutil.rmtree(rebuild)
    return proposals


RESUME_STEPS = ("open: _open_study", "seed: study_history", "seed: resumed_seed", "sync: all rows known",
                "suggest: 1st Tune trial (16 asks)")
"""The steps of a resume before its first Tune trial starts (a journal with a snapshot, when calib writes them)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000], help="stored configs N")
    parser.add_argument("--repeats", type=int, default=3, help="resumes of each journal (the median is shown)")
    parser.add_argument("--missing", type=float, default=0.01,
                        help="fraction of N stored but not in the journal (the step is named 1%% regardless)")
    parser.add_argument("--form", choices=["asked", "added"], default="asked",
                        help="journal records per trial: a search's ask and tell, or one add_trial")
    parser.add_argument("--rebuild-up-to", type=int, default=10_000,
                        help="time rebuilding a lost journal from the store for sizes up to this")
    parser.add_argument("--seed", type=int, default=0, help="the search's --seed")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile stats of the largest size here")
    parser.add_argument("--json", type=Path, default=None, help="write the seconds per size and step here")
    parser.add_argument("--workdir", default=None, help="stores here (default: a temporary folder)")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    table: dict[int, dict[str, float]] = {}
    args.runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.workdir or scratch)
        for n in args.sizes:
            table[n] = measure(n, args, root, args.profile if n == max(args.sizes) else None)
    steps = list(dict.fromkeys(name for seconds in table.values() for name in seconds))
    print(f"\nseconds per step, median of {args.repeats} ({args.form} journal, optuna {optuna.__version__}, "
          f"journal snapshots {'on' if SNAPSHOTS else 'absent'}):")
    print(f"{'step':<38}" + "".join(f"{f'N={n:,}':>12}" for n in table))
    for name in steps:
        print(f"{name:<38}" + "".join(f"{table[n][name]:12.3f}" if name in table[n] else f"{'-':>12}" for n in table))
    print(f"{'resume before the 1st Tune trial':<38}"
          + "".join(f"{sum(table[n][k] for k in RESUME_STEPS):12.3f}" for n in table))
    if args.json:
        args.json.write_text(json.dumps({"median": table, "runs": args.runs, "snapshots": SNAPSHOTS}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
