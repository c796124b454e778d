"""Regenerate every table and figure from the result store.

Markdown and LaTeX tables (mean ± 95% CI or ± std over seeds, best in bold) per study and dataset,
reliability diagrams with per-bin counts, and each study's figure (γ sensitivity with q_t, Mixup α,
ablation bars). A study that is not in the store is skipped with one line saying how to run it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from calib.cli import HelpFormatter, StudyPaths, guarded_main
from calib.report.build import build_report


@guarded_main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--store", default="results", help="result-store directory or s3:// URI")
    parser.add_argument("--out", default=None,
                        help="report directory (default: <store>/report; ./results/report for a remote store)")
    parser.add_argument("--spread", default="ci", choices=["ci", "std"], help="± 95%% CI or ± std over seeds")
    args = parser.parse_args(argv)
    paths = StudyPaths(args.store, None, ".")
    store = paths.store
    out = Path(args.out).resolve() if args.out else paths.outputs / "report"
    written = build_report(store, out, spread=args.spread)
    print(f"report: {out} ({sum(p.suffix == '.md' for p in written)} tables, "
          f"{sum(p.suffix == '.png' for p in written)} figures)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
