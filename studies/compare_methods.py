"""How do the calibration methods compare? Every loss-based, two-stage and post-hoc method (MaC-Cal Table 1).

Trains each method on the preset's setup and seeds through Ray Tune (methods that share a Stage I,
e.g. TS, SMART, TST, V-TST and MaC-Cal on a CE Stage I, share its artifact) and prints one table
from the store: accuracy, ECE, AECE, MCE, smECE, ECE-sweep, debiased L2-CE, NLL, Brier, O-ECE, U-ECE, AURC
and AUGRC per method, mean ± 95% CI over seeds, on the test split.
"""

from __future__ import annotations

from calib.report.build import FULL
from calib.run import CheckedOnly
from calib.study.declaration import declare_study, run_row_study
from calib.study.flags import add_table_args, study_parser
from calib.study.main import guarded_main
from calib.study.row_file import add_row_args
from calib.study.rows import METHOD_ROWS, row_label

STUDY = declare_study("compare_methods", __doc__, metrics=FULL, rows=METHOD_ROWS)


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=STUDY.name)
    add_table_args(parser)
    parser.add_argument("--methods", nargs="+", default=None, choices=METHOD_ROWS, type=row_label, metavar="ROW",
                        help="rows to run, from: %(choices)s (default: all of them)")
    add_row_args(parser)
    args = parser.parse_args(argv)
    selected = {label: METHOD_ROWS[label] for label in args.methods or METHOD_ROWS}
    return run_row_study(args, selected, STUDY.metrics, table=METHOD_ROWS)


if __name__ == "__main__":
    raise SystemExit(main())
