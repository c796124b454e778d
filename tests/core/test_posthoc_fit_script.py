"""benchmarks/posthoc_fit.py on a small generated netcal-format record (no real model outputs needed): the split,
the rows, the table and the TS comparison with probmetrics and netcal."""


import numpy as np
import pytest
from posthoc_benchmark import benchmark


@pytest.fixture
def record(tmp_path):
    """A netcal-format .npz: float32 softmax probabilities of an over-confident 4-class model, 400 samples."""
    rng = np.random.default_rng(0)
    logits = 3 * rng.normal(size=(400, 4))
    labels = np.array([rng.choice(4, p=np.exp(row / 2) / np.exp(row / 2).sum()) for row in logits])
    probs = np.exp(logits - logits.max(1, keepdims=True))
    path = tmp_path / "model.npz"
    np.savez(path, predictions=(probs / probs.sum(1, keepdims=True)).astype(np.float32), ground_truth=labels)
    return path


def test_records_split_and_rows(record):
    module = benchmark()
    probs, labels = module.load_records(record)
    assert probs.dtype == np.float64 and np.abs(probs.sum(1) - 1).max() < 1e-15 and labels.dtype == np.int64
    cal, test = module.split(labels, seed=3)
    assert len(cal) == len(test) == 200 and not set(cal) & set(test)
    np.testing.assert_array_equal(np.bincount(labels[cal], minlength=4) - np.bincount(labels[test], minlength=4) <= 1,
                                  True)  # stratified
    assert not np.array_equal(module.split(labels, seed=4)[0], cal)
    from calib.posthoc import POSTHOC

    rows = module.rows()
    assert {row.name for row in rows} == set(POSTHOC.names())  # every registered calibrator, each once
    assert [row.label for row in rows][:4] == ["TS", "SMART", "CTS", "PTS"]
    assert all(row.name in POSTHOC.names() for row in module.rows(["TS", "VS"]))
    with pytest.raises(SystemExit, match=r"unknown or unregistered methods \['XYZ'\]"):
        module.rows(["TS", "XYZ"])


def test_the_table_and_the_ts_comparison(record, capsys):
    assert benchmark().main([str(record), "--methods", "TS", "IR", "IRM", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = lines.index("| method | calib fit + apply s (CPU s) | calib test NLL | probmetrics counterpart "
                         "| its fit + apply s | its test NLL | NLL calib − it | max \\|Δp̂\\| |")
    ts, ir, irm = (line.split(" | ") for line in lines[header + 2:header + 5])
    assert ts[0] == "| TS" and ts[3] == 'get_calibrator("temp-scaling")' and abs(float(ts[6])) < 1e-4
    assert float(ts[7].rstrip(" |")) < 1e-6  # the same temperature: the same probabilities
    assert ir[3] == 'get_calibrator("isotonic")' and float(ir[7].rstrip(" |")) < 1e-12
    assert irm[3:] == ["—", "—", "—", "—", "— |"]
    assert "model.npz: 400 samples, K = 4, 200 calibration / 200 test (seed 1)" in out
    gaps = [float(value.split(";")[0]) for value in out.split("TS test NLL, calib − probmetrics temp-scaling: ")[1]
            .replace("calib − netcal TemperatureScaling: ", "").split(" (")[0].split("; ")]
    assert max(map(abs, gaps)) <= 1e-4


def test_a_failed_or_missing_reference_in_the_table():
    module = benchmark()
    lines = module.table([
        (module.Method("X", "x", "ref()"), module.Fit(1.0, 0.5, 0.25, probs=np.ones((1, 2)) / 2),
         module.Fit(error="ImportError: missing")),
        (module.Method("Y", "y"), module.Fit(2.0, 1.5, 0.125), None),
        (module.Method("Z", "z", "ref()"), module.Fit(3.0, 2.5, 0.5, probs=np.array([[0.5, 0.5]])),
         module.Fit(0.1, 0.1, 0.375, probs=np.array([[0.25, 0.75]])))])
    assert lines[2:] == ["| X | 1.00 (0.50) | 0.25000 | ref() | failed: ImportError: missing | — | — | — |",
                         "| Y | 2.00 (1.50) | 0.12500 | — | — | — | — | — |",
                         "| Z | 3.00 (2.50) | 0.50000 | ref() | 0.10 | 0.37500 | +0.12 | 2.5e-01 |"]


def test_the_side_by_side_seconds_and_issue_62s_bounds():
    module = benchmark()
    fit, method = module.Fit, module.Method
    pts, ts = method("PTS", "parameterized_ts"), method("TS", "temperature_scaling", "r")
    beta = method("Beta", "b", "r")
    files = [("a.npz", 100, [(pts, fit(61.0, 60.0, 0.5), None), (ts, fit(1.0, 1.0, 0.5), fit(0.4, 0.4, 0.5)),
                             (beta, fit(9.0, 9.0, 0.5), fit(1.0, 1.0, 0.5))]),
             ("b.npz", 10, [(pts, fit(6.0, 6.0, 0.5), None), (ts, fit(1.0, 1.0, 0.5), fit(0.5, 0.5, 0.5)),
                            (beta, fit(1.0, 1.0, 0.5), fit(error="ValueError: binary only"))])]
    assert module.summary(files) == [
        "| method | a.npz (K = 100): calib s | probmetrics s | ratio "
        "| b.npz (K = 10): calib s | probmetrics s | ratio |",
        "|---|---|---|---|---|---|---|",
        "| PTS | 61.00 | — | — | 6.00 | — | — |",
        "| TS | 1.00 | 0.40 | **2.50** | 1.00 | 0.50 | 2.00 |",  # 1.0 / 0.4 over the bound of 2
        "| Beta | 9.00 | 1.00 | 9.00 | 1.00 | failed: ValueError: binary only | — |"]  # not the same method
    # PTS's 60-s bound holds at K >= 100 only; Beta's counterpart is another method: no ratio bound
    assert module.acceptance(files) == ["a.npz PTS: 61.0 s (<= 60 s) NOT MET",
                                        "a.npz TS: 2.50x probmetrics (<= 2x) NOT MET",
                                        "b.npz TS: 2.00x probmetrics (<= 2x) ok"]
