"""The papers' published numbers (docs/methods.md §9), shown beside ours when a table is on their setup.

MaC-Cal Table 1: test ECE in percent (15 bins) per method, all 16 of its rows, keyed by (dataset, architecture) in
calib's registered names and by the row labels of ``calib.study.rows.METHOD_ROWS``.
"""

from __future__ import annotations

from calib.methods.vanilla import current_uncalibrated_label

__all__ = ["PUBLISHED_ECE", "published_ece"]

_ROWS = ("Vanilla", "ACLS", "LS", "MbLS", "Mixup", "MIT", "FL", "FLSD-53", "DFL", "CPC", "MMCE", "PLP", "TST",
         "V-TST", "BalCAL", "MaC-Cal")
# Columns of MaC-Cal Table 1 that calib's registered datasets and architectures cover.
_TABLE1 = {
    ("cifar10", "resnet50"): (4.11, 2.40, 3.96, 1.37, 1.74, 2.61, 2.34, 2.50, 2.21, 3.92, 2.71, 2.97, 4.26, 4.41, 1.32,
                              0.92),
    ("cifar10", "resnet110"): (4.06, 2.56, 3.45, 1.54, 4.27, 3.14, 2.09, 2.42, 2.08, 4.00, 3.25, 3.95, 4.11, 4.31, 1.51,
                               1.25),
    ("cifar100", "resnet50"): (14.36, 7.94, 4.28, 6.66, 4.82, 7.09, 5.56, 5.46, 3.01, 7.42, 6.00, 7.73, 11.01, 4.83,
                               3.45, 2.90),
    ("cifar100", "resnet110"): (17.85, 12.28, 4.40, 11.10, 5.40, 11.71, 7.80, 7.83, 4.69, 12.73, 11.37, 12.95, 16.82,
                                14.62, 3.91, 1.44),
    ("cifar10", "wrn26_10"): (4.02, 1.58, 4.01, 1.46, 1.35, 2.40, 1.70, 1.24, 1.47, 5.42, 2.68, 2.34, 4.09, 3.97, 1.45,
                              0.96),
    ("cifar10", "densenet121"): (3.68, 2.55, 3.21, 1.69, 2.25, 2.89, 2.06, 2.42, 1.56, 3.70, 1.90, 2.86, 4.67, 4.68,
                                 1.46, 1.05),
    ("cifar100", "wrn26_10"): (11.74, 8.93, 3.46, 8.28, 4.45, 5.35, 3.03, 3.21, 2.98, 7.81, 4.56, 7.89, 8.06, 4.39,
                               3.07, 2.96),
    ("cifar100", "densenet121"): (16.04, 13.43, 8.83, 11.88, 4.80, 8.38, 4.65, 4.42, 2.08, 8.97, 6.79, 8.19, 13.51,
                                  8.73, 2.94, 1.73),
    ("tiny-imagenet", "resnet50_tiny"): (5.53, 2.37, 2.51, 10.17, 3.26, 1.86, 1.99, 2.06, 5.06, 9.17, 7.55, 11.07, 5.21,
                                         7.20, 1.54, 1.30),
}
PUBLISHED_ECE: dict[tuple[str, str], dict[str, float]] = {
    key: dict(zip(_ROWS, values, strict=True)) for key, values in _TABLE1.items()
}


def published_ece(dataset: str, arch: str, row: str) -> float | None:
    """MaC-Cal Table 1's ECE (percent) for ``row`` on (dataset, arch), or ``None`` if not published (the
    uncalibrated model also under its former names)."""
    return PUBLISHED_ECE.get((dataset, arch), {}).get(str(current_uncalibrated_label(row)))
