"""A paper table's cells as Markdown and as LaTeX a ``\\input`` takes (booktabs, one column group per setup, caption
and label from the spec, scaled down to the text width when wider, every non-ASCII character escaped)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from calib.report import policy
from calib.report.paper.cells import TableCells
from calib.report.paper.spec import TableSpec
from calib.report.significance_tables import LATEX_MARKS, MARKS
from calib.report.tables import column_higher_is_better, comparison_values, is_fraction_metric, latex_escape

__all__ = ["Cell", "caption_of", "column_headers", "latex", "markdown", "table_grid"]

Cell = tuple[str, bool, str]
"""A shown cell: its text, whether it is the best of its column (bold), its marker ("better" / "worse" / "")."""


def _number(value: float, column: str, decimals: int, *, signed: bool = False) -> str:
    """``value`` as shown: a fraction in percent with ``decimals`` digits, anything else with one more."""
    if not math.isfinite(value):
        return "–"
    shown, digits = (100 * value, decimals) if is_fraction_metric(column) else (value, decimals + 1)
    return f"{shown:+.{digits}f}" if signed else f"{shown:.{digits}f}"


def _value(cell: pd.Series, spec: TableSpec) -> str:
    text = _number(float(cell["mean"]), str(cell["metric"]), spec.decimals)
    if spec.spread == "none" or text == "–":
        return text
    spread = (float(cell["ci_high"]) - float(cell["ci_low"])) / 2 if spec.spread == "ci" else float(cell["std"])
    return text + (f" ± {_number(spread, str(cell['metric']), spec.decimals)}" if math.isfinite(spread) else "")


def _difference(cell: pd.Series, spec: TableSpec) -> str:
    if not math.isfinite(float(cell["difference"])):
        return "–"
    column = str(cell["metric"])
    low, high = (_number(float(cell[k]), column, spec.decimals, signed=True) for k in ("difference_low",
                                                                                        "difference_high"))
    return f"{_number(float(cell['difference']), column, spec.decimals, signed=True)} [{low}, {high}]"


def column_headers(spec: TableSpec, table: TableCells) -> list[tuple[str, list[str]]]:
    """Per setup: its header and its columns' headers (each metric, its Δ column, MaC-Cal Table 1's ECE)."""
    groups = []
    for setup in table.setups:
        headers = []
        for column, header in spec.metrics.items():
            headers.append(header)
            if spec.difference and table.control is not None and column not in policy.DESCRIPTIVE_COLUMNS:
                headers.append(f"Δ{header} vs {spec.name_of(table.control)} [CI]")
        if any(key[0] == setup.header for key in table.published):
            headers.append("ECE (paper)")
        groups.append((setup.header, headers))
    return groups


def table_grid(spec: TableSpec, table: TableCells) -> list[tuple[str, list[Cell]]]:
    """One (printed name, cells) per spec row in the spec's order, the cells in :func:`column_headers`' order."""
    by_key = {(str(c["setup"]), str(c["label"]), str(c["metric"])): c for _, c in table.cells.iterrows()}
    best = _best(spec, table) if spec.bold else set()
    grid = []
    for row in spec.rows:
        cells: list[Cell] = []
        for setup in table.setups:
            key_setup = f"{setup.dataset}/{setup.arch}"
            for column in spec.metrics:
                cell = by_key.get((key_setup, row.label, column))
                cells.append(("–", False, "") if cell is None else
                             (_value(cell, spec), (key_setup, row.label, column) in best, str(cell["marker"] or "")))
                if spec.difference and table.control is not None and column not in policy.DESCRIPTIVE_COLUMNS:
                    cells.append(("–" if cell is None else _difference(cell, spec), False, ""))
            if any(key[0] == setup.header for key in table.published):
                value = table.published.get((setup.header, row.label))
                cells.append(("–" if value is None else f"{value:.2f}", False, ""))
        grid.append((row.name, cells))
    return grid


def _best(spec: TableSpec, table: TableCells) -> set[tuple[str, str, str]]:
    """The (setup, label, metric) of the best mean of each column (ties: all of them); none for descriptive ones."""
    best = set()
    cells = table.cells[~table.cells["metric"].isin(policy.DESCRIPTIVE_COLUMNS)]
    for (setup, column), group in cells.groupby(["setup", "metric"], sort=False):
        values = comparison_values(str(column), group["mean"].to_numpy(dtype=float))
        if not np.isfinite(values).any() or len(group) < 2:
            continue
        target = np.nanmax(values) if column_higher_is_better(str(column)) else np.nanmin(values)
        best |= {(str(setup), str(label), str(column)) for label, v in zip(group["label"], values, strict=True)
                 if v == target}
    return best


def caption_of(spec: TableSpec, table: TableCells) -> str:
    """The spec's caption and what the cells are: the spread, the seeds (n), the control and the markers."""
    n = sorted({int(v) for v in table.cells["n"]}) if not table.cells.empty else []
    seeds = "–" if not n else str(n[0]) if len(n) == 1 else f"{n[0]}–{n[-1]}"
    spread = {"ci": "mean ± 95% CI", "std": "mean ± std", "none": "mean"}[spec.spread]
    text = f"{spec.caption} {spread} over n = {seeds} seeds; fractions in percent."
    if spec.difference and table.control is not None:
        text += f" Δ: paired difference from {spec.name_of(table.control)} with its 95% CI."
    return text


