"""Figures from the store: γ sensitivity with its confidence band, and q_t trajectories (MaC-Cal Figs. 7-8)."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

__all__ = ["plot_bars", "plot_critical_difference", "plot_gamma_sensitivity", "plot_metric_against", "plot_reliability",
           "plot_retention"]


def _save(fig: plt.Figure, path: Path, *, dpi: int) -> Path:
    """Save ``fig`` as PNG under a hidden temporary name, then rename it into place, and close it."""
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    os.replace(tmp, path)
    return path


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_ece, ax_q) = plt.subplots(1, 2, figsize=(10, 4))
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
    ax_q.legend(fontsize=8)
    ax_q.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path, dpi=120)


def plot_retention(history: pd.DataFrame, by: str, path: str | os.PathLike, *, title: str = "") -> Path:
    """q_t against the Stage-II epoch, one line per value of ``by`` (mean over seeds, in the order the
    values first appear), as MaC-Cal's Fig. 8 draws it.

    ``history`` has the Stage-II rows (``epoch``, ``retention_prob``) and the column ``by``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, value in enumerate(dict.fromkeys(history[by])):
        rows = history[history[by] == value].groupby("epoch")
        curve = rows["retention_prob"].mean()
        ax.plot(curve.index, curve.to_numpy(), color=f"C{i}", label=str(value))
    ax.set_xlabel("Stage-II epoch t")
    ax.set_ylabel("retention probability q_t (mean over seeds)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path, dpi=120)


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
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
    return _save(fig, path, dpi=120)


def plot_reliability(bins: pd.DataFrame, path: str | os.PathLike, *, title: str = "") -> Path:
    """Reliability diagrams, one panel per ``label``: accuracy per confidence bin against the diagonal,
    with the number of test samples in each bin written above its bar.

    ``bins`` has one row per (label, bin) with ``label``, ``bin``, ``count``, ``confidence``, ``accuracy``
    (already pooled over seeds), and optionally ``accuracy_lower`` / ``accuracy_upper``, drawn as error
    bars on the accuracy bars of the non-empty bins (the Clopper–Pearson intervals of
    :func:`calib.report.build.pooled_bins`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    labels = list(dict.fromkeys(bins["label"]))
    ncols = min(4, len(labels))
    nrows = -(-len(labels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 3.2 * nrows), squeeze=False)
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
                ax.text(x, min(top, 0.92) + 0.02, str(int(count)), ha="center", fontsize=6, rotation=90)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(str(label), fontsize=9)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path, dpi=110)


def plot_bars(summary: pd.DataFrame, label: str, metric: str, path: str | os.PathLike, *, ylabel: str,
              title: str = "") -> Path:
    """Bars of ``<metric>_mean`` (percent) per ``label`` in order, with 95% CI error bars (ablation rows)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(summary)), 4))
    x = range(len(summary))
    ax.bar(x, 100 * summary[f"{metric}_mean"], yerr=100 * summary[f"{metric}_ci"].fillna(0), capsize=4,
           color="C0", alpha=0.8)
    ax.set_xticks(list(x), [str(v) for v in summary[label]], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return _save(fig, path, dpi=120)


def plot_critical_difference(ranks: pd.Series, cd: float, groups: list[list[str]], path: str | os.PathLike, *,
                             control: str | None = None, better: tuple[str, ...] = (), worse: tuple[str, ...] = (),
                             title: str = "", note: str = "") -> Path:
    """Demšar's critical-difference diagram: an axis of average ranks (1 = best, on the left) with CD drawn above
    it, each method hanging off its rank (the better half to the left, the rest to the right), and a thick bar
    under the axis joining each group of methods not significantly different (``groups``).

    ``control`` is drawn in red and bold; the methods in ``better`` / ``worse`` (significantly better / worse
    than the control) get ▲ / ▼ after their name. ``note`` goes under the diagram.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = ranks.sort_values(kind="stable")
    k = len(ordered)
    low, high = 1.0, float(max(k, 2))
    left = list(ordered.index[: (k + 1) // 2])
    right = list(ordered.index[(k + 1) // 2:])[::-1]  # the worst closest to the axis, so no lines cross
    step, bar_step = 0.32, 0.16
    first_level = 0.35 + bar_step * len(groups)
    depth = first_level + step * max(len(left), len(right))
    fig, ax = plt.subplots(figsize=(8, 1.3 + 0.9 * depth))
    span = high - low
    ax.set_xlim(low - 0.75 * span, high + 0.75 * span)
    ax.set_ylim(depth + (0.45 if note else 0.15), -1.0)
    ax.axis("off")

    ax.plot([low, high], [0, 0], color="k", lw=1.2)
    for tick in np.arange(low, high + 0.25, 0.5):
        major = float(tick).is_integer()
        ax.plot([tick, tick], [0, -0.1 if major else -0.05], color="k", lw=1)
        if major:
            ax.text(tick, -0.17, f"{tick:g}", ha="center", va="bottom", fontsize=9)
    ax.plot([low, low + cd], [-0.62, -0.62], color="k", lw=1.5)
    for end in (low, low + cd):
        ax.plot([end, end], [-0.68, -0.56], color="k", lw=1)
    ax.text(low + cd / 2, -0.7, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=9)

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
                    fontsize=9, color=colour, fontweight="bold" if name == control else "normal")
    if note:
        ax.text((low + high) / 2, depth + 0.3, note, ha="center", va="center", fontsize=7.5, color="0.3", wrap=True)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path, dpi=130)
