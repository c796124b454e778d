"""How do the calibration methods compare? Every loss-based, two-stage and post-hoc method (MaC-Cal Table 1).

Trains each method on the preset's setup and seeds through Ray Tune (methods that share a Stage I,
e.g. TS, SMART, TST, V-TST and MaC-Cal on a CE Stage I, share its artifact) and prints one table
from the store: accuracy, ECE, AECE, MCE, NLL, Brier, O-ECE and U-ECE per method, mean ± 95% CI
over seeds, on the test split.
"""

from __future__ import annotations

import argparse

import pandas as pd
import pyarrow.dataset as pads

from calib.cli import add_common_args, execution_options, guarded_main, preset_of, require_datasets, study_paths
from calib.presets import base_config
from calib.report import summarize, to_markdown
from calib.search import run_grid
from calib.store import read_trials

# label -> (loss, method, Stage-I extras); defaults are each component's config defaults (METHODS.md).
ROWS: dict[str, tuple[dict, dict, dict]] = {
    "Vanilla (CE)": ({"name": "cross_entropy"}, {"name": "vanilla"}, {}),
    "LS": ({"name": "label_smoothing"}, {"name": "vanilla"}, {}),
    "FL": ({"name": "focal"}, {"name": "vanilla"}, {}),
    "FLSD-53": ({"name": "flsd53"}, {"name": "vanilla"}, {}),
    "DFL": ({"name": "dual_focal"}, {"name": "vanilla"}, {}),
    "MbLS": ({"name": "mbls"}, {"name": "vanilla"}, {}),
    "ACLS": ({"name": "acls"}, {"name": "vanilla"}, {}),
    "MMCE": ({"name": "mmce"}, {"name": "vanilla"}, {}),
    "FeDLaS-LS": ({"name": "fedlas_ls"}, {"name": "vanilla"}, {}),
    "FeDLaS-MbLS": ({"name": "fedlas_mbls"}, {"name": "vanilla"}, {}),
    "Mixup": ({"name": "cross_entropy"}, {"name": "vanilla"}, {"mixup_alpha": 1.0}),
    "MIT": ({"name": "cross_entropy"}, {"name": "vanilla"}, {"mit_alpha": 1.0}),
    "CE+TS": ({"name": "cross_entropy"}, {"name": "temperature_scaling"}, {}),
    "CE+SMART": ({"name": "cross_entropy"}, {"name": "smart"}, {}),
    "TST": ({"name": "cross_entropy"}, {"name": "tst"}, {}),
    "V-TST": ({"name": "cross_entropy"}, {"name": "vtst"}, {}),
    "MaC-Cal": ({"name": "cross_entropy"}, {"name": "mac_cal"}, {}),
}
# FeDLaS's per-dataset defaults (METHODS.md §3.5); the config defaults are CIFAR-10's.
DATASET_LOSS_DEFAULTS = {
    "cifar100": {"fedlas_ls": {"smoothing": 0.1, "norm_momentum": 0.5},
                 "fedlas_mbls": {"modulation_strength": 1.0, "norm_momentum": 0.5}},
}
METRICS = {"test_accuracy": "Acc", "test_ece": "ECE", "test_aece": "AECE", "test_mce": "MCE", "test_nll": "NLL",
           "test_brier": "Brier", "test_oece": "O-ECE", "test_uece": "U-ECE"}


@guarded_main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common_args(parser, study="compare_methods")
    parser.add_argument("--methods", nargs="+", default=list(ROWS), choices=list(ROWS), metavar="ROW",
                        help=f"rows to run, from: {', '.join(ROWS)}")
    args = parser.parse_args(argv)
    preset = preset_of(args)
    paths = study_paths(args)
    datasets = args.datasets or list(preset.datasets)
    seeds = args.seeds or list(preset.seeds)
    require_datasets(datasets, paths.data_root, args.download)

    configs, labels = [], {}
    for dataset in datasets:
        for label in args.methods:
            loss, method, stage1 = ROWS[label]
            loss = {**loss, **DATASET_LOSS_DEFAULTS.get(dataset, {}).get(loss["name"], {})}
            for seed in seeds:
                config = base_config(preset, study=args.study, dataset=dataset, seed=seed, method=dict(method),
                                     loss=loss, data_root=str(paths.data_root), artifact_root=str(paths.artifacts),
                                     download=args.download, device=args.device)
                config["stage1"].update(stage1)
                configs.append(config)
                labels[len(configs) - 1] = label
    print(f"[{args.study}] preset {preset.name}: {preset.description}")
    print(f"[{args.study}] {len(args.methods)} methods · datasets {datasets} · seeds {seeds} · store {paths.store}")
    run = run_grid(configs, store=paths.store, study=args.study, options=execution_options(args, preset))

    label_of = {tid: labels[i] for i, tid in enumerate(run.trial_ids)}
    trials = read_trials(paths.store, study=args.study,
                         filters=pads.field("trial_id").isin(run.trial_ids) & (pads.field("status") == "ok"))
    if trials.empty:
        print(f"[{args.study}] no finished trial in the store: see the errors above")
        return 1
    trials["row"] = pd.Categorical(trials["trial_id"].map(label_of), categories=list(ROWS), ordered=True)
    for dataset, group in trials.groupby("dataset", observed=True):
        table = summarize(group, ["row"], list(METRICS))
        print(f"\n{dataset} · {preset.arch} · test split · mean ± 95% CI over seeds "
              "(percent; NLL in nats and Brier as they are)\n")
        print(to_markdown(table, ["row"], METRICS))
    print(f"\nstore: {paths.store} ({len(trials)} trials of this run; {run.skipped} were already there; "
          f"{run.failed} failed)")
    print(f"load: python -c \"import pandas as pd; print(pd.read_parquet('{paths.store / 'trials'}'))\"")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
