"""How sensitive is MaC-Cal to γ, the down-weighting of training accuracy in its retention update?

A grid over γ × seeds (every other hyperparameter at its default) plus the vanilla Stage-I model per
seed. Prints test ECE (mean ± 95% CI over seeds) and accuracy per γ, the row of γ chosen per seed on
validation ECE, and writes a figure with ECE against γ and the q_t trajectories per γ (MaC-Cal
Figs. 7-8). ``--estimated-gamma`` adds calib's γ estimated from the data (the Stage-I model's
validation accuracy ÷ its accuracy on the statistics' images); ``--stats-source`` says where every
MaC-Cal row measures the statistics of its q update. Re-running skips finished trials.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.dataset as pads

from calib.methods.mac_cal import STATS_SPLITS
from calib.methods.vanilla import UNCALIBRATED_LABEL
from calib.registries import METHODS
from calib.report import mixed_trainings, report_step, summarize, to_markdown
from calib.report.figures import plot_gamma_sensitivity
from calib.run import CheckedOnly, run_grid
from calib.store import read_finished, read_history
from calib.study.declaration import declare_study
from calib.study.flags import study_parser
from calib.study.main import guarded_main, study_exit_code
from calib.study.paths import study_paths
from calib.study.resources import execution_options, settings_line
from calib.study.settings import with_settings
from calib.study.sources import preset_of, require_datasets, study_seeds, study_setups, trial_config

DEFAULT_GAMMAS = (0.8, 0.85, 0.9, 0.95, 1.0)
STUDY = declare_study("sensitivity_gamma", __doc__, figure="gamma", metrics={
    "test_ece": "ECE (%)", "test_accuracy": "Acc (%)", "test_aece": "AECE (%)", "test_mce": "MCE (%)"})
METRICS = STUDY.metrics


def _is_estimated(mac: pd.DataFrame) -> pd.Series:
    source = mac.get("method_accuracy_weight_source", pd.Series("fixed", index=mac.index))
    return source.fillna("fixed") == "estimated"


def validation_chosen(mac: pd.DataFrame) -> pd.DataFrame:
    """Per seed, the fixed-γ trial with the lowest validation ECE (ties: the smaller γ)."""
    fixed = mac[~_is_estimated(mac)].sort_values(["seed", "val_ece", "method_accuracy_weight"])
    return fixed.groupby("seed", observed=True).head(1)


def print_report(trials: pd.DataFrame, *, study: str, store: str, figures: Path, gammas: list[float]) -> None:
    """Per (dataset, architecture): the table of vanilla and each γ (naming the rows with no finished
    trial), γ chosen per seed on validation ECE, and the γ figure with the q_t trajectories read from
    the store's history."""
    for (dataset, arch), by_dataset in trials.groupby(["dataset", "arch"], observed=True):
        vanilla = by_dataset[by_dataset["method"] == "vanilla"]
        mac = by_dataset[by_dataset["method"] == "mac_cal"]
        estimated = mac[_is_estimated(mac)]
        mac = mac[~_is_estimated(mac)]
        with report_step(study, f"table for {dataset} · {arch}"):
            parts = [summarize(rows, by, list(METRICS)).rename(columns={"method_accuracy_weight": "γ"})
                     for rows, by in ((vanilla, ["method"]), (mac, ["method", "method_accuracy_weight"]))
                     if not rows.empty]
            if not estimated.empty:
                gamma = estimated["estimated_gamma"]
                parts.append(summarize(estimated, ["method"], list(METRICS)).assign(
                    γ=f"estimated ({gamma.mean():.3f}, {gamma.min():.3f}–{gamma.max():.3f})"))
            if not mac.empty:
                chosen = validation_chosen(mac)
                picks = ", ".join(f"{g:g}" for g in chosen["method_accuracy_weight"])
                parts.append(summarize(chosen, ["method"], list(METRICS)).assign(γ=f"on val ECE ({picks})"))
            table = pd.concat(parts, ignore_index=True)
            table["γ"] = ["–" if pd.isna(g) else g for g in table.get("γ", [None] * len(table))]
            table["method"] = [METHODS.get(name).label or name for name in table["method"]]
            print(f"\n{dataset} · {arch} · mean ± 95% CI over seeds (test split)\n")
            print(to_markdown(table, ["method", "γ"], METRICS))
            if note := mixed_trainings(by_dataset):
                print(f"\n{note}")
            missing = ([] if not vanilla.empty else [UNCALIBRATED_LABEL]) + [
                f"γ={g:g}" for g in sorted(gammas) if not (mac["method_accuracy_weight"] == g).any()]
            if missing:
                print(f"\nno finished trial for: {', '.join(missing)}")
        if mac.empty:
            print(f"[{study}] γ figure for {dataset} · {arch} not drawn: no MaC-Cal trial finished")
            continue
        with report_step(study, f"γ figure for {dataset} · {arch}"):
            in_run = pads.field("trial_id").isin(list(mac["trial_id"]))
            history = read_history(store, study=study, filters=in_run & (pads.field("stage") == "stage2"))
            v = summarize(vanilla, ["method"], ["test_ece"]) if not vanilla.empty else None
            figure = figures / f"{study}_{dataset}_{arch}.png"
            figure = plot_gamma_sensitivity(
                summarize(mac, ["method_accuracy_weight"], ["test_ece"]),
                history.merge(mac[["trial_id", "method_accuracy_weight"]], on="trial_id"), figure,
                vanilla=None if v is None else (v["test_ece_mean"].iloc[0], v["test_ece_ci"].iloc[0]),
                title=f"MaC-Cal γ sensitivity · {dataset} · {arch}",
            )
            print(f"\nfigure: {figure}")


