"""What does each method cost? Wall time per method from the timings in the store (MaC-Cal Table 4).

Runs (or, when they are already stored, reuses) the trials of ``compare_methods`` and reports per
method the Stage-I training time, the method's own time (Stage II / post-hoc fit) and their sum,
mean over seeds, with the ratio to vanilla. Timings are wall seconds on the machine that ran them
(see the ``host`` and ``device`` columns); compare only rows measured on the same hardware.
"""

from __future__ import annotations

import argparse

import pandas as pd

from calib.report import report_step
from calib.report.build import cost_table
from calib.run import CheckedOnly
from calib.study.declaration import run_row_study
from calib.study.flags import study_parser
from calib.study.main import guarded_main
from calib.study.rows import METHOD_ROWS, row_label


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study="compare_methods")
    parser.add_argument("--methods", nargs="+", default=None, choices=METHOD_ROWS, type=row_label, metavar="ROW",
                        help="rows to run, from: %(choices)s (default: all of them)")
    args = parser.parse_args(argv)
    return run_row_study(args, {label: METHOD_ROWS[label] for label in args.methods or METHOD_ROWS}, None,
                         table=METHOD_ROWS, report=lambda trials: cost_tables(args, trials))


def cost_tables(args: argparse.Namespace, trials: pd.DataFrame) -> None:
    """The wall-time table of each (dataset, architecture)."""
    for (dataset, arch), group in trials.groupby(["dataset", "arch"], observed=True):
        with report_step(args.study, f"cost table for {dataset} · {arch}"):
            print(f"\n{dataset} · {arch} · wall seconds, mean over seeds · hosts {sorted(set(group['host']))}\n")
            print(cost_table(group))


if __name__ == "__main__":
    raise SystemExit(main())
