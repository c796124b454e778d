"""Search a method's hyperparameters with Optuna (TPE by default) through Ray Tune.

Samples configs from a search-space file until the study holds ``--num-trials`` finished trials,
runs each as a trial into the store and prints the best trials by the validation objective(s) (for
two objectives, the Pareto front), then the fANOVA importance of each parameter, a slice and a history
plot (written to <store>/report/), all on the value Optuna saw: one point per Optuna trial.
Re-running a study resumes it: its stored trials are told to the sampler first and only the missing
ones run; a larger --num-trials extends it. The Optuna study is kept in <store>/optuna/
(optuna-dashboard opens it). --scheduler asha|hyperband stops unpromising trials during Stage I
(stored as pruned). The test split never drives the search; its numbers are shown for the selected
trials only. --replicates K runs each trial on K seeds of every setup and optimises their
--aggregate; --per-setup searches each setup on its own. The chosen config (the best, or each of a
Pareto front) is written as a row file under <store>/rows/, with the seeds it was tuned on, that the
table studies take with --row FILE (not on those seeds); --confirm N re-runs it beside its method's
default row (and the --confirm-against rows) on N seeds the search never used.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pyarrow.dataset as pads

from calib._config import ConfigError
from calib.config import is_seed, seed_rule, set_dotted
from calib.metrics import higher_is_better
from calib.report import format_mean_ci, report_step
from calib.run import CheckedOnly
from calib.search import SAMPLERS, SCHEDULERS, SchedulerSettings, load_search_space, run_search
from calib.search.chosen import chosen_trials, completed_trials, fresh_seeds, pareto_front
from calib.search.importance import importance_report
from calib.search.journal import journal_location
from calib.search.optimize import DEFAULT_TPE_WINDOW
from calib.search.replicates import AGGREGATES, Replicates
from calib.store import read_finished, read_trials
from calib.study.flags import study_parser
from calib.study.main import guarded_main, study_exit_code
from calib.study.paths import study_paths
from calib.study.resources import execution_options, settings_line
from calib.study.row_file import default_row, row_of_config, write_row_file
from calib.study.rows import METHOD_ROWS, print_row_tables, row_label, run_rows
from calib.study.settings import study_settings, with_settings
from calib.study.sources import preset_of, require_datasets, study_seeds, study_setups, trial_config

CONFIRM_METRICS = {"test_accuracy": "Acc", "test_ece": "ECE", "test_aece": "AECE", "test_mce": "MCE",
                   "test_nll": "NLL", "test_brier": "Brier"}


def print_best(completed, space, objectives: list[str], replicates: Replicates) -> None:
    """The 5 best completed trials by the objective, or the Pareto front of two or more objectives; with
    replicates, the values Optuna saw are their aggregate, the test numbers their mean."""
    if completed.empty:
        return
    columns = [f"{k.replace('.', '_')}" for k in space.parameters]
    over = f" ({replicates.how} over {len(replicates)} replicates)" if len(replicates) > 1 else ""
    if len(objectives) == 1:
        objective = objectives[0]
        best = completed.sort_values(objective, ascending=not higher_is_better(objective.split("_", 1)[1]),
                                     kind="stable").head(5)
        print(f"\nbest {len(best)} of {len(completed)} trials by {objective}{over}:")
    else:
        best = pareto_front(completed, objectives)
        print(f"\nPareto front of {len(completed)} trials on {objectives}{over}:")
    for _, row in best.iterrows():
        params = ", ".join(f"{c}={row[c]:.4g}" if isinstance(row[c], float) else f"{c}={row[c]}" for c in columns)
        scores = " · ".join(f"{o} {format_mean_ci(row[o], float('nan'))}%" for o in objectives)
        print(f"  #{row['search_trial']} {row['trial_id']}  {scores} · test_ece "
              f"{format_mean_ci(row['test_ece'], float('nan'))}% · test_accuracy "
              f"{format_mean_ci(row['test_accuracy'], float('nan'))}%  [{params}]")


def bases_with_settings(args, bases: list[dict], space) -> list[dict]:
    """The replicates' base configs with ``--set`` and ``--stage2-seeds`` applied; a key the space searches or fixes,
    or more than one Stage-II seed (each replicate runs its config once), is a ``ConfigError``."""
    settings = study_settings(args)
    for setting in settings:
        if setting.key in space.parameters or setting.key in space.base:
            what = "searches" if setting.key in space.parameters else "fixes"
            raise ConfigError(f"`--set {setting}`: the search space {args.space} {what} {setting.key}; change it in "
                              f"the space file (or a copy of it) instead.")
    if args.stage2_seeds and len(set(args.stage2_seeds)) > 1:
        raise ConfigError(f"`--stage2-seeds` takes one seed in a search (each replicate runs its sampled config "
                          f"once), got --stage2-seeds {' '.join(map(str, args.stage2_seeds))}.")
    return with_settings(args, bases, settings=settings)


def tuning_seeds(replicates: Replicates, study: str, paths) -> list[int]:
    """The seeds a search chose on: its replicates', and those of every row of the study (a space may vary
    ``seed``)."""
    stored = read_trials(paths.store, study=study, columns=["seed"])["seed"]
    return sorted({int(s) for s in [*(seed for _, _, seed in replicates.described()), *stored]})


def configs_tried(completed, study: str, paths) -> int:
    """The configs a search chose among: its complete Optuna trials and those a scheduler pruned (one row each:
    a scheduler needs one replicate)."""
    pruned = read_trials(paths.store, study=study, columns=["trial_id"], filters=pads.field("status") == "pruned")
    return len(completed) + len(pruned)


def write_chosen(chosen, completed, space, replicates: Replicates, objectives: list[str], study: str, paths) -> list:
    """Each chosen trial as a row file under <store>/rows/ (a Pareto front: one file each), with the seeds it was
    tuned on and how many configs were tried: [(label, row)]."""
    configs = read_finished(paths.store, study, list(chosen["trial_id"])).set_index("trial_id")["config_json"]
    keys = [*space.parameters, *space.base]
    seeds, tried = tuning_seeds(replicates, study, paths), configs_tried(completed, study, paths)
    files = []
    for _, trial in chosen.iterrows():
        row = row_of_config(json.loads(configs[trial["trial_id"]]), keys)
        label = f"{default_row(row, METHOD_ROWS)[0]} (tuned: {study} #{trial['search_trial']})"
        name = f"{study}.yaml" if len(chosen) == 1 else f"{study}_trial{trial['search_trial']}.yaml"
        path = write_row_file(paths.outputs / "rows" / name, label, row, {
            "study": study, "store": str(paths.store), "search_trial": int(trial["search_trial"]),
            "trial_ids": list(trial["replicate_ids"]), "replicates": replicates.described(),
            "aggregate": replicates.how, "objectives": {o: float(trial[o]) for o in objectives}},
            tuning_seeds=seeds, configs_tried=tried)
        print(f"chosen config #{trial['search_trial']} as a table row: {path} "
              f"(python studies/compare_methods.py --row {path})")
        files.append((label, row))
    return files


def confirm_seeds(args, preset, study: str, searched_seeds: list[int]) -> tuple[list[int], set[int]]:
    """The --confirm seeds of a search (those of --seeds it did not use, then the integers after the largest),
    and the seeds it used."""
    used = set(searched_seeds) | set(read_trials(study_paths(args).store, study=study, columns=["seed"])["seed"])
    return fresh_seeds(study_seeds(args, preset), used, args.confirm), used


def confirm(args, files: list, study: str, searched_seeds: list[int], setups: list) -> tuple[int, int] | CheckedOnly:
    """Run the chosen rows, the default row of their method and the --confirm-against rows on --confirm fresh seeds
    of ``setups`` (study <study>_confirm) and print the table, each cell marked against the default row: the run's
    failed and finished trials."""
    seeds, used = confirm_seeds(args, preset_of(args), study, searched_seeds)
    default_label, default = default_row(files[0][1], METHOD_ROWS)
    against = {label: METHOD_ROWS[label] for label in args.confirm_against if label != default_label}
    rows = {default_label: default, **against, **dict(files)}
    print(f"\n[{study}] confirming on {args.confirm} fresh seeds {' '.join(map(str, seeds))} (the search used "
          f"{' '.join(map(str, sorted(used)))}) beside {default_label} at its defaults"
          + (f" and {', '.join(against)}" if against else "") + f": study {study}_confirm")
    narrowed = {"datasets": [d for d, _ in setups], "archs": [a for _, a in setups]} if args.per_setup else {}
    confirm_args = argparse.Namespace(**{**vars(args), "study": f"{study}_confirm", "seeds": seeds, "row": [],
                                         **narrowed})
    result = run_rows(confirm_args, rows)
    if isinstance(result, CheckedOnly):
        return result
    trials, run = result
    print_row_tables(trials, CONFIRM_METRICS, study=f"{study}_confirm", control=default_label,
                     store=study_paths(args).store)
    return run.failed, len(trials)


def replicate_bases(args: argparse.Namespace, preset, space, study: str, paths, setups: list) -> list[dict]:
    """The base config of each replicate: every setup × the first --replicates seeds, the space's base set."""
    seeds = study_seeds(args, preset)
    if args.replicates > len(seeds):
        raise ConfigError(f"--replicates {args.replicates} needs as many seeds; --seeds (or the preset's) has "
                          f"{len(seeds)}: {' '.join(map(str, seeds))}.")
    require_datasets(list(dict.fromkeys(d for d, _ in setups)), paths.data_root, args.download)
    bases = []
    for dataset, arch in setups:
        for seed in seeds[:args.replicates]:
            base = trial_config(args, preset, dataset=dataset, arch=arch, seed=seed, study=study,
                                method={"name": space.base.get("method.name", "mac_cal")})
            for key, value in space.base.items():
                base = set_dotted(base, key, value)
            bases.append(base)
    return bases


