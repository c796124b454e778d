"""Significance in the report's tables: the markers of the cells that beat (or lose to) the control (decided by
:mod:`calib.report.policy`), and a study's rank table over setups (Markdown and LaTeX), from
:mod:`calib.report.significance`, with CalArena's win rates (:mod:`calib.report.win_rates`) as its last columns."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from calib.report.significance import RankComparison
from calib.report.tables import latex_escape
from calib.report.win_rates import WIN_METRICS, WinRate

__all__ = ["LATEX_MARKS", "MARKS", "rank_latex", "rank_markdown"]

MARKS = {"better": "▲", "worse": "▼"}
"""The marker of a cell (or average rank) significantly better / worse than the control's."""
LATEX_MARKS = {verdict: latex_escape(mark) for verdict, mark in MARKS.items()}
"""The same markers in LaTeX (amssymb)."""


def _fmt(value: float, digits: int = 2) -> str:
    return "∞" if np.isinf(value) else f"{value:.{digits}f}"


def _p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else "0" if p == 0 else f"{p:.1e}"


def _rank_cells(comparisons: Mapping[str, RankComparison], order: list[str]
                ) -> tuple[list[list[tuple[str, bool, str]]], list[tuple[str, list[str]]]]:
    """Per label (``order``) and metric: (average rank text, best, verdict against the control); then the
    statistics rows (name, one text per metric)."""
    cells = []
    for label in order:
        row = []
        for comparison in comparisons.values():
            if label not in comparison.ranks.index:
                row.append(("–", False, ""))
                continue
            rank = float(comparison.ranks[label])
            holm = comparison.holm
            verdict = str(holm.at[label, "verdict"]) if holm is not None and label in holm.index else ""
            row.append((f"{rank:.2f}", bool(np.isclose(rank, comparison.ranks.min())), verdict))
        cells.append(row)
    stats_rows = [
        ("setups N / methods k", [f"{len(c.setups)} / {len(c.ranks)}" for c in comparisons.values()]),
        ("Friedman χ²_F (p)", [f"{_fmt(c.friedman.chi2)} ({_p(c.friedman.chi2_p)})" if c.friedman else "–"
                               for c in comparisons.values()]),
        ("Iman–Davenport F_F (p)", [f"{_fmt(c.friedman.f)} ({_p(c.friedman.f_p)})" if c.friedman else "–"
                                    for c in comparisons.values()]),
        ("Nemenyi CD", [f"{c.cd:.2f}" if c.cd is not None else "–" for c in comparisons.values()]),
    ]
    return cells, stats_rows


def _notes(comparisons: Mapping[str, RankComparison], headers: Mapping[str, str]) -> list[str]:
    """The comparisons' notes, each once, naming the columns it is about (or none when it is every column)."""
    by_note: dict[str, list[str]] = {}
    for metric, comparison in comparisons.items():
        for note in comparison.notes:
            by_note.setdefault(note, []).append(headers[metric])
    return [note[0].upper() + note[1:] + "." if len(columns) == len(comparisons)
            else f"{', '.join(columns)}: {note}." for note, columns in by_note.items()]


def _legend(comparisons: Mapping[str, RankComparison], alpha: float) -> list[str]:
    controls = {c.control for c in comparisons.values() if c.holm is not None}
    lines = ["Rank 1 = best in a setup, ties share their average rank."]
    if any(c.friedman is not None for c in comparisons.values()):
        lines[0] += (f" Two average ranks differing by at least CD differ significantly (Nemenyi, α = {alpha:g}); "
                     "F_F is the Iman–Davenport form of χ²_F.")
    if controls:
        (control,) = controls
        lines.append(f"{MARKS['better']} / {MARKS['worse']}: average rank significantly better / worse than "
                     f"{control}'s (z from average ranks, Holm over the other methods, α = {alpha:g}).")
    return lines


