"""Figures for print: every figure function calib ships draws for one column (3.3 in) or a page (6.9 in), writes
PNG at the dpi asked for, PDF or SVG, and no two of its tick labels overlap (the boxes as drawn)."""

from __future__ import annotations

import struct

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from calib.report import figures
from calib.report.figure_options import FigureOptions, figure_options, use_figure_options
from calib.search import parse_search_space
from calib.search.importance import importance_report


@pytest.fixture(autouse=True)
def _default_options():
    yield
    use_figure_options(FigureOptions())


def _gamma(path):
    gammas = [0.85, 0.9, 0.95, 1.0]
    summary = pd.DataFrame({"method_accuracy_weight": gammas, "test_ece_mean": [0.03, 0.02, 0.025, 0.04],
                            "test_ece_ci": [0.004, 0.003, np.nan, 0.005]})
    history = pd.DataFrame([{"method_accuracy_weight": g, "epoch": e, "retention_prob": 0.9 - 0.01 * e * g}
                            for g in gammas for e in range(20)])
    return figures.plot_gamma_sensitivity(summary, history, path, vanilla=(0.05, 0.01), title="CIFAR-10 · ResNet-20")


def _retention(path):
    history = pd.DataFrame([{"step": s, "epoch": e, "retention_prob": 1 - 0.02 * e * (i + 1)}
                            for i, s in enumerate(["a", "b", "c"]) for e in range(30)])
    return figures.plot_retention(history, "step", path, title="ablation")


def _log_axis(path):
    # a log x axis over less than a decade: matplotlib labels its minor ticks (0.2, 0.3, ... 0.9), which collide
    x = [0.12, 0.2, 0.3, 0.45, 0.6, 0.8]
    summary = pd.DataFrame([{"alpha": a, "family": f, "test_ece_mean": 0.02 + 0.01 * a, "test_ece_ci": 0.002}
                            for f in ["mixup", "mit"] for a in x])
    return figures.plot_metric_against(summary, "alpha", "test_ece", "family", path, xlabel="α", ylabel="ECE (%)",
                                       log_x=True, title="Mixup α")


def _wide_log_axis(path):
    summary = pd.DataFrame([{"n": n, "method": m, "test_ece_mean": 0.05 / np.sqrt(n), "test_ece_ci": 0.001}
                            for m in ["TS", "VS"] for n in [10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000]])
    return figures.plot_metric_against(summary, "n", "test_ece", "method", path, xlabel="calibration images",
                                       ylabel="ECE (%)", log_x=True)


def _reliability(path):
    rng = np.random.default_rng(0)
    rows = []
    for label in ["Vanilla", "TS", "MaC-Cal", "Focal (γ = 3)", "Dual Focal"]:
        for b in range(15):
            acc = float(np.clip((b + 0.5) / 15 + rng.normal(0, 0.05), 0, 1))
            rows.append({"label": label, "bin": b, "count": int(rng.integers(0, 3000)),
                         "confidence": (b + 0.5) / 15, "accuracy": acc,
                         "accuracy_lower": max(0.0, acc - 0.05), "accuracy_upper": min(1.0, acc + 0.05)})
    return figures.plot_reliability(pd.DataFrame(rows), path, title="test")


def _bars(path):
    labels = [f"+ component {i} (γ = 0.9{i})" for i in range(14)]
    summary = pd.DataFrame({"label": labels, "test_ece_mean": np.linspace(0.05, 0.01, 14),
                            "test_ece_ci": np.full(14, 0.003)})
    return figures.plot_bars(summary, "label", "test_ece", path, ylabel="test ECE (%)", title="ablation")


def _critical_difference(path):
    names = ["Vanilla", "TS", "VS", "MaC-Cal", "Focal", "MMCE", "Label smoothing", "Dual Focal"]
    ranks = pd.Series(np.linspace(1.4, 7.2, len(names)), index=names)
    return figures.plot_critical_difference(ranks, 2.1, [["Vanilla", "TS", "VS"], ["VS", "MaC-Cal", "Focal"]], path,
                                            control="TS", better=("Vanilla",), worse=("Dual Focal",),
                                            title="test ECE", note="Nemenyi, α = 0.05, 5 setups")


SLICE_SPACE = {"parameters": {
    "method.accuracy_weight": {"distribution": "uniform", "low": 0.8, "high": 1.0},
    "method.bottleneck_width": {"distribution": "int", "low": 32, "high": 512, "log": True},
    "method.clip_init": {"distribution": "loguniform", "low": 0.02, "high": 0.2},
    "stage1.mixup_alpha": {"distribution": "categorical", "choices": [None, 0.2, 1.0]},
}}


def _slice_rows() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    gamma = rng.uniform(0.8, 1.0, 30)
    return pd.DataFrame({"method_accuracy_weight": gamma, "method_bottleneck_width": rng.integers(32, 513, 30),
                         "method_clip_init": np.exp(rng.uniform(np.log(0.02), np.log(0.2), 30)),
                         "stage1_mixup_alpha": rng.choice([np.nan, 0.2, 1.0], 30), "val_ece": (gamma - 0.9) ** 2})


