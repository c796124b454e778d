"""Figures from the store: γ sensitivity with its confidence band, q_t trajectories (MaC-Cal Figs. 7-8),
reliability diagrams, ablation bars, critical-difference diagrams and a search's slice plot.

Every figure is drawn for the width, and written in the format and resolution, of the
:class:`~calib.report.figure_options.FigureOptions` in use (``--figure-width``, ``--format``, ``--dpi``), and
its tick labels never overlap: where they would (minor labels of a log axis, long category names), the minor
labels go, the numeric labels are thinned and category names turned upright (:func:`save_figure`)."""

from __future__ import annotations

import functools
import itertools
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axis import Axis
from matplotlib.category import StrCategoryFormatter
from matplotlib.text import Text
from matplotlib.ticker import FixedLocator, NullFormatter

from calib.report.figure_options import figure_options

__all__ = ["plot_bars", "plot_critical_difference", "plot_gamma_sensitivity", "plot_history", "plot_metric_against",
           "plot_reliability", "plot_retention", "plot_slices", "save_figure", "tick_label_overlaps"]

F = TypeVar("F", bound=Callable[..., Path])


def _styled(plot: F) -> F:
    """Draw ``plot``'s figure with the type sizes of the figure width in use (smaller in one column)."""

    @functools.wraps(plot)
    def drawn(*args: Any, **kwargs: Any) -> Path:
        column = figure_options().column
        with plt.rc_context({"font.size": 7 if column else 9, "axes.titlesize": "medium",
                             "axes.labelsize": "medium", "legend.fontsize": "small",
                             "xtick.labelsize": "small", "ytick.labelsize": "small"}):
            return plot(*args, **kwargs)
    return drawn  # type: ignore[return-value]


def _figure_size(page_height: float, column_height: float) -> tuple[float, float]:
    """(width, height) in inches of a figure in the width in use."""
    options = figure_options()
    return options.inches, column_height if options.column else page_height


def _visible_labels(axis: Axis) -> list[Text]:
    """The tick labels ``axis`` draws: shown, not empty, at a tick inside its view (matplotlib keeps labels of the
    locator's ticks outside it, which it does not draw)."""
    if not (axis.axes.axison and axis.get_visible()):
        return []
    low, high = sorted(axis.get_view_interval())
    slack = 1e-9 * max(abs(low), abs(high), 1e-300)
    index = 0 if axis is axis.axes.xaxis else 1
    return [t for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text().strip()
            and low - slack <= t.get_position()[index] <= high + slack]


def tick_label_overlaps(fig: plt.Figure) -> list[tuple[str, str]]:
    """The pairs of tick labels of ``fig`` (every axes, both axes, major and minor) whose boxes intersect, as
    drawn: the texts of each pair."""
    renderer = fig.canvas.get_renderer()
    labels = [t for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for t in _visible_labels(axis)]
    boxes = [t.get_window_extent(renderer) for t in labels]
    return [(labels[i].get_text(), labels[j].get_text())
            for i, j in itertools.combinations(range(len(labels)), 2) if boxes[i].overlaps(boxes[j])]


def _axis_overlaps(fig: plt.Figure, axis: Axis) -> bool:
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in _visible_labels(axis)]
    return any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


def _declutter_axes(fig: plt.Figure) -> bool:
    """Remove overlaps of each axis's tick labels: first its minor labels (a log axis labels 2, 3, ... 9 × 10^k
    over a short range), then every other (third, ...) numeric label, or names given one per tick turned
    upright and smaller. Whether anything changed."""
    changed = False
    for axis in (axis for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)):
        if not _axis_overlaps(fig, axis):
            continue
        changed = True
        axis.set_minor_formatter(NullFormatter())
        fig.canvas.draw()
        if isinstance(axis.get_major_locator(), FixedLocator) or isinstance(axis.get_major_formatter(),
                                                                               StrCategoryFormatter):
            # labels set one per tick (names): thinning would drop names, so they stand upright, smaller
            size = axis.get_ticklabels()[0].get_fontsize() if axis.get_ticklabels() else 8.0
            while _axis_overlaps(fig, axis) and size > 4:
                axis.set_tick_params(labelrotation=90 if axis is axis.axes.xaxis else 0, labelsize=size)
                fig.canvas.draw()
                size -= 1
            continue
        low, high = sorted(axis.get_view_interval())
        locations = [v for v in axis.get_majorticklocs() if low <= v <= high]
        step = 2
        while _axis_overlaps(fig, axis) and step <= len(locations):
            axis.set_major_locator(FixedLocator(locations[::step]))
            fig.canvas.draw()
            step += 1
    return changed


