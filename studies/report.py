"""Regenerate every table and figure from the result store.

Markdown and LaTeX tables (mean ± 95% CI or ± std over seeds, best in bold) per study and dataset,
reliability diagrams with per-bin counts, and each study's figure (γ sensitivity with q_t, Mixup α,
ablation bars). A study that is not in the store is skipped with one line saying how to run it.

Which differences are real: a cell is marked ▲ / ▼ when its row is significantly better / worse than the
control row over seeds (paired t-test on seed, Holm over the rows); a study over two or more setups
(datasets × architectures) also gets a rank table (average ranks, Friedman and Iman–Davenport tests,
Nemenyi's critical difference, Holm against the control) and a critical-difference diagram per metric.
"""

from __future__ import annotations

from pathlib import Path

from calib._config import check
from calib._help import CommandParser, HelpFormatter
from calib.report.build import build_report
from calib.report.figure_options import FIGURE_FORMATS, add_figure_args, figure_options_of, use_figure_options
from calib.report.significance import CONTROL_CANDIDATES
from calib.study.main import guarded_main
from calib.study.paths import StudyPaths


@guarded_main
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--store", default="results", help="result-store directory or s3:// URI")
    parser.add_argument("--out", default=None,
                        help="report directory (default: <store>/report; ./results/report for a remote store)")
    parser.add_argument("--spread", default="ci", choices=["ci", "std"], help="± 95%% CI or ± std over seeds")
    parser.add_argument("--control", default=None, metavar="LABEL",
                        help="the row the significance markers and Holm's test compare against (default: the "
                             f"study's TS row, {' / '.join(CONTROL_CANDIDATES)}; no markers where it is absent)")
    parser.add_argument("--alpha", type=float, default=0.05,
                        help="significance level of the markers, Holm's test and Nemenyi's CD (default: 0.05)")
    add_figure_args(parser)
    args = parser.parse_args(argv)
    use_figure_options(figure_options_of(args))
    check(0 < args.alpha < 1, "--alpha", args.alpha, "lie in (0, 1)", "e.g. --alpha 0.05")
    paths = StudyPaths(args.store, None, ".")
    store = paths.store
    out = Path(args.out).resolve() if args.out else paths.outputs / "report"
    written = build_report(store, out, spread=args.spread, control=args.control, alpha=args.alpha)
    print(f"report: {out} ({sum(p.suffix == '.md' for p in written)} tables, "
          f"{sum(p.suffix[1:] in FIGURE_FORMATS for p in written)} figures)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
