"""Does calibration hold under distribution shift? ECE per corruption severity (MaC-Cal Fig. 5).

Each method's fitted model is evaluated on the corrupted test sets of its dataset, severities 1-5:
CIFAR-10-C / CIFAR-100-C as published (all 19 corruptions; extract them into --data-root), and on the
quick preset ``digits-C``, which this study generates from the digits test split in the same file
layout (the corruptions of ``calib.datasets.corruptions.GENERATED``) and loads through the same
loader. Prints ECE and accuracy per severity, averaged over corruptions, and writes ECE against
severity per method.
"""

from __future__ import annotations

import argparse

import pandas as pd

from calib._config import ConfigError
from calib.datasets.corruptions import (
    C_DIRECTORY,
    CORRUPTIONS,
    GENERATED,
    SEVERITIES,
    ensure_digits_c,
    load_corrupted,
)
from calib.methods.vanilla import UNCALIBRATED_LABEL
from calib.report import report_step, summarize
from calib.report.figures import plot_metric_against
from calib.run import CheckedOnly
from calib.study.declaration import declare_study, run_row_study
from calib.study.flags import add_table_args, study_parser
from calib.study.main import guarded_main
from calib.study.paths import study_paths
from calib.study.row_file import add_row_args
from calib.study.rows import METHOD_ROWS, POSTHOC_ROWS, row_label

ROWS = [UNCALIBRATED_LABEL, *POSTHOC_ROWS, "TST", "V-TST", "MaC-Cal"]
STUDY = declare_study("corruption", __doc__, figure="severity", rows=METHOD_ROWS, metrics={
    "corrupted_ece": "ECE (corrupted)", "corrupted_accuracy": "Acc (all)", "test_ece": "ECE clean"})


def per_severity(trials: pd.DataFrame) -> dict[str, str]:
    """:data:`STUDY`'s metrics with the corrupted ECE per severity (``corrupted_ece_s<k>``, added to ``trials``)
    in place of its mean over severities."""
    metrics = {}
    for i, severity in enumerate(SEVERITIES):
        trials[f"corrupted_ece_s{severity}"] = trials["corrupted_ece_by_severity"].map(lambda v, i=i: v[i])
        metrics[f"corrupted_ece_s{severity}"] = f"ECE s{severity}"
    return {**metrics, **{key: header for key, header in STUDY.metrics.items() if key != "corrupted_ece"}}


def evaluation_for(args: argparse.Namespace):
    root = study_paths(args).data_root

    def evaluation(dataset: str) -> dict:
        if dataset in ("digits", "digits-noisy"):
            ensure_digits_c(root)
            return {"corruptions": list(GENERATED)}
        if dataset not in C_DIRECTORY:
            raise ConfigError(f"No corrupted test sets for {dataset!r}; they exist for {', '.join(C_DIRECTORY)}.")
        load_corrupted(str(root), dataset, CORRUPTIONS[0], 1)  # fails early, naming the expected files
        return {"corruptions": list(CORRUPTIONS)}

    return evaluation


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=STUDY.name, figures=True)
    add_table_args(parser)
    parser.add_argument("--methods", nargs="+", default=ROWS, choices=METHOD_ROWS, type=row_label, metavar="ROW",
                        help=f"rows to run, from: %(choices)s (default: {', '.join(ROWS)})")
    add_row_args(parser)
    args = parser.parse_args(argv)
    return run_row_study(args, {label: METHOD_ROWS[label] for label in args.methods}, STUDY.metrics,
                         table=METHOD_ROWS, evaluation=evaluation_for(args), columns=per_severity,
                         report=lambda trials: severity_figures(args, trials))


def severity_figures(args: argparse.Namespace, trials: pd.DataFrame) -> None:
    """ECE against severity per (dataset, architecture), one line per row, mean over corruptions."""
    long = pd.DataFrame([{"row": row, "dataset": d, "arch": a, "severity": s, "ece": eces[s - 1]}
                         for row, d, a, eces in zip(trials["row"], trials["dataset"], trials["arch"],
                                                    trials["corrupted_ece_by_severity"], strict=True)
                         for s in SEVERITIES])
    for (dataset, arch), group in (long.groupby(["dataset", "arch"]) if not long.empty else []):
        with report_step(args.study, f"severity figure for {dataset} · {arch}"):
            figure = study_paths(args).outputs / "figures" / f"{args.study}_{dataset}_{arch}.png"
            figure = plot_metric_against(summarize(group, ["row", "severity"], ["ece"]), "severity", "ece", "row",
                                         figure, xlabel="corruption severity", ylabel="ECE (%), mean over corruptions",
                                         title=f"corruptions · {dataset} · {arch}")
            print(f"figure: {figure}")


if __name__ == "__main__":
    raise SystemExit(main())
