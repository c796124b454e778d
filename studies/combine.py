"""Does MaC-Cal help on top of any Stage-I loss? Every loss with and without MaC-Cal (MaC-Cal Table 3).

Each Stage-I loss of the registry (and Mixup, MIT) is trained once per seed; the "+MaC-Cal" row reuses that Stage-I
artifact and retrains only the head. Prints Acc / ECE / AECE (mean ± 95% CI over seeds) per row.
"""

from __future__ import annotations

from calib.run import CheckedOnly
from calib.study.flags import add_table_args, study_parser
from calib.study.main import guarded_main, study_exit_code
from calib.study.paths import study_paths
from calib.study.row_file import add_row_args
from calib.study.rows import STAGE1_ROWS, Row, method_row, print_row_tables, row_label, run_rows

METRICS = {"test_accuracy": "Acc", "test_ece": "ECE", "test_aece": "AECE", "test_mce": "MCE"}


def rows(names: list[str]) -> dict[str, Row]:
    """Each Stage I of ``names`` and MaC-Cal retrained on it (``<Stage I> +MaC-Cal``)."""
    out = {}
    for name in names:
        out[name] = STAGE1_ROWS[name]
        mac_cal, row = method_row("mac_cal", STAGE1_ROWS[name])
        out[f"{name} +{mac_cal}"] = row
    return out


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study="combine")
    add_table_args(parser)
    parser.add_argument("--losses", nargs="+", default=None, choices=STAGE1_ROWS, type=row_label, metavar="LOSS",
                        help="Stage-I rows, from: %(choices)s (default: all of them)")
    add_row_args(parser)
    args = parser.parse_args(argv)
    selected = rows(args.losses or list(STAGE1_ROWS))
    result = run_rows(args, selected, table=rows(list(STAGE1_ROWS)))
    if isinstance(result, CheckedOnly):
        return result
    trials, run = result
    print_row_tables(trials, METRICS, study=args.study, control=args.control, test=args.test,
                     store=study_paths(args).store)
    return study_exit_code(args.study, study_paths(args).store, run.failed, len(trials))


if __name__ == "__main__":
    raise SystemExit(main())
