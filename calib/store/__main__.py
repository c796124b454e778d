"""``python -m calib.store compact``: move finished trials' rows from their own files into a few large parts;
``python -m calib.store rescore``: compute a metric on the trials' kept predictions, without training.

Studies compact themselves (every ``--compact-every`` finished trials and when a run ends); this command
is for a store written by an earlier calib (one file per trial), a run that was killed, or ``--full``:
every part below the size limit merged into one.
"""

from __future__ import annotations

import argparse
import sys

from calib import storage
from calib._config import ConfigError
from calib._help import CommandParser, HelpFormatter
from calib.exit_codes import COMPACT_EXIT_CODES, ExitCode, exit_codes_epilog
from calib.store.compaction import compact, stored_studies
from calib.store.rescore import check_metric, rescore

EXIT_CODES = exit_codes_epilog(COMPACT_EXIT_CODES, {
    ExitCode.OK: "a study with nothing to compact counts as compacted",
    ExitCode.FAILED: "a traceback; what a compaction left is read correctly, the next one finishes it",
    ExitCode.BAD_INPUT: "no store there, an unknown --study, a negative --wait",
    ExitCode.COMPACTION_SKIPPED: "another process held its compaction lease for all of --wait (the other studies were "
                                 "compacted; the store is sound and that process compacts the study)",
})
"""The exit codes of ``compact`` (:data:`calib.exit_codes.COMPACT_EXIT_CODES`), explained in its ``--help``."""


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m calib.store", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("compact", formatter_class=HelpFormatter, help="compact a result store (all its studies)",
                         description="Compact a result store (all its studies, or --study).", epilog=EXIT_CODES)
    run.add_argument("--store", default="results", help="result-store directory or s3:// URI")
    run.add_argument("--study", nargs="+", default=None, help="only these studies (default: every study)")
    run.add_argument("--full", action="store_true",
                     help="merge every part below the size limit, not only those of the new part's size tier")
    run.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                     help="when another process is compacting a study (a study's driver, another compact), wait up "
                          "to SECONDS for it to finish, then compact the study after it; still busy then: skip the "
                          f"study (exit code {ExitCode.COMPACTION_SKIPPED:d}); 0: skip at once")
    again = sub.add_parser("rescore", formatter_class=HelpFormatter,
                           help="compute a metric on the trials' kept predictions, without training",
                           description="Compute a registered metric (at any number of bins) on the kept val/test "
                                       "predictions of every ok trial, into <store>/rescored; values already there "
                                       "are kept (a rerun adds nothing). The report shows them as columns.",
                           epilog="exit codes:\n  0  done\n  1  an error stopped it (a traceback)\n  2  bad input: "
                                  "no store there, an unknown --study or --metric, --bins of a metric without bins")
    again.add_argument("--store", default="results", help="result-store directory or s3:// URI")
    again.add_argument("--metric", required=True, help="registered metric name (calib.metrics.METRICS), e.g. ece")
    again.add_argument("--bins", type=int, default=None,
                       help="bins of a binned metric (default: 15); not allowed for a metric without bins")
    again.add_argument("--study", nargs="+", default=None, help="only these studies (default: every study)")
    again.add_argument("--split", choices=["test", "val", "both"], default="test", help="which kept split to score")
    return parser


def _rescore(args: argparse.Namespace, store: str, studies: list[str]) -> int:
    check_metric(args.metric, args.bins)
    splits = ("val", "test") if args.split == "both" else (args.split,)
    for report in rescore(store, args.metric, args.bins, studies=args.study or studies, splits=splits):
        print(report.line())
    return ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        store = storage.normalize(args.store)
        studies = stored_studies(store)
        if not studies:
            raise ConfigError(f"No result store at {store}: it has no trials/study=<name> or history/study=<name> "
                              f"folder. Pass --store the folder or s3:// URI the studies wrote to.")
        unknown = [s for s in args.study or () if s not in studies]
        if unknown:
            raise ConfigError(f"No study {', '.join(map(repr, unknown))} in the store {store}; it holds: "
                              f"{', '.join(studies)}.")
        if args.command == "rescore":
            return _rescore(args, store, studies)
        if args.wait < 0:
            raise ConfigError(f"--wait must be >= 0 seconds, got {args.wait:g}.")
        reports = compact(store, args.study, full=args.full, wait_seconds=args.wait)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    for report in reports:
        print(report.line())
    return ExitCode.COMPACTION_SKIPPED if any(r.skipped for r in reports) else ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
