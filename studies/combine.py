"""Does MaC-Cal help on top of any Stage-I loss? Every loss with and without MaC-Cal (MaC-Cal Table 3).

Each Stage-I loss of the registry (and Mixup, MIT) is trained once per seed; the "+MaC-Cal" row reuses that Stage-I
artifact and retrains only the head. Prints Acc / ECE / AECE (mean ± 95% CI over seeds) per row.
"""

from __future__ import annotations

from calib.run import CheckedOnly
from calib.study.declaration import declare_study, run_row_study
from calib.study.flags import add_table_args, study_parser
from calib.study.main import guarded_main
from calib.study.row_file import add_row_args
from calib.study.rows import STAGE1_ROWS, RegistryRows, Row, method_row, row_label


def rows(names: list[str]) -> dict[str, Row]:
    """Each Stage I of ``names`` and MaC-Cal retrained on it (``<Stage I> +MaC-Cal``)."""
    out = {}
    for name in names:
        out[name] = STAGE1_ROWS[name]
        mac_cal, row = method_row("mac_cal", STAGE1_ROWS[name])
        out[f"{name} +{mac_cal}"] = row
    return out


STUDY = declare_study("combine", __doc__, metrics={"test_accuracy": "Acc", "test_ece": "ECE", "test_aece": "AECE",
                                                   "test_mce": "MCE"},
                      rows=RegistryRows(lambda: rows(list(STAGE1_ROWS)), "combine rows"))


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=STUDY.name)
    add_table_args(parser)
    parser.add_argument("--losses", nargs="+", default=None, choices=STAGE1_ROWS, type=row_label, metavar="LOSS",
                        help="Stage-I rows, from: %(choices)s (default: all of them)")
    add_row_args(parser)
    args = parser.parse_args(argv)
    selected = rows(args.losses or list(STAGE1_ROWS))
    return run_row_study(args, selected, STUDY.metrics, table=rows(list(STAGE1_ROWS)))


if __name__ == "__main__":
    raise SystemExit(main())