def add_search_args(parser: argparse.ArgumentParser) -> None:
    """The search's own flags."""
    parser.add_argument("--space", required=True, help="search-space YAML file (search_spaces/*.yaml)")
    parser.add_argument("--num-trials", type=int, default=20,
                        help="finished Optuna trials the study should hold; the stored ones count, only the rest run")
    parser.add_argument("--objective", nargs="+", default=["val_ece"],
                        help="validation metric(s) to optimise; two give a multi-objective search")
    parser.add_argument("--replicates", type=int, default=1, metavar="K",
                        help="each Optuna trial runs its config on the first K seeds of --seeds, on every setup "
                             "(--datasets × --archs), each a row of the store; Optuna sees their --aggregate")
    parser.add_argument("--aggregate", default="mean", choices=AGGREGATES,
                        help="what Optuna sees of an objective's replicates: mean, median, worst (the max of a "
                             "minimised objective, the min of a maximised one), or mean_plus_std (the mean moved "
                             "one sample standard deviation towards worse)")
    parser.add_argument("--confirm", type=int, default=0, metavar="N",
                        help="re-run the chosen config and its method's default row on N seeds the search never "
                             "used (those of --seeds after the searched ones, then the integers after the largest), "
                             "into a table with ▲/▼ against the default (study <study>_confirm); 0: none")
    parser.add_argument("--confirm-against", nargs="+", default=[], choices=METHOD_ROWS, type=row_label,
                        metavar="ROW", help="with --confirm: also run these rows of the method comparison (e.g. "
                                            "CE+TS) on the fresh seeds, in the confirm table; from: %(choices)s")
    parser.add_argument("--per-setup", action="store_true",
                        help="search each setup of --datasets × --archs on its own (study <study>_<dataset>_<arch>, "
                             "its replicates the seeds of that setup) and write one row file per setup")
    parser.add_argument("--sampler", default="tpe", choices=SAMPLERS, help="Optuna sampler")
    parser.add_argument("--sampler-seed", type=int, default=0, help="seed of the Optuna sampler")
    parser.add_argument("--tpe-window", type=int, default=DEFAULT_TPE_WINDOW, metavar="N",
                        help="TPE conditions on the best N/2 and the latest N/2 finished trials once the study "
                             "holds more than N (its cost per ask grows with the trials: about 1 s at 100,000); "
                             "0: on all of them")
    parser.add_argument("--scheduler", default="none", choices=SCHEDULERS,
                        help="stop unpromising trials during Stage I: Ray Tune's ASHA or HyperBand, on the "
                             "objective's per-epoch validation value (spaces that change Stage I only; one "
                             "replicate)")
    parser.add_argument("--grace-period", type=int, default=None,
                        help="ASHA: Stage-I epochs every trial runs before it can be stopped (default: a quarter "
                             "of the Stage-I epochs: quick 15, paper 87)")
    parser.add_argument("--reduction-factor", type=float, default=3.0,
                        help="ASHA / HyperBand: η, a trial continues past a rung if in the best 1/η")


