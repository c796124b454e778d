"""Do calibrated models detect out-of-distribution inputs better? MSP OOD detection (MaC-Cal Table 2, FeDLaS Table 3).

Each method's fitted model scores the in-distribution test set and every OOD set of its dataset
(CIFAR-10 ↔ CIFAR-100 and SVHN; the digits against noisy natural-image patches) by the max softmax
probability, in-distribution positive. Prints AUROC and FPR at 95% TPR averaged over the OOD sets
(MaC-Cal Table 2) and the AUROC per OOD set (FeDLaS Table 3), mean ± 95% CI over seeds.
"""

from __future__ import annotations

import pandas as pd

from calib._config import ConfigError
from calib.datasets import DEFAULT_OOD, OOD_SETS
from calib.methods.vanilla import UNCALIBRATED_LABEL
from calib.run import CheckedOnly
from calib.study.declaration import declare_study, run_row_study
from calib.study.flags import add_table_args, study_parser
from calib.study.main import guarded_main
from calib.study.paths import study_paths
from calib.study.row_file import add_row_args
from calib.study.rows import METHOD_ROWS, POSTHOC_ROWS, row_label

ROWS = [UNCALIBRATED_LABEL, *POSTHOC_ROWS, "PLP", "TST", "V-TST", "BalCAL", "MaC-Cal", "DFL", "AdaFocal", "ACLS",
        "LS", "FeDLaS-LS", "MbLS", "FeDLaS-MbLS"]
STUDY = declare_study("ood", __doc__, rows=METHOD_ROWS, metrics={
    "ood_auroc": "AUROC (mean)", "ood_fpr95": "FPR95 (mean)", "test_accuracy": "Acc", "test_ece": "ECE"})


def per_ood_set(trials: pd.DataFrame) -> dict[str, str]:
    """:data:`STUDY`'s metrics with the AUROC of each OOD set (``ood_auroc_<set>``, added to ``trials``) after the
    means."""
    metrics = {key: header for key, header in STUDY.metrics.items() if key.startswith("ood_")}
    names = trials["ood_datasets"].iloc[0] if not trials.empty else []
    for i, name in enumerate(names):
        trials[f"ood_auroc_{name}"] = trials["ood_auroc_per_dataset"].map(lambda values, i=i: values[i])
        metrics[f"ood_auroc_{name}"] = f"AUROC {name}"
    return {**metrics, **STUDY.metrics}


@guarded_main
def main(argv: list[str] | None = None) -> int | CheckedOnly:
    parser = study_parser(__doc__, study=STUDY.name)
    add_table_args(parser)
    parser.add_argument("--methods", nargs="+", default=ROWS, choices=METHOD_ROWS, type=row_label, metavar="ROW",
                        help=f"rows to run, from: %(choices)s (default: {', '.join(ROWS)})")
    add_row_args(parser)
    args = parser.parse_args(argv)
    def evaluation(dataset: str) -> dict:
        names = DEFAULT_OOD.get(dataset, ())
        if not names:
            raise ConfigError(f"No OOD sets are defined for {dataset!r}; OOD sets exist for {', '.join(DEFAULT_OOD)}.")
        for name in names:
            if not args.download:
                OOD_SETS.get(name).require(str(study_paths(args).data_root))
        return {"ood_datasets": list(names)}

    return run_row_study(args, {label: METHOD_ROWS[label] for label in args.methods}, STUDY.metrics,
                         evaluation=evaluation, table=METHOD_ROWS, columns=per_ood_set)


if __name__ == "__main__":
    raise SystemExit(main())
