"""Run every study on the quick preset, one after the other, into one store, and print the wall time of each.

    python benchmarks/quick_suite.py --store results_suite

Studies after ``compare_methods`` reuse its Stage-I artifacts (same store, same artifact directory).
Ends with ``report.py`` and one line with the total.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

STUDIES = ("sensitivity_gamma", "compare_methods", "ablation", "combine", "decompose", "mixup_alpha", "ood",
           "corruption", "cost")
ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default="results_suite", help="result store for the whole suite")
    parser.add_argument("--data-root", default="data", help="data directory (digits-C is generated there)")
    args = parser.parse_args(argv)
    store, data = str(Path(args.store).resolve()), str(Path(args.data_root).resolve())
    total, failed = 0.0, []
    for name in (*STUDIES, "report"):
        extra = ["--data-root", data] if name != "report" else []
        start = time.perf_counter()
        run = subprocess.run([sys.executable, str(ROOT / "studies" / f"{name}.py"), "--store", store, *extra],
                             capture_output=True, text=True)
        seconds = time.perf_counter() - start
        total += seconds
        print(f"{name}: {seconds:.0f} s (exit {run.returncode})", flush=True)
        if run.returncode != 0:
            failed.append(name)
            print(run.stderr[-2000:], file=sys.stderr)
    print(f"quick suite: {total / 60:.1f} min for {len(STUDIES)} studies and the report; "
          f"{'all passed' if not failed else 'failed: ' + ', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