def _declutter(fig: plt.Figure) -> None:
    """:func:`_declutter_axes`, with the layout redone after a change (upright names take room), until no tick
    labels overlap."""
    fig.canvas.draw()
    for _ in range(3):
        if not _declutter_axes(fig):
            return
        if fig.get_layout_engine() is None:
            with warnings.catch_warnings():  # tight_layout's, for a figure it cannot fit: drawn as it is
                warnings.simplefilter("ignore", UserWarning)
                fig.tight_layout()
        fig.canvas.draw()


def save_figure(fig: plt.Figure, path: str | os.PathLike) -> Path:
    """Write ``fig`` to ``path`` with the suffix of the format in use (``.png``, ``.pdf``, ``.svg``) at the dpi
    in use, its overlapping tick labels removed first; under a hidden temporary name, then renamed into place.
    Closes ``fig``; returns the path written."""
    options = figure_options()
    path = Path(path).with_suffix(f".{options.format}")
    path.parent.mkdir(parents=True, exist_ok=True)
    _declutter(fig)
    tmp = path.with_name(f".{path.name}.tmp.{options.format}")
    try:
        fig.savefig(tmp, dpi=options.dpi, format=options.format)
    finally:
        plt.close(fig)
    os.replace(tmp, path)
    return path


@_styled
def plot_gamma_sensitivity(
    summary: pd.DataFrame,
    history: pd.DataFrame,
    path: str | os.PathLike,
    *,
    vanilla: tuple[float, float] | None = None,
    title: str = "",
) -> Path:
    """Left: test ECE (%) against γ, mean with its 95% CI band (and the vanilla level); right: q_t per γ.

    ``summary`` has ``method_accuracy_weight``, ``test_ece_mean``, ``test_ece_ci``; ``history`` has the
    Stage-II rows (``epoch``, ``retention_prob``) joined with ``method_accuracy_weight``.
    """
    column = figure_options().column
    fig, (ax_ece, ax_q) = plt.subplots(2 if column else 1, 1 if column else 2, figsize=_figure_size(3.0, 4.8))
    s = summary.sort_values("method_accuracy_weight")
    gammas = s["method_accuracy_weight"].to_numpy()
    mean, ci = 100 * s["test_ece_mean"].to_numpy(), 100 * s["test_ece_ci"].fillna(0).to_numpy()
    ax_ece.plot(gammas, mean, "o-", color="C0", label="MaC-Cal")
    ax_ece.fill_between(gammas, mean - ci, mean + ci, color="C0", alpha=0.2, label="95% CI")
    if vanilla is not None:
        v_mean, v_ci = 100 * vanilla[0], 100 * (vanilla[1] if vanilla[1] == vanilla[1] else 0.0)
        ax_ece.axhline(v_mean, color="C3", ls="--", label="vanilla (Stage I)")
        ax_ece.axhspan(v_mean - v_ci, v_mean + v_ci, color="C3", alpha=0.1)
    ax_ece.set_xlabel("γ (accuracy weight)")
    ax_ece.set_ylabel("test ECE (%)")
    ax_ece.legend()
    ax_ece.grid(alpha=0.3)
    cmap = plt.get_cmap("viridis")
    for i, (gamma, group) in enumerate(history.groupby("method_accuracy_weight")):
        curve = group.groupby("epoch")["retention_prob"].mean()
        ax_q.plot(curve.index, curve.to_numpy(), color=cmap(i / max(1, len(gammas) - 1)), label=f"γ = {gamma:g}")
    ax_q.set_xlabel("Stage-II epoch t")
    ax_q.set_ylabel("retention probability q_t (mean over seeds)")
    ax_q.legend(fontsize="x-small")
    ax_q.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


@_styled
def plot_retention(history: pd.DataFrame, by: str, path: str | os.PathLike, *, title: str = "") -> Path:
    """q_t against the Stage-II epoch, one line per value of ``by`` (mean over seeds, in the order the
    values first appear), as MaC-Cal's Fig. 8 draws it.

    ``history`` has the Stage-II rows (``epoch``, ``retention_prob``) and the column ``by``."""
    fig, ax = plt.subplots(figsize=_figure_size(3.4, 2.5))
    for i, value in enumerate(dict.fromkeys(history[by])):
        rows = history[history[by] == value].groupby("epoch")
        curve = rows["retention_prob"].mean()
        ax.plot(curve.index, curve.to_numpy(), color=f"C{i}", label=str(value))
    ax.set_xlabel("Stage-II epoch t")
    ax.set_ylabel("retention probability q_t (mean over seeds)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize="x-small")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)


@_styled
def plot_metric_against(
    summary: pd.DataFrame,
    x: str,
    metric: str,
    group: str,
    path: str | os.PathLike,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    log_x: bool = False,
) -> Path:
    """One line per ``group`` of ``<metric>_mean`` (percent) against ``x``, with its 95% CI band."""
    fig, ax = plt.subplots(figsize=_figure_size(3.4, 2.5))
    for i, (name, rows) in enumerate(summary.groupby(group, sort=False, observed=True)):
        rows = rows.sort_values(x)
        mean = 100 * rows[f"{metric}_mean"].to_numpy()
        ci = 100 * rows[f"{metric}_ci"].fillna(0).to_numpy()
        ax.plot(rows[x], mean, "o-", color=f"C{i}", label=str(name))
        ax.fill_between(rows[x], mean - ci, mean + ci, color=f"C{i}", alpha=0.15)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)


