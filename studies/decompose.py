"""Are the methods' remaining errors over- or under-confidence? ECE split into O-ECE + U-ECE (FeDLaS Table 4).

O-ECE sums the bins whose confidence exceeds their accuracy, U-ECE the others; O-ECE + U-ECE = ECE
on the same 15 bins (docs/methods.md §6.4).
"""

from __future__ import annotations

from calib.methods.vanilla import UNCALIBRATED_LABEL
from calib.run import CheckedOnly
from calib.study.declaration import declare_study, run_row_study
from calib.study.flags import add_table_args, study_parser
from calib.study.main import guarded_main
from calib.study.row_file import add_row_args
from calib.study.rows import POSTHOC_ROWS, Row, loss_row, method_row, row_label

TABLE4_LOSSES = ("label_smoothing", "fedlas_ls", "mbls", "fedlas_mbls")
"""The Stage-I losses of FeDLaS Table 4, by registered name (their rows' labels are their specs')."""
ROWS = {UNCALIBRATED_LABEL: Row(), **dict(loss_row(name) for name in TABLE4_LOSSES), **POSTHOC_ROWS,
        **dict([method_row("mac_cal")])}
STUDY = declare_study("decompose", __doc__, rows=ROWS,
                      metrics={"test_ece": "ECE", "test_oece": "O-ECE", "test_uece": "U-ECE", "test_accuracy": "Acc"})


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=STUDY.name)
    add_table_args(parser)
    parser.add_argument("--methods", nargs="+", default=list(ROWS), choices=list(ROWS), type=row_label, metavar="ROW",
                        help=f"rows to run, from: {', '.join(ROWS)} (default: all of them)")
    add_row_args(parser)
    args = parser.parse_args(argv)
    return run_row_study(args, {label: ROWS[label] for label in args.methods}, STUDY.metrics, table=ROWS)


if __name__ == "__main__":
    raise SystemExit(main())
