"""How does Mixup's α change calibration, and does MaC-Cal fix it? Mixup, MIT and Mixup+MaC-Cal over α (Fig. 6).

For each α: Mixup (vanilla evaluation), MIT, and MaC-Cal retrained on the Mixup Stage I (which it
shares with the Mixup row). Prints ECE and accuracy per (family, α) and writes ECE against α.
"""

from __future__ import annotations

import argparse

import pandas as pd

from calib.report import report_step, summarize
from calib.report.figures import plot_metric_against
from calib.run import CheckedOnly
from calib.study.declaration import declare_study, run_row_study
from calib.study.flags import add_table_args, study_parser
from calib.study.main import guarded_main
from calib.study.paths import study_paths
from calib.study.rows import MIXING_ROWS, RegistryRows, Row, method_row, mixup_row

DEFAULT_ALPHAS = (0.1, 0.2, 0.4, 1.0)


def rows(alphas: list[float]) -> dict[str, Row]:
    out = {}
    for alpha in alphas:
        for label, make_row in MIXING_ROWS.items():
            out[f"{label} α={alpha:g}"] = make_row(alpha)
        mac_cal, row = method_row("mac_cal", mixup_row(alpha))
        out[f"Mixup+{mac_cal} α={alpha:g}"] = row
    return out


STUDY = declare_study("mixup_alpha", __doc__, figure="alpha",
                      metrics={"test_ece": "ECE", "test_accuracy": "Acc", "test_oece": "O-ECE", "test_uece": "U-ECE"},
                      rows=RegistryRows(lambda: rows(list(DEFAULT_ALPHAS)), "mixup_alpha rows"))


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=STUDY.name, figures=True)
    add_table_args(parser)
    parser.add_argument("--alphas", type=float, nargs="+", default=list(DEFAULT_ALPHAS), help="Beta(α, α) values")
    args = parser.parse_args(argv)
    return run_row_study(args, rows(args.alphas), STUDY.metrics, report=lambda trials: alpha_figures(args, trials))


def alpha_figures(args: argparse.Namespace, trials: pd.DataFrame) -> None:
    """ECE against α per (dataset, architecture), one line per family (Mixup, MIT, Mixup+MaC-Cal)."""
    trials["family"] = trials["row"].astype(str).str.split(" α=").str[0]
    trials["alpha"] = trials["stage1_mixup_alpha"].fillna(trials["stage1_mit_alpha"])
    for (dataset, arch), group in trials.groupby(["dataset", "arch"], observed=True):
        with report_step(args.study, f"α figure for {dataset} · {arch}"):
            figure = study_paths(args).outputs / "figures" / f"{args.study}_{dataset}_{arch}.png"
            figure = plot_metric_against(summarize(group, ["family", "alpha"], ["test_ece"]), "alpha", "test_ece",
                                         "family", figure, xlabel="α of Beta(α, α)", ylabel="test ECE (%)",
                                         log_x=True, title=f"Mixup α · {dataset} · {arch}")
            print(f"figure: {figure}")


if __name__ == "__main__":
    raise SystemExit(main())
