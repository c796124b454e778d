"""Which of MaC-Cal's components make the difference? An ablation ladder through Ray Tune (Table 5).

Runs a ladder file (default: studies/ladders/mac_cal.yaml, Vanilla → +Masked Retraining →
+Gradient Restriction → +Classifier Restructure → +Static → +Decaying Adaptive Sparsity) in
``incremental`` mode (each row adds a component), ``leave_one_out`` (the full method minus one) or
``factorial`` (every subset). Each step × seed is one trial; steps share the Stage-I artifact.
Prints Acc, ECE, AECE, MCE (mean ± 95% CI over seeds) and the change in ECE against the previous
row (incremental) or the full method (leave-one-out).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.dataset as pads

from calib._config import ConfigError
from calib.report import mixed_trainings, report_step, to_markdown
from calib.report.figures import plot_retention
from calib.report.policy import compare_setup
from calib.report.significance_tables import MARKS
from calib.run import CheckedOnly, run_grid
from calib.store import read_finished, read_history
from calib.study.ablation import MODES, load_ladder
from calib.study.declaration import declare_study
from calib.study.flags import add_table_args, study_parser
from calib.study.main import guarded_main, study_exit_code
from calib.study.paths import study_paths
from calib.study.presets import with_preset_stage2
from calib.study.resources import execution_options, settings_line
from calib.study.row_file import add_row_args, file_rows
from calib.study.settings import with_settings
from calib.study.sources import preset_of, require_datasets, study_seeds, study_setups, trial_config

DEFAULT_LADDER = Path(__file__).resolve().parent / "ladders" / "mac_cal.yaml"
STUDY = declare_study("ablation", __doc__, figure="bars", ladder=str(DEFAULT_LADDER), metrics={
    "test_accuracy": "Acc", "test_ece": "ECE", "test_aece": "AECE", "test_mce": "MCE"})
METRICS = STUDY.metrics


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=STUDY.name, figures=True)
    add_table_args(parser)
    parser.add_argument("--ladder", default=str(DEFAULT_LADDER), help="ladder file (YAML)")
    parser.add_argument("--mode", default="incremental", choices=MODES, help="how components are combined")
    add_row_args(parser)
    args = parser.parse_args(argv)
    ladder = load_ladder(args.ladder)
    preset = preset_of(args)
    paths = study_paths(args)
    setups = study_setups(args, preset)
    seeds = study_seeds(args, preset)
    require_datasets(list(dict.fromkeys(d for d, _ in setups)), paths.data_root, args.download)
    options = execution_options(args, preset)

    rows_from_files = file_rows(args)
    configs, order = [], []
    for dataset, arch in setups:
        for seed in seeds:
            base = trial_config(args, preset, dataset=dataset, arch=arch, seed=seed, method={"name": "vanilla"})
            steps, skipped = ladder.steps(base, args.mode)
            for step in steps:
                if step.label not in order:
                    order.append(step.label)
                config = with_preset_stage2(preset, step.config)
                configs.append({**config, "label": step.label, "label_rank": order.index(step.label)})
            for label, row in rows_from_files:  # a searched config (a row file) after the ladder's steps
                if label in (step.label for step in steps):
                    raise ConfigError(f"--row: the label {label!r} is already a step of the ladder; give the file "
                                      f"another one: --row FILE LABEL.")
                if label not in order:
                    order.append(label)
                config = trial_config(args, preset, dataset=dataset, arch=arch, seed=seed, method=dict(row.method),
                                      loss=dict(row.loss))
                config["stage1"].update(row.stage1)
                configs.append({**config, "label": label, "label_rank": order.index(label)})
    for note in dict.fromkeys(skipped):
        print(f"[{args.study}] skipped step {note}")
    configs = with_settings(args, configs)
    print(settings_line(args.study, preset, configs, options))
    print(f"[{args.study}] ladder {args.ladder} ({args.mode}: {len(order)} steps) · seeds {seeds}")
    run = run_grid(configs, store=paths.store, study=args.study, options=options)
    if isinstance(run, CheckedOnly):
        return run

    trials = read_finished(paths.store, args.study, run.trial_ids)
    trials["step"] = pd.Categorical(trials["label"], categories=order, ordered=True)
    for (dataset, arch), group in trials.groupby(["dataset", "arch"], observed=True):
        with report_step(args.study, f"table for {dataset} · {arch}"):
            comparison = compare_setup(group, METRICS, args.control or order[0], store=paths.store, study=args.study,
                                       test=args.test)
            table = comparison.summary()
            first = table["test_ece_mean"].iloc[0]
            reference = table["test_ece_mean"].shift(1) if args.mode == "incremental" else first
            delta = 100 * (table["test_ece_mean"] - reference)
            table["step"] = [f"{s} (Δ ECE {d:+.2f})" if pd.notna(d) and i > 0 else str(s)
                             for i, (s, d) in enumerate(zip(table["label"], delta, strict=True))]
            shown = dict(zip(table["label"], table["step"], strict=True))
            marks = {(shown[label], metric): MARKS[verdict]
                     for (label, metric), verdict in comparison.markers().items()}
            print(f"\n{dataset} · {arch} · test split · mean ± 95% CI over seeds (percent)\n")
            print(to_markdown(table, ["step"], METRICS, marks=marks))
            for line in comparison.legend:
                print(f"\n{line}")
            if note := mixed_trainings(group):
                print(f"\n{note}")
            missing = [step for step in order if not (group["step"] == step).any()]
            if missing:
                print(f"\nno finished trial for: {', '.join(missing)} (Δ ECE is against the row above in the table)")
        with report_step(args.study, f"q_t figure for {dataset} · {arch}"):
            figure = retention_figure(paths.store, args.study, group, paths.outputs / "figures" /
                                      f"{args.study}_{dataset}_{arch}_retention.png", f"{dataset} · {arch}")
            if figure is not None:
                print(f"\nfigure (q_t per step): {figure}")
    print(f"\nstore: {paths.store} ({len(trials)} finished trials of this run; {run.skipped} were already there)")
    return study_exit_code(args.study, paths.store, run.failed, len(trials))


def retention_figure(store: str, study: str, trials: pd.DataFrame, path: Path, setup: str) -> Path | None:
    """q_t per epoch of every step whose q_t changes (adaptive retention), mean over seeds; None when no
    step adapts q."""
    history = read_history(store, study=study, filters=pads.field("trial_id").isin(list(trials["trial_id"]))
                           & (pads.field("stage") == "stage2"))
    history = history.merge(trials[["trial_id", "step"]], on="trial_id").dropna(subset=["retention_prob"])
    adapting = history.groupby("step", observed=True)["retention_prob"].nunique()
    history = history[history["step"].isin(adapting[adapting > 1].index)].sort_values("step")
    if history.empty:
        return None
    return plot_retention(history.assign(step=history["step"].astype(str)), "step", path,
                          title=f"{study} · {setup}: q_t per step")


if __name__ == "__main__":
    raise SystemExit(main())