def _slices(path):
    rows = _slice_rows()
    values = rows.rename(columns=lambda c: c.replace("_", ".", 1) if c != "val_ece" else c)
    return figures.plot_slices(values, "val_ece", path, log=["method.bottleneck_width", "method.clip_init"],
                               categorical=["stage1.mixup_alpha"])


def _search_report(path):
    report = importance_report(_slice_rows(), parse_search_space(SLICE_SPACE), "val_ece", path.parent, path.stem)
    assert report.files[1:], report.notes
    return report.files[1]


def _history(path):
    values = pd.Series([0.12, 0.09, 0.11, 0.07, 0.08, 0.065] * 5, index=range(30))
    return figures.plot_history(values, "val_ece", path, title="search_mac_cal")


FIGURES = {"gamma_sensitivity": _gamma, "retention": _retention, "log_axis": _log_axis,
           "wide_log_axis": _wide_log_axis, "reliability": _reliability, "bars": _bars,
           "critical_difference": _critical_difference, "slices": _slices, "history": _history}


@pytest.mark.parametrize("width", ["column", "page"])
@pytest.mark.parametrize("name", list(FIGURES))
def test_no_tick_labels_overlap(name, width, tmp_path, monkeypatch):
    use_figure_options(FigureOptions(width=width, dpi=72))
    saved = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: saved.append(fig) if fig is not None else close())
    path = FIGURES[name](tmp_path / name)
    assert len(saved) == 1 and path.is_file()
    fig = saved[0]
    fig.canvas.draw()
    drawn = [t for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for t in figures._visible_labels(axis)]
    assert drawn or name == "critical_difference", "no tick label drawn"  # the CD diagram draws its own axis
    assert figures.tick_label_overlaps(fig) == []
    assert fig.get_size_inches()[0] == pytest.approx(3.3 if width == "column" else 6.9)
    close(fig)


def test_tick_label_overlaps_finds_an_overlap():
    # the check itself: two labels at the same place overlap, and the log axis below labels its minor ticks
    fig, ax = plt.subplots(figsize=(3.3, 2))
    ax.set_xticks([0.0, 0.001], ["a long label", "another long label"])
    fig.canvas.draw()
    assert figures.tick_label_overlaps(fig) == [("a long label", "another long label")]
    plt.close(fig)


@pytest.mark.parametrize("width", ["column", "page"])
def test_the_slice_plots_log_axes_overlap_without_the_fix(width, tmp_path, monkeypatch):
    # what the fix removes: drawn as matplotlib draws it, the log axis of bottleneck_width (32-512) labels its
    # minor ticks 2×10², 3×10², ... and they collide
    use_figure_options(FigureOptions(width=width, dpi=72))
    saved = []
    monkeypatch.setattr(figures, "_declutter", lambda fig: fig.canvas.draw())
    monkeypatch.setattr(plt, "close", lambda fig=None: saved.append(fig))
    assert _search_report(tmp_path / "raw").name == "raw_slices.png"
    overlaps = figures.tick_label_overlaps(saved[0])
    assert ("$\\mathdefault{2\\times10^{2}}$", "$\\mathdefault{3\\times10^{2}}$") in overlaps, overlaps


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize(("width", "dpi"), [("column", 300), ("page", 100)])
def test_png_has_the_width_and_dpi_asked_for(width, dpi, tmp_path):
    use_figure_options(FigureOptions(format="png", dpi=dpi, width=width))
    path = _retention(tmp_path / "q.png")
    w, h = _png_size(path.read_bytes())
    inches = {"column": 3.3, "page": 6.9}[width]
    assert path.name == "q.png" and abs(w - inches * dpi) <= 1 and abs(h - 2.5 * dpi if width == "column"
                                                                        else h - 3.4 * dpi) <= 1


@pytest.mark.parametrize(("fmt", "magic"), [("pdf", b"%PDF-"), ("svg", b"<?xml")])
def test_pdf_and_svg(fmt, magic, tmp_path):
    use_figure_options(FigureOptions(format=fmt))
    path = _retention(tmp_path / "rel.png")
    assert path == tmp_path / f"rel.{fmt}" and path.read_bytes().startswith(magic)
    assert not (tmp_path / "rel.png").exists() and sorted(p.name for p in tmp_path.iterdir()) == [f"rel.{fmt}"]
    if fmt == "svg":
        assert b"<svg" in path.read_bytes()[:2000]


def test_options_check_their_values():
    assert figure_options() == FigureOptions("png", 200, "page")
    for bad in ({"format": "gif"}, {"width": "half"}, {"dpi": 0}):
        with pytest.raises(ValueError):
            FigureOptions(**bad)
