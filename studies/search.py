"""Search a method's hyperparameters with Optuna (TPE by default) through Ray Tune.

Samples configs from a search-space file until the study holds ``--num-trials`` finished trials,
runs each as a trial into the store and prints the best trials by the validation objective(s) (for
two objectives, the Pareto front), then the fANOVA importance of each parameter and a slice plot
(written to <store>/report/). Re-running a study resumes it: its stored trials are told to the
sampler first and only the missing ones run; a larger --num-trials extends it. The Optuna study is
kept in <store>/optuna/ (optuna-dashboard opens it). --scheduler asha|hyperband stops unpromising
trials during Stage I (stored as pruned). The test split never drives the search; its numbers are
shown for the selected trials only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calib._config import ConfigError
from calib.config import SEED_LIMIT, set_dotted
from calib.metrics import higher_is_better
from calib.presets import base_config
from calib.report import format_mean_ci, report_step
from calib.search import SAMPLERS, SCHEDULERS, CheckedOnly, SchedulerSettings, load_search_space, run_search
from calib.search.importance import importance_report
from calib.search.journal import journal_location
from calib.search.optimize import DEFAULT_TPE_WINDOW
from calib.store import read_finished
from calib.study.flags import study_parser
from calib.study.main import guarded_main, study_exit_code
from calib.study.paths import study_paths
from calib.study.resources import execution_options, settings_line
from calib.study.settings import study_settings, with_settings
from calib.study.sources import preset_of, require_datasets, study_setups


def pareto_front(df, objectives: list[str]):
    """Rows not dominated on ``objectives`` (each oriented by its metric's direction)."""
    values = np.column_stack([df[o].to_numpy() * (-1 if higher_is_better(o.split("_", 1)[1]) else 1)
                              for o in objectives])
    keep = [not any(np.all(other <= row) and np.any(other < row) for other in values) for row in values]
    return df[keep]


def print_best(trials, space, objectives: list[str]) -> None:
    """The 5 best finished trials by the objective, or the Pareto front of two or more objectives."""
    if trials.empty:
        return
    columns = [f"{k.replace('.', '_')}" for k in space.parameters]
    if len(objectives) == 1:
        objective = objectives[0]
        best = trials.sort_values(objective, ascending=not higher_is_better(objective.split("_", 1)[1])).head(5)
        print(f"\nbest {len(best)} of {len(trials)} trials by {objective}:")
    else:
        best = pareto_front(trials, objectives)
        print(f"\nPareto front of {len(trials)} trials on {objectives}:")
    for _, row in best.iterrows():
        params = ", ".join(f"{c}={row[c]:.4g}" if isinstance(row[c], float) else f"{c}={row[c]}" for c in columns)
        scores = " · ".join(f"{o} {format_mean_ci(row[o], float('nan'))}%" for o in objectives)
        print(f"  {row['trial_id']}  {scores} · test_ece {format_mean_ci(row['test_ece'], float('nan'))}% "
              f"· test_accuracy {format_mean_ci(row['test_accuracy'], float('nan'))}%  [{params}]")


def search_base_with_settings(args, base: dict, space) -> dict:
    """``base`` with ``--set`` and ``--stage2-seeds`` applied; a key the space searches or fixes, or more than one
    Stage-II seed (a search runs one config a sample), is a ``ConfigError``."""
    for setting in study_settings(args):
        if setting.key in space.parameters or setting.key in space.base:
            what = "searches" if setting.key in space.parameters else "fixes"
            raise ConfigError(f"`--set {setting}`: the search space {args.space} {what} {setting.key}; change it in "
                              f"the space file (or a copy of it) instead.")
    if args.stage2_seeds and len(set(args.stage2_seeds)) > 1:
        raise ConfigError(f"`--stage2-seeds` takes one seed in a search (each sampled config runs once, on the first "
                          f"of --seeds), got --stage2-seeds {' '.join(map(str, args.stage2_seeds))}.")
    return with_settings(args, [base])[0]


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=None, study_default="search_<name of the space file>")
    parser.add_argument("--space", required=True, help="search-space YAML file (search_spaces/*.yaml)")
    parser.add_argument("--num-trials", type=int, default=20,
                        help="finished trials the study should hold; the stored ones count, only the rest run")
    parser.add_argument("--objective", nargs="+", default=["val_ece"],
                        help="validation metric(s) to optimise; two give a multi-objective search")
    parser.add_argument("--sampler", default="tpe", choices=SAMPLERS, help="Optuna sampler")
    parser.add_argument("--sampler-seed", type=int, default=0, help="seed of the Optuna sampler")
    parser.add_argument("--tpe-window", type=int, default=DEFAULT_TPE_WINDOW, metavar="N",
                        help="TPE conditions on the best N/2 and the latest N/2 finished trials once the study "
                             "holds more than N (its cost per ask grows with the trials: about 1 s at 100,000); "
                             "0: on all of them")
    parser.add_argument("--scheduler", default="none", choices=SCHEDULERS,
                        help="stop unpromising trials during Stage I: Ray Tune's ASHA or HyperBand, on the "
                             "objective's per-epoch validation value (spaces that change Stage I only)")
    parser.add_argument("--grace-period", type=int, default=None,
                        help="ASHA: Stage-I epochs every trial runs before it can be stopped (default: a quarter "
                             "of the Stage-I epochs: quick 15, paper 87)")
    parser.add_argument("--reduction-factor", type=float, default=3.0,
                        help="ASHA / HyperBand: η, a trial continues past a rung if in the best 1/η")
    args = parser.parse_args(argv)
    if args.num_trials < 1:
        parser.error(f"--num-trials must be >= 1, got {args.num_trials}")
    if args.tpe_window < 0:
        parser.error(f"--tpe-window must be >= 0 (finished trials; 0: all), got {args.tpe_window}")
    if not 0 <= args.sampler_seed < SEED_LIMIT:
        parser.error(f"--sampler-seed must be an integer with 0 <= seed < 2**32 (Optuna's samplers seed NumPy with "
                     f"it), got {args.sampler_seed}")
    space = load_search_space(args.space)
    study = args.study or f"search_{Path(args.space).stem}"
    preset = preset_of(args)
    paths = study_paths(args)
    dataset, arch = study_setups(args, preset)[0]
    seed = (args.seeds or list(preset.seeds))[0]
    require_datasets([dataset], paths.data_root, args.download)
    options = execution_options(args, preset)
    base = base_config(preset, study=study, dataset=dataset, arch=arch, seed=seed,
                       method={"name": space.base.get("method.name", "mac_cal")},
                       data_root=str(paths.data_root), artifact_root=paths.artifacts,
                       download=args.download, device=args.device)
    for key, value in space.base.items():
        base = set_dotted(base, key, value)
    args.study = study
    base = search_base_with_settings(args, base, space)
    print(settings_line(study, preset, [base], options))
    print(f"[{study}] sampler {args.sampler} · objective {args.objective} · "
          f"{dataset}/{arch} seed {seed} · store {paths.store}")
    scheduler = SchedulerSettings(args.scheduler, args.grace_period, args.reduction_factor)
    run = run_search(base, space, store=paths.store, study=study, num_trials=args.num_trials,
                     objectives=args.objective, sampler=args.sampler, seed=args.sampler_seed,
                     options=options, scheduler=scheduler, tpe_window=args.tpe_window)
    if isinstance(run, CheckedOnly):
        return run
    trials = read_finished(paths.store, study, run.trial_ids)
    with report_step(study, "best-trials table"):
        print_best(trials, space, args.objective)
    with report_step(study, "importances"):
        importance = importance_report(trials, space, args.objective[0], paths.outputs / "report", study)
        if importance.importances:
            print(f"\nfANOVA importance for {args.objective[0]}: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in importance.importances.items()))
        for note in importance.notes:
            print(f"[{study}] {note}")
        print(f"importances and slice plot: {', '.join(str(f) for f in importance.files)}")
    print(f"\nstore: {paths.store} (study={study}, {len(trials)} finished trials; Optuna study: "
          f"{journal_location(paths.store, study)})")
    return study_exit_code(study, paths.store, run.failed, len(trials))


if __name__ == "__main__":
    raise SystemExit(main())
