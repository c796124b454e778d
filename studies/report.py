"""Regenerate every table and figure from the result store.

Markdown and LaTeX tables (mean ± 95% CI or ± std over seeds, best in bold) per study and dataset,
reliability diagrams with per-bin counts, and each study's figure (γ sensitivity with q_t, Mixup α,
ablation bars). A study that is not in the store is skipped with one line saying how to run it.

Which differences are real: a cell is marked ▲ / ▼ when its row is significantly better / worse than the
control row (the one policy of calib.report.policy, the same as the studies' printouts: >= 3 seeds, a paired t-test
on seed; fewer, a bootstrap over seeds and kept test predictions; Holm over the rows); a study over two or more setups
(datasets × architectures) also gets a rank table (average ranks, Friedman and Iman–Davenport tests,
Nemenyi's critical difference, Holm against the control) and a critical-difference diagram per metric.

--table FILE: one paper table from its spec (tables/*.yaml: studies, rows, setups × metrics, control, caption,
label): writes <name>.tex, <name>.md and <name>.csv (one line per cell) into --out (default <store>/report/paper)
and prints the Markdown. A spec naming an unknown study, row, metric or setup exits 2 and writes nothing.

--export-features DIR: every Stage I of the store's ok rows labelled --label (default: Vanilla, the CE model) as a
features file, DIR/<dataset>_<arch>_<label>_seed<seed>.pt, and DIR/SHA256SUMS; `--features FILE` re-runs the two-stage
and post-hoc tables on it without training the Stage I again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow.dataset as pads

from calib._config import check
from calib._help import CommandParser, HelpFormatter
from calib.artifacts.export import export_features
from calib.methods.vanilla import UNCALIBRATED_LABEL
from calib.registries import STUDIES
from calib.report.build import build_report
from calib.report.figure_options import FIGURE_FORMATS, add_figure_args, figure_options_of, use_figure_options
from calib.report.paper import load_spec, write_table
from calib.report.tables import with_current_labels
from calib.store import read_trials
from calib.study.flags import add_table_args
from calib.study.main import guarded_main
from calib.study.paths import StudyPaths
from calib.study.table_rows import STUDY_COMMANDS, row_catalogs

LADDERS = Path(__file__).resolve().parent / "ladders"


@guarded_main
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__, formatter_class=HelpFormatter, epilog=declared_studies())
    parser.add_argument("--store", default="results", help="result-store directory or s3:// URI")
    parser.add_argument("--out", default=None,
                        help="report directory (default: <store>/report; ./results/report for a remote store)")
    parser.add_argument("--spread", default="ci", choices=["ci", "std"], help="± 95%% CI or ± std over seeds")
    add_table_args(parser)
    parser.add_argument("--table", action="extend", nargs="+", default=[], metavar="FILE",
                        help="paper tables' specs (tables/*.yaml): write each one's .tex, .md and .csv into --out "
                             "(default <store>/report/paper) and print its Markdown, instead of the whole report")
    parser.add_argument("--correct-across", action="store_true",
                        help="with --table: Holm over every tested cell of the table (setups × metrics × rows) "
                             "instead of over the rows of each column")
    parser.add_argument("--alpha", type=float, default=0.05,
                        help="significance level of the markers, Holm's test and Nemenyi's CD (default: 0.05)")
    add_figure_args(parser)
    exporting = parser.add_argument_group("features files")
    exporting.add_argument("--export-features", metavar="DIR", default=None,
                           help="write every Stage I of the store's rows labelled --label as a features file in DIR "
                                "(<dataset>_<arch>_<label>_seed<seed>.pt, and DIR/SHA256SUMS), instead of the report")
    exporting.add_argument("--label", default=UNCALIBRATED_LABEL,
                           help="with --export-features: the rows whose Stage I to export")
    exporting.add_argument("--study", default=None, help="with --export-features: only this study's rows")
    exporting.add_argument("--artifacts", default=None,
                           help="with --export-features: the Stage-I artifact directory or s3:// URI "
                                "(default: <store>/artifacts)")
    args = parser.parse_args(argv)
    use_figure_options(figure_options_of(args))
    check(0 < args.alpha < 1, "--alpha", args.alpha, "lie in (0, 1)", "e.g. --alpha 0.05")
    paths = StudyPaths(args.store, args.artifacts, ".")
    store = paths.store
    if args.export_features:
        return exported(args, paths)
    for flag, given in (("--artifacts", args.artifacts), ("--study", args.study),
                        ("--label", None if args.label == UNCALIBRATED_LABEL else args.label)):
        check(given is None, flag, given, "come with --export-features DIR")
    if args.table:
        return paper_tables(args, store, Path(args.out).resolve() if args.out else paths.outputs / "report" / "paper")
    check(not args.correct_across, "--correct-across", True, "come with --table FILE")
    out = Path(args.out).resolve() if args.out else paths.outputs / "report"
    written = build_report(store, out, spread=args.spread, control=args.control, alpha=args.alpha,
                           test=args.test)
    print(f"report: {out} ({sum(p.suffix == '.md' for p in written)} tables, "
          f"{sum(p.suffix[1:] in FIGURE_FORMATS for p in written)} figures)")
    return 0


def declared_studies() -> str:
    """The studies the report knows (each script's declaration, calib.registries.STUDIES): name, question,
    command; a study of the store that none declares gets the full table's columns."""
    lines = [f"  {name}: {STUDIES.get(name).question}\n    python {STUDIES.get(name).command}" for name in STUDIES]
    return "studies (their columns and figure as each script declares them):\n" + "\n".join(lines)


def paper_tables(args: argparse.Namespace, store: str, out: Path) -> int:
    """Every --table spec checked first (exit 2 on an unknown name, nothing written), then each written; 1 when a
    spec's studies are not in the store (its line names the command that runs them)."""
    catalogs = row_catalogs(sorted(LADDERS.glob("*.yaml")))
    specs = [load_spec(path, catalogs) for path in args.table]
    status = 0
    for spec in specs:
        commands = {study: STUDY_COMMANDS[study if study in STUDY_COMMANDS else "*_confirm"] for study in spec.studies}
        written, text = write_table(spec, store, out, commands=commands, control=args.control, alpha=args.alpha,
                                    correct_across=args.correct_across, test=args.test,
                                    shown_store=args.store)
        if text is None:
            status = 1
            continue
        print(text)
        print(f"{spec.name}: {', '.join(_shown(path) for path in written)}")
    return status


def exported(args: argparse.Namespace, paths: StudyPaths) -> int:
    """The --export-features files, one line each with its size and SHA-256."""
    check(not args.table, "--table", args.table, "not come with --export-features (one or the other)")
    trials = with_current_labels(read_trials(paths.store, study=args.study, filters=pads.field("status") == "ok"))
    trials = trials[trials["label"].astype(str) == args.label] if not trials.empty else trials
    where = f"study {args.study!r}" if args.study else "the store"
    check(not trials.empty, "--label", args.label, f"be the label of an ok row of {where} ({paths.store})",
          "e.g. --label Vanilla (the rows of compare_methods: python studies/compare_methods.py --store ...)")
    out = Path(args.export_features).resolve()
    written = export_features(trials, paths.artifacts, out)
    for item in written:
        print(f"{_shown(item.path)}  {item.size / 1e6:.1f} MB  sha256 {item.sha256}  (Stage I {item.stage1_id})")
    print(f"{len(written)} features files, {sum(i.size for i in written) / 1e6:.1f} MB; checksums: "
          f"{_shown(out / 'SHA256SUMS')} (sha256sum -c SHA256SUMS)")
    return 0


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it."""
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


if __name__ == "__main__":
    raise SystemExit(main())
