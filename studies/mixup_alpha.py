"""How does Mixup's α change calibration, and does MaC-Cal fix it? Mixup, MIT and Mixup+MaC-Cal over α (Fig. 6).

For each α: Mixup (vanilla evaluation), MIT, and MaC-Cal retrained on the Mixup Stage I (which it
shares with the Mixup row). Prints ECE and accuracy per (family, α) and writes ECE against α.
"""

from __future__ import annotations

from calib.report import report_step, summarize
from calib.report.figures import plot_metric_against
from calib.run import CheckedOnly
from calib.study.flags import add_table_args, study_parser
from calib.study.main import guarded_main, study_exit_code
from calib.study.paths import study_paths
from calib.study.rows import MIXING_ROWS, Row, method_row, mixup_row, print_row_tables, run_rows

DEFAULT_ALPHAS = (0.1, 0.2, 0.4, 1.0)
METRICS = {"test_ece": "ECE", "test_accuracy": "Acc", "test_oece": "O-ECE", "test_uece": "U-ECE"}


def rows(alphas: list[float]) -> dict[str, Row]:
    out = {}
    for alpha in alphas:
        for label, make_row in MIXING_ROWS.items():
            out[f"{label} α={alpha:g}"] = make_row(alpha)
        mac_cal, row = method_row("mac_cal", mixup_row(alpha))
        out[f"Mixup+{mac_cal} α={alpha:g}"] = row
    return out


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study="mixup_alpha", figures=True)
    add_table_args(parser)
    parser.add_argument("--alphas", type=float, nargs="+", default=list(DEFAULT_ALPHAS), help="Beta(α, α) values")
    args = parser.parse_args(argv)
    result = run_rows(args, rows(args.alphas))
    if isinstance(result, CheckedOnly):
        return result
    trials, run = result
    print_row_tables(trials, METRICS, study=args.study, control=args.control, test=args.test,
                     store=study_paths(args).store)
    trials["family"] = trials["row"].astype(str).str.split(" α=").str[0]
    trials["alpha"] = trials["stage1_mixup_alpha"].fillna(trials["stage1_mit_alpha"])
    for (dataset, arch), group in trials.groupby(["dataset", "arch"], observed=True):
        with report_step(args.study, f"α figure for {dataset} · {arch}"):
            figure = study_paths(args).outputs / "figures" / f"{args.study}_{dataset}_{arch}.png"
            figure = plot_metric_against(summarize(group, ["family", "alpha"], ["test_ece"]), "alpha", "test_ece",
                                         "family", figure, xlabel="α of Beta(α, α)", ylabel="test ECE (%)",
                                         log_x=True, title=f"Mixup α · {dataset} · {arch}")
            print(f"figure: {figure}")
    return study_exit_code(args.study, study_paths(args).store, run.failed, len(trials))


if __name__ == "__main__":
    raise SystemExit(main())
