"""The rows each study can hold, for checking a paper table's spec (:func:`calib.report.paper.load_spec`): a row a
study never writes is a typo, reported before anything is written; a row it can write but has not is a run to do."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from calib.methods.vanilla import UNCALIBRATED_LABEL
from calib.registries import METHODS
from calib.report.paper import RowCatalog
from calib.study.ablation import load_ladder
from calib.study.row_file import read_row_file
from calib.study.rows import GIVEN_STAGE1_ROWS, METHOD_ROWS, POSTHOC_METHODS, STAGE1_ROWS

__all__ = ["STUDY_COMMANDS", "row_catalogs"]

STUDY_COMMANDS = {
    "compare_methods": "studies/compare_methods.py --methods {rows}",
    "decompose": "studies/decompose.py --methods {rows}",
    "combine": "studies/combine.py",
    "ablation": "studies/ablation.py",
    "ood": "studies/ood.py --methods {rows}",
    "corruption": "studies/corruption.py --methods {rows}",
    "sensitivity_gamma": "studies/sensitivity_gamma.py",
    "posthoc": "studies/posthoc.py",
    "calibrate": "studies/calibrate.py --checkpoint FILE --archs ARCH --datasets DATASET",
    "*_confirm": "studies/search.py --space FILE --replicates K --confirm N",
}
"""The command that runs each study whose rows a table spec may name."""


def _file_labels(row_files: Iterable[str]) -> list[str]:
    return [read_row_file(path)[0] for path in row_files]


def _of(labels: Callable[[], Iterable[str]], command: str) -> Callable[[tuple[str, ...]], RowCatalog]:
    def catalog(row_files: tuple[str, ...]) -> RowCatalog:
        known = [*labels(), *_file_labels(row_files)]
        return RowCatalog(accepts=set(known).__contains__, examples=tuple(known), command=command)
    return catalog


def _pattern(pattern: str, examples: Callable[[], Iterable[str]],
             command: str) -> Callable[[tuple[str, ...]], RowCatalog]:
    """Rows named by a pattern (``MaC-Cal γ=0.5``, ``TS · n=500``) and the row files' labels."""
    def catalog(row_files: tuple[str, ...]) -> RowCatalog:
        files = set(_file_labels(row_files))
        return RowCatalog(accepts=lambda label: label in files or re.fullmatch(pattern, label) is not None,
                          examples=(*examples(), *files), command=command)
    return catalog


def _combine_labels() -> list[str]:
    mac_cal = METHODS.get("mac_cal").label or "mac_cal"
    return [label for stage1 in STAGE1_ROWS for label in (stage1, f"{stage1} +{mac_cal}")]


def _ladder_catalog(ladders: Sequence[Path]) -> Callable[[tuple[str, ...]], RowCatalog]:
    """The ablation's rows: each ladder's baseline and components, also in the other modes' rows that name them."""
    def names() -> list[str]:
        steps = []
        for path in ladders:
            ladder = load_ladder(path)
            steps += [ladder.baseline.name, *(change.name for change in ladder.components)]
        return list(dict.fromkeys(steps))

    def catalog(row_files: tuple[str, ...]) -> RowCatalog:
        steps, files = names(), set(_file_labels(row_files))
        return RowCatalog(accepts=lambda label: label in files or any(step in label for step in steps),
                          examples=(*steps, *files), command=STUDY_COMMANDS["ablation"])
    return catalog


def row_catalogs(ladders: Sequence[Path]) -> dict[str, Callable[[tuple[str, ...]], RowCatalog]]:
    """Study -> its rows given a spec's row files; ``ladders``: the ablation's ladder files."""
    posthoc = "|".join(re.escape(label) for label in POSTHOC_METHODS)
    return {
        "compare_methods": _of(lambda: METHOD_ROWS, STUDY_COMMANDS["compare_methods"]),
        # decompose, ood and corruption run rows of the method table (their defaults are a selection of it)
        "decompose": _of(lambda: METHOD_ROWS, STUDY_COMMANDS["decompose"]),
        "ood": _of(lambda: METHOD_ROWS, STUDY_COMMANDS["ood"]),
        "corruption": _of(lambda: METHOD_ROWS, STUDY_COMMANDS["corruption"]),
        "calibrate": _of(lambda: GIVEN_STAGE1_ROWS, STUDY_COMMANDS["calibrate"]),
        "combine": _of(_combine_labels, STUDY_COMMANDS["combine"]),
        "ablation": _ladder_catalog(ladders),
        "sensitivity_gamma": _pattern(rf"{UNCALIBRATED_LABEL}|MaC-Cal γ=(estimated|[0-9.e+-]+)",
                                      lambda: (UNCALIBRATED_LABEL, "MaC-Cal γ=<γ>", "MaC-Cal γ=estimated"),
                                      STUDY_COMMANDS["sensitivity_gamma"]),
        "posthoc": _pattern(rf"{UNCALIBRATED_LABEL}|({posthoc}) · (all|n=[0-9]+)",
                            lambda: (UNCALIBRATED_LABEL, *(f"{m} · all" for m in POSTHOC_METHODS)),
                            STUDY_COMMANDS["posthoc"]),
        # a replicated search's confirmation (studies/search.py --confirm): the method's default row and the
        # search's chosen rows, named by their row files (`row_files:` in the spec)
        "*_confirm": _of(lambda: METHOD_ROWS, STUDY_COMMANDS["*_confirm"]),
    }