@_styled
def plot_reliability(bins: pd.DataFrame, path: str | os.PathLike, *, title: str = "") -> Path:
    """Reliability diagrams, one panel per ``label``: accuracy per confidence bin against the diagonal,
    with the number of test samples in each bin written above its bar.

    ``bins`` has one row per (label, bin) with ``label``, ``bin``, ``count``, ``confidence``, ``accuracy``
    (already pooled over seeds), and optionally ``accuracy_lower`` / ``accuracy_upper``, drawn as error
    bars on the accuracy bars of the non-empty bins (the Clopper–Pearson intervals of
    :func:`calib.report.build.pooled_bins`).
    """
    labels = list(dict.fromkeys(bins["label"]))
    ncols = min(2 if figure_options().column else 4, len(labels))
    nrows = -(-len(labels) // ncols)
    height = figure_options().inches / ncols * nrows + (0.3 if title else 0)  # square panels
    fig, axes = plt.subplots(nrows, ncols, figsize=_figure_size(height, height), squeeze=False)
    for ax, label in zip(axes.flat, labels, strict=False):
        rows = bins[bins["label"] == label].sort_values("bin")
        num_bins = len(rows)
        width = 1.0 / num_bins
        centres = (rows["bin"].to_numpy() + 0.5) * width
        ax.bar(centres, rows["accuracy"], width=width, edgecolor="k", color="C0", alpha=0.8, label="accuracy")
        ax.bar(centres, rows["confidence"] - rows["accuracy"], bottom=rows["accuracy"], width=width,
               color="C3", alpha=0.3, label="gap")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        tops = rows["accuracy"].to_numpy(dtype=float)
        if {"accuracy_lower", "accuracy_upper"} <= set(rows.columns):
            filled = rows["count"].to_numpy() > 0
            acc = tops[filled]
            lower = rows["accuracy_lower"].to_numpy(dtype=float)[filled]
            upper = rows["accuracy_upper"].to_numpy(dtype=float)[filled]
            ax.errorbar(centres[filled], acc, yerr=np.clip([acc - lower, upper - acc], 0, None), fmt="none",
                        ecolor="k", elinewidth=0.8, capsize=1.5, label="95% CI")
            tops = np.where(filled, np.maximum(tops, rows["accuracy_upper"].to_numpy(dtype=float)), tops)
        for x, top, count in zip(centres, tops, rows["count"], strict=True):
            if count:
                ax.text(x, min(top, 0.92) + 0.02, str(int(count)), ha="center", fontsize="xx-small", rotation=90)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(str(label), fontsize="small")
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


@_styled
def plot_bars(summary: pd.DataFrame, label: str, metric: str, path: str | os.PathLike, *, ylabel: str,
              title: str = "") -> Path:
    """Bars of ``<metric>_mean`` (percent) per ``label`` in order, with 95% CI error bars (ablation rows)."""
    fig, ax = plt.subplots(figsize=_figure_size(3.2, 2.6))
    x = range(len(summary))
    ax.bar(x, 100 * summary[f"{metric}_mean"], yerr=100 * summary[f"{metric}_ci"].fillna(0), capsize=4,
           color="C0", alpha=0.8)
    ax.set_xticks(list(x), [str(v) for v in summary[label]], rotation=30, ha="right", rotation_mode="anchor")
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)