WinRates = Mapping[tuple[str, str], Mapping[str, WinRate]]
"""(metric column, reference) -> {label: (share won, pairs)}: :func:`calib.report.win_rates.win_rates`."""


def _win_columns(wins: WinRates | None, order: list[str]) -> tuple[list[str], list[list[str]]]:
    """The win-rate column headers and, per label of ``order``, their cells: "62.5 (8)" (percent won, pairs)."""
    wins = wins or {}
    headers = [f"{WIN_METRICS[metric]} win % vs {reference}" for metric, reference in wins]
    cells = [[f"{100 * rates[label][0]:.1f} ({rates[label][1]})" if label in rates else "–"
              for rates in wins.values()] for label in order]
    return headers, cells


def _win_legend(wins: WinRates | None) -> list[str]:
    if not wins:
        return []
    references = " and ".join(dict.fromkeys(reference for _, reference in wins))
    return [f"Win % vs {references}: the share of the row's trials (setup × seed × calibration set) whose test loss is "
            f"strictly below that of the reference's trial on the same dataset, architecture and seed (against TS "
            f"also the same calibration-set size and draw): CalArena's win rate, a tie no win; in brackets the "
            f"number of pairs."]


def rank_markdown(caption: str, comparisons: Mapping[str, RankComparison], headers: Mapping[str, str],
                  order: list[str], alpha: float, wins: WinRates | None = None) -> str:
    """A study's rank table: a row per method (average rank per metric column, the best in bold, ▲/▼ against the
    control, then the ``wins`` columns), then N and k, χ²_F, F_F (with p) and CD; the legend and the notes under
    it."""
    cells, stats_rows = _rank_cells(comparisons, order)
    win_headers, win_cells = _win_columns(wins, order)
    columns = [headers[m] for m in comparisons] + win_headers
    lines = [caption, "", "| row | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]
    for label, row, won in zip(order, cells, win_cells, strict=True):
        shown = [(f"**{text}**" if best else text) + (f" {MARKS[v]}" if v else "") for text, best, v in row]
        lines.append("| " + " | ".join([label, *shown, *won]) + " |")
    for name, texts in stats_rows:
        lines.append("| " + " | ".join([name, *texts, *[""] * len(win_headers)]) + " |")
    return "\n".join([*lines, "", *_legend(comparisons, alpha), *_win_legend(wins), *_notes(comparisons, headers)]) \
        + "\n"


def rank_latex(caption: str, comparisons: Mapping[str, RankComparison], headers: Mapping[str, str],
               order: list[str], alpha: float, wins: WinRates | None = None) -> str:
    """:func:`rank_markdown` as a LaTeX table (booktabs; the markers need amssymb)."""
    cells, stats_rows = _rank_cells(comparisons, order)
    win_headers, win_cells = _win_columns(wins, order)
    columns = [latex_escape(header) for header in [*(headers[m] for m in comparisons), *win_headers]]
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_escape(caption)}}}",
             r"\begin{tabular}{l " + "r " * len(columns) + "}", r"\toprule",
             " & ".join(["Method", *columns]) + r" \\", r"\midrule"]
    for label, row, won in zip(order, cells, win_cells, strict=True):
        shown = [(rf"\textbf{{{text}}}" if best else latex_escape(text)) + (LATEX_MARKS[v] if v else "")
                 for text, best, v in row]
        lines.append(" & ".join([latex_escape(label), *shown, *map(latex_escape, won)]) + r" \\")
    lines.append(r"\midrule")
    for name, texts in stats_rows:
        lines.append(" & ".join(latex_escape(text) for text in [name, *texts, *[""] * len(win_headers)]) + r" \\")
    notes = " ".join(latex_escape(line) for line in [*_legend(comparisons, alpha), *_win_legend(wins),
                                                     *_notes(comparisons, headers)])
    lines += [r"\bottomrule", r"\end{tabular}", r"\par\smallskip{\footnotesize " + notes + "}", r"\end{table}"]
    return "\n".join(lines) + "\n"
