"""A study declared once: its name, question, rows or ladder, table metrics and figure, in one
:class:`StudyDeclaration` that its script, ``studies/report.py`` and the docs' checks read; and the run of a row
study (:func:`run_row_study`), the one tail every row-table script shares.

A script declares its study at module level, ``STUDY = declare_study(...)``, which registers it in
:data:`calib.registries.STUDIES`. That registry fills itself on first read by importing every script of
``studies/`` (:func:`calib.plugins.load_studies`), so the report knows every shipped study, and a new one, from
its script alone."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from calib.registries import STUDIES
from calib.report.build import STUDY_FIGURES
from calib.run import CheckedOnly
from calib.study.main import study_exit_code
from calib.study.paths import study_paths
from calib.study.row import Row
from calib.study.rows import print_row_tables, run_rows

__all__ = ["StudyDeclaration", "declare_study", "run_row_study"]


@dataclass(frozen=True)
class StudyDeclaration:
    """One study, as its script, ``report.py`` and the docs read it.

    ``name``: the ``study`` column of its trials; ``question``: the one line it answers (its script's docstring's
    first line); ``metrics``: its table's columns, column -> header, in order (the script's printed table and
    ``report.py``'s); ``figure``: the report's figure of the study (a key of
    :data:`calib.report.build.STUDY_FIGURES`), None for none; ``command``: how to run it (default
    ``studies/<name>.py``); ``rows``: its table's rows by label (a row study), ``ladder``: its default ladder file
    (an ablation); neither for a study that builds its own grid."""

    name: str
    question: str
    metrics: Mapping[str, str]
    figure: str | None = None
    command: str = ""
    rows: Mapping[str, Row] | None = field(default=None, compare=False)
    ladder: str | None = None

    @property
    def docs_page(self) -> str:
        """Its page: ``docs/studies/<name, with '-' for '_'>.md``."""
        return f"docs/studies/{self.name.replace('_', '-')}.md"


def declare_study(name: str, doc: str | None, *, metrics: Mapping[str, str], figure: str | None = None,
                  command: str | None = None, rows: Mapping[str, Row] | None = None,
                  ladder: str | None = None) -> StudyDeclaration:
    """The study ``name`` of the script whose docstring is ``doc`` (its first line is the question), registered
    in :data:`~calib.registries.STUDIES`. Declaring it again the same way (the script imported twice: run as
    ``__main__`` and read by the report) is a no-op; another study of the same name is a ``ValueError``."""
    question = (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""
    if not question:
        raise ValueError(f"The study {name!r} has no question: its script's docstring starts with it.")
    if figure is not None and figure not in STUDY_FIGURES:
        raise ValueError(f"The study {name!r} declares the figure {figure!r}; the report draws "
                         f"{', '.join(STUDY_FIGURES)} (calib.report.build.STUDY_FIGURES), or None for none.")
    study = StudyDeclaration(name, question, dict(metrics), figure, command or f"studies/{name}.py", rows, ladder)
    declared = STUDIES.declared(name)
    if declared is None:
        STUDIES.register(name)(study)
    elif declared != study:
        raise ValueError(f"Two scripts declare the study {name!r} ({declared.command} and {study.command}): give "
                         f"one of them another name.")
    return study


def run_row_study(
    args: argparse.Namespace,
    rows: Mapping[str, Row],
    metrics: Mapping[str, str] | None,
    *,
    table: Mapping[str, Row] | None = None,
    evaluation: Callable[[str], dict[str, Any]] | None = None,
    columns: Callable[[pd.DataFrame], Mapping[str, str]] | None = None,
    report: Callable[[pd.DataFrame], None] | None = None,
) -> int | CheckedOnly:
    """A row study's run: :func:`~calib.study.rows.run_rows` (``--check-only``: its :class:`CheckedOnly`, as it
    is), the table of ``metrics`` per setup (:func:`~calib.study.rows.print_row_tables`; none for None), then
    ``report(trials)`` (a study's figure or own table), and the study's exit code.

    ``columns(trials)``: adds columns derived from the stored ones to ``trials`` and returns the metrics the table
    prints instead of ``metrics`` (one value per OOD set or severity)."""
    result = run_rows(args, rows, evaluation=evaluation, table=table)
    if isinstance(result, CheckedOnly):
        return result
    trials, run = result
    store = study_paths(args).store
    if columns is not None:
        metrics = columns(trials)
    if metrics is not None:
        # a study without add_table_args (no --control, --test) compares against its own control with a t-test
        print_row_tables(trials, metrics, study=args.study, control=getattr(args, "control", None),
                         test=getattr(args, "test", "t-test"), store=store)
    if report is not None:
        report(trials)
    return study_exit_code(args.study, store, run.failed, len(trials))