def markdown(spec: TableSpec, table: TableCells) -> str:
    """The table in Markdown: one column per setup × metric (headed ``<setup> · <metric>``; the metric alone, and the
    setup in the caption, for one setup), the legend under it."""
    groups = column_headers(spec, table)
    caption = caption_of(spec, table) + (f" Setup: {groups[0][0]}." if len(groups) == 1 else "")
    header = ["Method"] + [h if len(groups) == 1 else f"{setup} · {h}" for setup, headers in groups for h in headers]
    lines = [caption, "", "| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for name, cells in table_grid(spec, table):
        shown = [(f"**{text}**" if bold else text) + (f" {MARKS[mark]}" if mark else "") for text, bold, mark in cells]
        lines.append("| " + " | ".join([name, *shown]) + " |")
    lines += ["", *table.legend] if table.legend else []
    return "\n".join(lines) + "\n"


def latex(spec: TableSpec, table: TableCells) -> str:
    """The table in LaTeX for ``\\input``: needs booktabs, graphicx (the scaling) and amssymb (the markers)."""
    groups = column_headers(spec, table)
    widths = [len(headers) for _, headers in groups]
    spans, start = [], 2
    for width in widths:
        spans.append((start, start + width - 1))
        start += width
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_escape(caption_of(spec, table))}}}",
             rf"\label{{{latex_escape(spec.label)}}}",
             r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
             r"\begin{tabular}{l" + "".join(" " + "r" * w for w in widths) + "}", r"\toprule"]
    lines.append(" & ".join([""] + [rf"\multicolumn{{{w}}}{{c}}{{{latex_escape(h)}}}"
                                    for (h, _), w in zip(groups, widths, strict=True)]) + r" \\")
    lines.append(" ".join(rf"\cmidrule(lr){{{a}-{b}}}" for a, b in spans))
    lines.append(" & ".join(["Method"] + [latex_escape(h) for _, headers in groups for h in headers]) + r" \\")
    lines.append(r"\midrule")
    for name, cells in table_grid(spec, table):
        shown = [(rf"\textbf{{{latex_escape(text)}}}" if bold else latex_escape(text))
                 + (LATEX_MARKS[mark] if mark else "") for text, bold, mark in cells]
        lines.append(" & ".join([latex_escape(name), *shown]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}}"]
    if table.legend:
        legend = " ".join(map(latex_escape, table.legend))
        lines.append(r"\par\smallskip{\footnotesize\raggedright " + legend + r"\par}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"