def check_search_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag, value, least in (("--num-trials", args.num_trials, 1), ("--replicates", args.replicates, 1),
                               ("--confirm", args.confirm, 0)):
        if value < least:
            parser.error(f"{flag} must be >= {least}, got {value}")
    if args.confirm_against and not args.confirm:
        parser.error(f"--confirm-against {' '.join(args.confirm_against)} needs --confirm N (the fresh seeds it runs "
                     f"on)")
    if args.tpe_window < 0:
        parser.error(f"--tpe-window must be >= 0 (finished trials; 0: all), got {args.tpe_window}")
    if not is_seed(args.sampler_seed):
        rule = seed_rule("--sampler-seed", why="Optuna's samplers seed NumPy with it")
        parser.error(f"--sampler-seed must {rule}, got {args.sampler_seed}")


def report_search(completed, space, objective: str, replicates: Replicates, study: str, paths) -> None:
    """Importances, slice and history plots of the objective Optuna saw: one point per Optuna trial (a replicated
    search's aggregate over its replicates, not each replicate's value)."""
    value = f"each the {replicates.how} of {len(replicates)} replicates" if len(replicates) > 1 else ""
    with report_step(study, "importances"):
        importance = importance_report(completed, space, objective, paths.outputs / "report", study, value)
        if importance.importances:
            print(f"\nfANOVA importance for {objective}: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in importance.importances.items()))
        for note in importance.notes:
            print(f"[{study}] {note}")
        print(f"importances, slice and history plots: {', '.join(str(f) for f in importance.files)}")


def searched_setups(args, preset, study: str) -> list[tuple[str, list]]:
    """(study, setups) of each search the command runs: one over every setup, or with --per-setup one per setup
    (``<study>_<dataset>_<arch>``)."""
    setups = study_setups(args, preset)
    if not args.per_setup:
        return [(study, setups)]
    if preset.dataset_sources:
        raise ConfigError(f"--per-setup searches the setups of --datasets × --archs; the preset {preset.name} "
                          f"fixes its setups: run one search per setup with --datasets and --archs instead.")
    return [(f"{study}_{re.sub(r'[^A-Za-z0-9_.-]', '-', f'{d}_{a}')}", [(d, a)]) for d, a in setups]


def confirm_rows(args) -> int:
    """The rows --confirm runs for one chosen config: it, its method's default row and the --confirm-against rows."""
    return 2 + len(dict.fromkeys(args.confirm_against))


def checked_count(args, checked: CheckedOnly, study: str, setups: list) -> CheckedOnly:
    """``checked`` (the search's replicate trials) with the --confirm trials added: the default row, the chosen
    config and the --confirm-against rows, on --confirm seeds of each setup (at most: those stored do not run)."""
    if not args.confirm:
        return checked
    rows = confirm_rows(args)
    runs = rows * args.confirm * len(setups)
    each = " per chosen config" if len(args.objective) > 1 else ""
    plural = "s" if len(setups) > 1 else ""
    detail = (checked.detail[:-1] + ", then" if checked.detail else " (then") + \
        f" at most {runs} confirm trials: {rows} rows × {args.confirm} seeds × {len(setups)} setup{plural}{each})"
    return CheckedOnly(study, checked.pending + runs, detail)


def search_one(args, space, study: str, setups: list, preset, paths) -> tuple[int, int] | CheckedOnly:
    """Run the search ``study`` over ``setups``, report it, write its row files and --confirm them: its failed and
    finished trials (--check-only: what would run)."""
    bases = bases_with_settings(args, replicate_bases(args, preset, space, study, paths, setups), space)
    replicates = Replicates(tuple(bases), args.aggregate)
    options = execution_options(args, preset)
    confirm_bases = [{**bases[0], "dataset": d, "arch": a, "seed": seed}
                     for d, a in setups for seed in confirm_seeds(args, preset, study, [b["seed"] for b in bases])[0]
                     for _ in range(confirm_rows(args) if args.confirm else 0)]
    print(settings_line(study, preset, list(replicates.bases) * args.num_trials + confirm_bases, options))
    shown = ", ".join(f"{d}/{a} seed {s}" for d, a, s in replicates.described())
    print(f"[{study}] sampler {args.sampler} · objective {args.objective}"
          + (f" ({args.aggregate} of {len(replicates)} replicates)" if len(replicates) > 1 else "")
          + f" · {shown} · store {paths.store}")
    scheduler = SchedulerSettings(args.scheduler, args.grace_period, args.reduction_factor)
    run = run_search(replicates.bases[0], space, store=paths.store, study=study, num_trials=args.num_trials,
                     objectives=args.objective, sampler=args.sampler, seed=args.sampler_seed,
                     options=options, scheduler=scheduler, tpe_window=args.tpe_window, replicates=replicates)
    if isinstance(run, CheckedOnly):
        return checked_count(args, run, study, setups)
    trials = read_finished(paths.store, study, run.trial_ids)
    completed = completed_trials(paths.store, study)
    with report_step(study, "best-trials table"):
        print_best(completed, space, args.objective, replicates)
    report_search(completed, space, args.objective[0], replicates, study, paths)
    chosen = chosen_trials(completed, args.objective)
    files = write_chosen(chosen, completed, space, replicates, args.objective, study, paths) \
        if not chosen.empty else []
    print(f"\nstore: {paths.store} (study={study}, {len(trials)} finished trials; Optuna study: "
          f"{journal_location(paths.store, study)})")
    failed, finished = run.failed, len(trials)
    if args.confirm and files:
        confirmed = confirm(args, files, study, [s for _, _, s in replicates.described()], setups)
        if isinstance(confirmed, CheckedOnly):
            return confirmed
        failed, finished = failed + confirmed[0], finished + confirmed[1]
    return failed, finished


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=None, study_default="search_<name of the space file>",
                          figures=True)
    add_search_args(parser)
    args = parser.parse_args(argv)
    check_search_args(parser, args)
    space = load_search_space(args.space)
    study = args.study or f"search_{Path(args.space).stem}"
    preset = preset_of(args)
    paths = study_paths(args)
    args.study = study
    searches = searched_setups(args, preset, study)
    failed, finished, checked = 0, 0, []
    for name, setups in searches:
        result = search_one(args, space, name, setups, preset, paths)
        if isinstance(result, CheckedOnly):
            checked.append(result)
            continue
        failed, finished = failed + result[0], finished + result[1]
    if checked:
        if len(checked) == 1:
            return checked[0]
        for one in checked:
            print(one)
        return CheckedOnly(study, sum(c.pending for c in checked), f" (in {len(checked)} searches, one per setup)")
    return study_exit_code(study, paths.store, failed, finished)


if __name__ == "__main__":
    raise SystemExit(main())