@_styled
def plot_critical_difference(ranks: pd.Series, cd: float, groups: list[list[str]], path: str | os.PathLike, *,
                             control: str | None = None, better: tuple[str, ...] = (), worse: tuple[str, ...] = (),
                             title: str = "", note: str = "") -> Path:
    """Demšar's critical-difference diagram: an axis of average ranks (1 = best, on the left) with CD drawn above
    it, each method hanging off its rank (the better half to the left, the rest to the right), and a thick bar
    under the axis joining each group of methods not significantly different (``groups``).

    ``control`` is drawn in red and bold; the methods in ``better`` / ``worse`` (significantly better / worse
    than the control) get ▲ / ▼ after their name. ``note`` goes under the diagram.
    """
    ordered = ranks.sort_values(kind="stable")
    k = len(ordered)
    low, high = 1.0, float(max(k, 2))
    left = list(ordered.index[: (k + 1) // 2])
    right = list(ordered.index[(k + 1) // 2:])[::-1]  # the worst closest to the axis, so no lines cross
    step, bar_step = 0.32, 0.16
    first_level = 0.35 + bar_step * len(groups)
    depth = first_level + step * max(len(left), len(right))
    fig, ax = plt.subplots(figsize=_figure_size(*[1.0 + 0.7 * depth] * 2))
    span = high - low
    ax.set_xlim(low - 0.75 * span, high + 0.75 * span)
    ax.set_ylim(depth + (0.45 if note else 0.15), -1.0)
    ax.axis("off")

    ax.plot([low, high], [0, 0], color="k", lw=1.2)
    for tick in np.arange(low, high + 0.25, 0.5):
        major = float(tick).is_integer()
        ax.plot([tick, tick], [0, -0.1 if major else -0.05], color="k", lw=1)
        if major:
            ax.text(tick, -0.17, f"{tick:g}", ha="center", va="bottom", fontsize="medium")
    ax.plot([low, low + cd], [-0.62, -0.62], color="k", lw=1.5)
    for end in (low, low + cd):
        ax.plot([end, end], [-0.68, -0.56], color="k", lw=1)
    ax.text(low + cd / 2, -0.7, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize="medium")

    for i, group in enumerate(groups):
        y = 0.25 + bar_step * i
        ax.plot([ordered[group[0]] - 0.03, ordered[group[-1]] + 0.03], [y, y], color="k", lw=3.5,
                solid_capstyle="round")

    def label(name: str) -> str:
        mark = " ▲" if name in better else " ▼" if name in worse else ""
        return f"{name}{mark} ({ordered[name]:.2f})"

    for side, names, edge, align in (("left", left, low - 0.08 * span, "right"),
                                     ("right", right, high + 0.08 * span, "left")):
        for i, name in enumerate(names):
            y, x = first_level + step * i, float(ordered[name])
            colour = "C3" if name == control else "k"
            ax.plot([x, x, edge], [0, y, y], color=colour, lw=1)
            ax.text(edge + (-0.02 if side == "left" else 0.02) * span, y, label(name), ha=align, va="center",
                    fontsize="medium", color=colour, fontweight="bold" if name == control else "normal")
    if note:
        ax.text((low + high) / 2, depth + 0.3, note, ha="center", va="center", fontsize="small", color="0.3", wrap=True)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)


@_styled
def plot_slices(values: pd.DataFrame, objective: str, path: str | os.PathLike, *, log: Sequence[str] = (),
                categorical: Sequence[str] = (), title: str = "") -> Path:
    """A search's slice plot: one panel per parameter (every column of ``values`` but ``objective``), the objective
    of each trial against the parameter's value, coloured by the trial's order; a log x axis for the parameters in
    ``log``, the choices of those in ``categorical`` side by side in the order they first appear."""
    params = [c for c in values.columns if c != objective]
    ncols = min(2 if figure_options().column else 3, len(params))
    nrows = -(-len(params) // ncols)
    side = figure_options().inches / ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=_figure_size(*[0.75 * side * nrows + 0.3] * 2), squeeze=False,
                             sharey=True, layout="constrained")
    order = np.arange(len(values))
    points = None
    for ax, param in zip(axes.flat, params, strict=False):
        x = values[param]
        if param in categorical:
            names = ["None" if pd.isna(v) else str(v) for v in x]
            choices = list(dict.fromkeys(names))
            x = [choices.index(name) for name in names]
            ax.set_xticks(range(len(choices)), choices)
            ax.set_xlim(-0.5, len(choices) - 0.5)
        elif param in log:
            ax.set_xscale("log")
        points = ax.scatter(x, values[objective], c=order, cmap="Blues", edgecolors="0.3", linewidths=0.4, s=14)
        ax.set_xlabel(param, fontsize="small")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel(objective)
    for ax in list(axes.flat)[len(params):]:
        ax.axis("off")
    if points is not None:
        fig.colorbar(points, ax=axes, label="trial", fraction=0.04, pad=0.02)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


@_styled
def plot_history(values: pd.Series, objective: str, path: str | os.PathLike, *, minimize: bool = True,
                 title: str = "") -> Path:
    """A search's optimisation history: each trial's objective (``values``, indexed by trial number, in order)
    and the best so far."""
    fig, ax = plt.subplots(figsize=_figure_size(3.2, 2.4), layout="constrained")
    numbers = np.asarray(values.index, dtype=float)
    objective_values = values.to_numpy(dtype=float)
    best = np.fmin.accumulate(objective_values) if minimize else np.fmax.accumulate(objective_values)
    ax.scatter(numbers, objective_values, s=14, color="tab:blue", edgecolors="0.3", linewidths=0.4, label="trial")
    ax.step(numbers, best, where="post", color="tab:red", label="best so far")
    ax.set_xlabel("Optuna trial")
    ax.set_ylabel(objective)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    return save_figure(fig, path)
