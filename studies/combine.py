"""Does MaC-Cal help on top of any Stage-I loss? Every loss with and without MaC-Cal (MaC-Cal Table 3).

Each Stage-I loss (and Mixup, MIT) is trained once per seed; the "+MaC-Cal" row reuses that Stage-I
artifact and retrains only the head. Prints Acc / ECE / AECE (mean ± 95% CI over seeds) per row.
"""

from __future__ import annotations

from calib.search import CheckedOnly
from calib.study.flags import study_parser
from calib.study.main import guarded_main, study_exit_code
from calib.study.paths import study_paths
from calib.study.row_file import add_row_args, row_control
from calib.study.rows import Row, print_row_tables, run_rows

STAGE1 = {
    "CE": Row(),
    "ACLS": Row(loss={"name": "acls"}),
    "LS": Row(loss={"name": "label_smoothing"}),
    "MbLS": Row(loss={"name": "mbls"}),
    "Mixup": Row(stage1={"mixup_alpha": 1.0}),
    "MIT": Row(stage1={"mit_alpha": 1.0}),
    "FL": Row(loss={"name": "focal"}),
    "FLSD-53": Row(loss={"name": "flsd53"}),
    "DFL": Row(loss={"name": "dual_focal"}),
    "MMCE": Row(loss={"name": "mmce"}),
}
METRICS = {"test_accuracy": "Acc", "test_ece": "ECE", "test_aece": "AECE", "test_mce": "MCE"}


def rows(names: list[str]) -> dict[str, Row]:
    out = {}
    for name in names:
        base = STAGE1[name]
        out[name] = base
        out[f"{name} +MaC-Cal"] = Row(loss=base.loss, method={"name": "mac_cal"}, stage1=base.stage1)
    return out


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study="combine")
    parser.add_argument("--losses", nargs="+", default=list(STAGE1), choices=list(STAGE1), metavar="LOSS",
                        help=f"Stage-I rows, from: {', '.join(STAGE1)} (default: all of them)")
    add_row_args(parser)
    args = parser.parse_args(argv)
    selected = rows(args.losses)
    result = run_rows(args, selected, table=rows(list(STAGE1)))
    if isinstance(result, CheckedOnly):
        return result
    trials, run = result
    print_row_tables(trials, METRICS, study=args.study, control=row_control(args, selected))
    return study_exit_code(args.study, study_paths(args).store, run.failed, len(trials))


if __name__ == "__main__":
    raise SystemExit(main())
