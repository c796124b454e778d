"""``studies/report.py --format/--dpi/--figure-width``: the report's figures in the format asked for, PNGs as wide
as the figure width × dpi. No Ray: two trials run in this process and are written to a store."""

from __future__ import annotations

import struct

import pytest
from trial_fixtures import tiny_config

from calib.report.figure_options import FigureOptions, use_figure_options
from calib.store import write_result
from calib.trial import run_trial
from tests.in_process import run_report


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A vanilla and a MaC-Cal (γ 0.9) trial of the γ study: its table, γ figure and reliability diagrams."""
    tmp = tmp_path_factory.mktemp("formats")
    for method, label, rank in (({"name": "vanilla"}, "vanilla", 0),
                                ({"name": "mac_cal", "accuracy_weight": 0.9}, "MaC-Cal γ=0.9", 1)):
        write_result(tmp / "results", run_trial({**tiny_config(tmp, method=method, study="sensitivity_gamma"),
                                                 "label": label, "label_rank": rank}))
    yield tmp / "results"
    use_figure_options(FigureOptions())


@pytest.mark.parametrize(("fmt", "magic"), [("pdf", b"%PDF-"), ("svg", b"<?xml")])
def test_vector_figures(store, fmt, magic, tmp_path):
    run = run_report("--store", str(store), "--out", str(tmp_path), "--format", fmt, "--figure-width", "column")
    assert run.returncode == 0, run.stderr
    figures = sorted((tmp_path / "figures").iterdir())
    assert [p.suffix for p in figures] == [f".{fmt}"] * len(figures) and len(figures) >= 2
    assert all(p.read_bytes().startswith(magic) for p in figures)
    assert f"{len(figures)} figures)" in run.stdout


def test_png_width_is_the_figure_width_times_the_dpi(store, tmp_path):
    run = run_report("--store", str(store), "--out", str(tmp_path), "--dpi", "150")
    assert run.returncode == 0, run.stderr
    figures = sorted((tmp_path / "figures").glob("*.png"))
    assert figures
    for path in figures:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, _ = struct.unpack(">II", data[16:24])
        assert abs(width - 6.9 * 150) <= 1, (path.name, width)
