"""What does each method cost? Wall time per method from the timings in the store (MaC-Cal Table 4).

Runs (or, when they are already stored, reuses) the trials of ``compare_methods`` and reports per
method the Stage-I training time, the method's own time (Stage II / post-hoc fit) and their sum,
mean over seeds, with the ratio to vanilla. Timings are wall seconds on the machine that ran them
(see the ``host`` and ``device`` columns); compare only rows measured on the same hardware.
"""

from __future__ import annotations

import argparse

from calib.cli import add_common_args, guarded_main
from calib.study_rows import METHOD_ROWS, run_rows


@guarded_main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common_args(parser, study="compare_methods")
    args = parser.parse_args(argv)
    trials = run_rows(args, METHOD_ROWS)
    if trials.empty:
        return 1
    trials["method_total_seconds"] = trials["stage1_train_seconds"] + trials["method_seconds"]
    for (dataset, arch), group in trials.groupby(["dataset", "arch"], observed=True):
        means = group.groupby("row", observed=True)[
            ["stage1_train_seconds", "method_seconds", "method_total_seconds"]].mean()
        vanilla = means["method_total_seconds"].iloc[0]
        print(f"\n{dataset} · {arch} · wall seconds, mean over seeds · hosts {sorted(set(group['host']))}\n")
        print("| method | Stage I (s) | method (s) | total (s) | × vanilla |\n|---|---|---|---|---|")
        for row, r in means.iterrows():
            print(f"| {row} | {r['stage1_train_seconds']:.1f} | {r['method_seconds']:.2f} | "
                  f"{r['method_total_seconds']:.1f} | {r['method_total_seconds'] / vanilla:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