def with_estimated_gamma(trials: pd.DataFrame, store: str, study: str) -> pd.DataFrame:
    """``trials`` with ``estimated_gamma``: the γ an estimated-γ trial used, read from its history."""
    if "method_accuracy_weight_source" not in trials or not _is_estimated(trials).any():
        return trials.assign(estimated_gamma=float("nan"))
    ids = list(trials.loc[_is_estimated(trials), "trial_id"])
    history = read_history(store, study=study, filters=pads.field("trial_id").isin(ids)
                           & (pads.field("stage") == "stage2"))
    gamma = history.groupby("trial_id")["accuracy_weight"].first()
    return trials.assign(estimated_gamma=trials["trial_id"].map(gamma))


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=STUDY.name, figures=True)
    parser.add_argument("--gammas", type=float, nargs="+", default=list(DEFAULT_GAMMAS), help="γ values")
    parser.add_argument("--estimated-gamma", action="store_true",
                        help="add a MaC-Cal row whose γ is estimated from the data: the Stage-I model's validation "
                             "accuracy ÷ its accuracy on the statistics' images (calib's extension, not the "
                             "paper's method)")
    parser.add_argument("--stats-source", default="train", choices=list(STATS_SPLITS),
                        help="where every MaC-Cal row measures Acc_t and Conf_t of its q update: the training "
                             "features (the paper), the training images Stage I did not train on (needs "
                             "--train-size), or augmented views of the training images (default: train)")
    args = parser.parse_args(argv)
    preset = preset_of(args)
    paths = study_paths(args)
    setups = study_setups(args, preset)
    seeds = study_seeds(args, preset)
    require_datasets(list(dict.fromkeys(d for d, _ in setups)), paths.data_root, args.download)
    options = execution_options(args, preset)

    configs = []
    for dataset, arch in setups:
        for seed in seeds:
            setup = {"dataset": dataset, "arch": arch, "seed": seed}
            configs.append({**trial_config(args, preset, method={"name": "vanilla"}, **setup),
                            "label": UNCALIBRATED_LABEL, "label_rank": 0})
            source = {} if args.stats_source == "train" else {"stats_source": args.stats_source}
            configs += [{**trial_config(args, preset, method={"name": "mac_cal", "accuracy_weight": g, **source},
                                        **setup), "label": f"MaC-Cal γ={g:g}", "label_rank": rank}
                        for rank, g in enumerate(sorted(args.gammas), start=1)]
            if args.estimated_gamma:
                method = {"name": "mac_cal", "accuracy_weight_source": "estimated", **source}
                configs.append({**trial_config(args, preset, method=method, **setup), "label": "MaC-Cal γ=estimated",
                                "label_rank": len(args.gammas) + 1})
    configs = with_settings(args, configs)
    print(settings_line(args.study, preset, configs, options))
    print(f"[{args.study}] setups {', '.join(f'{d}/{a}' for d, a in setups)} · seeds {seeds} · γ {args.gammas}"
          f"{' + estimated' if args.estimated_gamma else ''} · q statistics from {args.stats_source} "
          f"· store {paths.store}")
    run = run_grid(configs, store=paths.store, study=args.study, options=options)
    if isinstance(run, CheckedOnly):
        return run

    trials = read_finished(paths.store, args.study, run.trial_ids)
    trials = with_estimated_gamma(trials, paths.store, args.study)
    print_report(trials, study=args.study, store=paths.store, figures=paths.outputs / "figures", gammas=args.gammas)
    print(f"\nstore: {paths.store} ({len(trials)} finished trials of this run; {run.skipped} were already there)")
    print(f"load: python -c \"import pandas as pd; print(pd.read_parquet('{paths.store}/trials'))\"")
    return study_exit_code(args.study, paths.store, run.failed, len(trials))


if __name__ == "__main__":
    raise SystemExit(main())
