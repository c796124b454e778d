"""Calibrate your own model: every method that runs on a trained Stage I, on your checkpoint or features.

Stage I is not trained: it is your model, given as

- ``--checkpoint FILE --archs ARCH --datasets DATASET``: the weights (a state_dict) of an architecture
  by name (calib's own, ``torchvision:resnet18``, ``timm:convnext_tiny``) for a registered dataset or
  your own images (``--datasets imagefolder --data-root DIR``: ``DIR/train``, ``DIR/test`` and optionally
  ``DIR/val`` in torchvision's ImageFolder layout). calib computes the features and logits of each split
  once (the backbone before the final linear layer, found automatically or named with ``--head``);
- ``--features FILE``: the features, labels and final linear layer (or logits) of the train, val and
  test splits, from any model (docs/extending.md, "Precomputed features");
- ``--predictions FILE [FILE ...]``: a model's held-out predictions and labels, one file per setup (netcal's
  ``.npz`` records, ``logits``/``probs`` + ``labels``, a ``.npy`` pair or Parquet), split into a calibration and a
  test part ``--splits`` times (stratified, seeded by the split index; ``--calibration-fraction``, 0.5). Only the
  uncalibrated model and the post-hoc methods run on it: it has no features and no training split.

Runs the uncalibrated model, every post-hoc method (TS, SMART, CTS, PTS, ETS, VS, MS-ODIR, Dir-ODIR, IR,
IRM, HB, HB-EM, BBQ, Spline, SMS, SVS, IVAP, CIR, Beta), TST, V-TST and MaC-Cal (``--methods``), each
over the seeds of its Stage II (the backbone is fixed, so seeds vary only what calibration draws; with
``--predictions`` the seeds are the splits), and
prints accuracy, its change from the uncalibrated model (ΔAcc) and the share of changed predictions, ECE,
AECE, MCE, SmoothECE, ECE-sweep, debiased L2-CE, NLL, Brier, O-ECE, U-ECE, AURC and AUGRC on the test split,
mean ± 95% CI over seeds, and writes the reliability diagrams (pooled over seeds, with Clopper–Pearson 95% intervals
per bin) to ``<store>/figures``. ``studies/report.py`` regenerates both from the store.
"""

from __future__ import annotations

import argparse

import pandas as pd

from calib._config import ConfigError
from calib.registries import METHODS
from calib.report import report_step
from calib.report.build import FULL, pooled_bins
from calib.report.figures import plot_reliability
from calib.run import CheckedOnly
from calib.study.declaration import declare_study, run_row_study
from calib.study.flags import add_predictions_args, add_table_args, study_parser
from calib.study.main import guarded_main
from calib.study.paths import study_paths
from calib.study.rows import GIVEN_STAGE1_ROWS, METHOD_ROWS, RegistryRows, row_label

ROWS = GIVEN_STAGE1_ROWS
"""The rows that run on a given Stage I (the registries' post-hoc and Stage-II methods, with the plugins'); the other
rows of compare_methods train Stage I and are refused."""

CHOICES = RegistryRows(lambda: {**ROWS, **{label: row for label, row in METHOD_ROWS.items() if label not in ROWS}},
                       "rows")

STUDY = declare_study("calibrate", __doc__, metrics=FULL, rows=ROWS,
                      command="studies/calibrate.py --checkpoint FILE --archs ARCH --datasets DATASET")


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=STUDY.name, figures=True)
    add_table_args(parser)
    parser.add_argument("--methods", nargs="+", default=None, choices=CHOICES, type=row_label, metavar="ROW",
                        help="rows to run: the uncalibrated model, the post-hoc and the Stage-II methods (default: all "
                             "of them; with --predictions, the post-hoc ones); from: %(choices)s (the rows that "
                             "train a Stage I are refused)")
    add_predictions_args(parser)
    args = parser.parse_args(argv)
    if not (args.checkpoint or args.features or args.predictions):
        raise ConfigError("calibrate.py calibrates a given model: pass --checkpoint FILE (with --archs and "
                          "--datasets), --features FILE or --predictions FILE. To train Stage I with calib, use "
                          "compare_methods.py.")
    table = dict(ROWS)
    if args.predictions:  # no features, no training split: the rows that read only logits
        table = {label: row for label, row in table.items() if METHODS.get(row.method["name"]).logits_only}
        refused = [label for label in args.methods or () if label not in table]
        if refused:
            raise ConfigError(f"`--methods` {' '.join(refused)} cannot run on --predictions: a predictions file holds "
                              f"no features and no training split; the rows that run on it are {', '.join(table)}.")
    rows = {label: CHOICES[label] for label in args.methods or table}
    return run_row_study(args, rows, STUDY.metrics, table=table,
                         report=lambda trials: reliability_diagrams(args, trials))


def reliability_diagrams(args: argparse.Namespace, trials: pd.DataFrame) -> None:
    """Each row's reliability diagram per (dataset, architecture), pooled over seeds."""
    for (dataset, arch), group in trials.groupby(["dataset", "arch"], observed=True):
        with report_step(args.study, f"reliability diagrams of {dataset} · {arch}"):
            bins = pooled_bins(group.assign(label=group["row"].astype(str)))
            if not bins.empty:
                path = plot_reliability(bins, study_paths(args).outputs / "figures" /
                                        f"{args.study}_{dataset}_{arch}_reliability.png",
                                        title=f"{dataset} · {arch} (test, pooled over seeds)")
                print(f"\nreliability diagrams: {path}")


if __name__ == "__main__":
    raise SystemExit(main())
