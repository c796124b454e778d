"""Every post-hoc calibrator's fit time and test NLL on real model outputs, next to probmetrics 1.3's same method.

Each file is a netcal-format ``.npz`` (``predictions``: softmax probabilities (N, K); ``ground_truth``: labels),
e.g. the records of netcal's repository (EFS-OpenSource/calibration-framework,
``examples/classification/records/``: densenet-bc-100-cifar-100.npz, wideresnet-16-4-cifar-10.npz,
lenet-5-cifar-10.npz). Per file, one stratified 50/50 calibration/test split seeded by ``--seed``; per calibrator,
side by side in this process: calib's fit seconds (wall and CPU) and test NLL, and those of probmetrics' counterpart
where it has one (:data:`REFERENCES`), with netcal 1.4's temperature scaling as a second reference for TS. calib's
calibrators get the log-probabilities (floored at calib.posthoc.PROBABILITY_FLOOR), probmetrics' and netcal's the
probabilities; both the same float64 rows, renormalised to sum 1. Prints a Markdown table per file with the TS
test-NLL differences, then one table of every row's fit seconds on every file, calib's and probmetrics' side by
side with their ratio, and issue 62's bounds, each "ok" or "NOT MET" (:func:`acceptance`). The docs' table, K = 100
and K = 10 in one run:

    python benchmarks/posthoc_fit.py records/densenet-bc-100-cifar-100.npz records/lenet-5-cifar-10.npz

A few rows on another file and split:

    python benchmarks/posthoc_fit.py records/wideresnet-16-4-cifar-10.npz --methods TS VS MS-ODIR --seed 1
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calib._help import HelpFormatter


@dataclass(frozen=True)
class Method:
    """A row: calib's registered calibrator ``name`` under its table ``label``, and probmetrics' counterpart
    (``reference``, how the table names it, built by ``build``; None: probmetrics has none)."""

    label: str
    name: str
    reference: str | None = None
    build: Callable[[], Any] | None = None


def _probmetrics(method: str, **config: Any) -> Callable[[], Any]:
    def build() -> Any:
        from probmetrics.calibrators import get_calibrator

        return get_calibrator(method, **config)

    return build


def _probmetrics_class(name: str, *args: Any, one_vs_rest: bool = False, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        from probmetrics import calibrators

        calibrator = getattr(calibrators, name)(*args, **kwargs)
        return calibrators.MulticlassOneVsRestCalibrator(calibrator) if one_vs_rest else calibrator

    return build


REFERENCES: dict[str, tuple[str, Callable[[], Any]]] = {
    "TS": ('get_calibrator("temp-scaling")', _probmetrics("temp-scaling")),
    "ETS": ("ETSCalibrator()", _probmetrics_class("ETSCalibrator")),
    "VS": ("VectorScalingCalibrator()", _probmetrics_class("VectorScalingCalibrator")),
    "MS-ODIR": ("MatrixScalingCalibrator() (unregularised)", _probmetrics_class("MatrixScalingCalibrator")),
    "Dir-ODIR": ('get_calibrator("dircal-cv", dircal_use_odir=True)',
                 _probmetrics("dircal-cv", dircal_use_odir=True)),
    "SMS": ('get_calibrator("sms")', _probmetrics("sms", sms_print_init_info=False)),
    "SVS": ('get_calibrator("svs")', _probmetrics("svs", svs_print_init_info=False)),
    "IR": ('get_calibrator("isotonic")', _probmetrics("isotonic")),
    "HB": ("one-vs-rest BinaryHistogramBinningCalibrator(15, uniform)",
           _probmetrics_class("BinaryHistogramBinningCalibrator", n_bins=15, strategy="uniform", one_vs_rest=True)),
    "HB-EM": ("one-vs-rest BinaryHistogramBinningCalibrator(15, quantile)",
              _probmetrics_class("BinaryHistogramBinningCalibrator", n_bins=15, strategy="quantile", one_vs_rest=True)),
    "BBQ": ("NetcalBBQCalibrator()", _probmetrics_class("NetcalBBQCalibrator")),
    "Spline": ("one-vs-rest CDFSplineCalibrator() (calib's: top-label)",
               _probmetrics_class("CDFSplineCalibrator", one_vs_rest=True)),
    "IVAP": ('get_calibrator("ivap")', _probmetrics("ivap")),
    "CIR": ('get_calibrator("cir")', _probmetrics("cir")),
    "Beta": ('get_calibrator("beta")', _probmetrics("beta")),
}
"""probmetrics 1.3's counterpart of each post-hoc row that has one, by the row's label; the rows themselves, their
order and their calibrators are the registry's (``calib.study.rows.POSTHOC_METHODS``)."""

SAME_METHOD = ("TS", "ETS", "VS", "SMS", "SVS", "IR", "HB", "HB-EM", "IVAP", "CIR")
"""The rows whose counterpart is the same method (the others: probmetrics' MS is unregularised, its Dir-ODIR needs
dirichletcal, its BBQ is netcal's variant, its Spline one-vs-rest, its Beta binary only): their fit-time ratio,
calib's over probmetrics', is what :data:`RATIO_LIMIT` bounds."""

RATIO_LIMIT = 2.0
"""Issue 62's bound on calib's fit + apply seconds over probmetrics' for a :data:`SAME_METHOD` row."""

SLOW_ROWS = ("MS-ODIR", "Dir-ODIR", "PTS")
"""The rows whose fit at K >= 100 must take at most :data:`SECONDS_LIMIT` (issue 62)."""

SECONDS_LIMIT = 60.0


@dataclass
class Fit:
    """One fit and its application to the test split: wall and CPU seconds of both together (some references fit at
    prediction: venn-abers), the test NLL and probabilities, or why it failed."""

    seconds: float = float("nan")
    cpu_seconds: float = float("nan")
    nll: float = float("nan")
    error: str | None = None
    probs: np.ndarray | None = None


def load_records(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities (N, K) float64 with rows renormalised to sum 1, labels (N,) int64) of a netcal record."""
    with np.load(path) as record:
        probs, labels = record["predictions"].astype(np.float64), record["ground_truth"].astype(np.int64)
    if probs.ndim != 2 or labels.shape != (probs.shape[0],):
        raise ValueError(f"{path}: `predictions` must be (N, K) and `ground_truth` (N,), got {probs.shape} and "
                         f"{labels.shape}.")
    return probs / probs.sum(axis=1, keepdims=True), labels


def split(labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(calibration, test) indices: a stratified 50/50 split seeded by ``seed``."""
    from sklearn.model_selection import train_test_split

    return train_test_split(np.arange(len(labels)), test_size=0.5, stratify=labels, random_state=seed)


def rows(methods: list[str] | None = None) -> list[Method]:
    """The rows to run: every registered post-hoc method in the tables' order, with its probmetrics counterpart
    where :data:`REFERENCES` has one; only the labels in ``methods`` (all if None)."""
    from calib.study.rows import POSTHOC_METHODS

    chosen = [Method(label, name, *REFERENCES.get(label, (None, None))) for label, name in POSTHOC_METHODS.items()]
    if methods is not None:
        unknown = sorted(set(methods) - {method.label for method in chosen})
        if unknown:
            raise SystemExit(f"unknown or unregistered methods {unknown}; known: {[m.label for m in chosen]}")
        chosen = [method for method in chosen if method.label in methods]
    return chosen


def timed(fit: Callable[[], Callable[[], np.ndarray]], labels: np.ndarray) -> Fit:
    """Time ``fit()`` and the predictor it returns on the test split together (wall and CPU), and score the test
    probabilities by their NLL."""
    from calib.metrics.nll import negative_log_likelihood

    wall, cpu = time.perf_counter(), time.process_time()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probs = fit()()
            seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
            return Fit(seconds, cpu_seconds, negative_log_likelihood(probs, labels), probs=probs)
    except Exception as error:  # a reference that fails on these data is reported, not fatal
        return Fit(time.perf_counter() - wall, time.process_time() - cpu, error=f"{type(error).__name__}: {error}")


def fit_calib(name: str, log_probs: np.ndarray, labels: np.ndarray, cal: np.ndarray,
              test: np.ndarray) -> Callable[[], np.ndarray]:
    import torch

    from calib.posthoc import POSTHOC

    calibrator = POSTHOC.create(name).fit(torch.from_numpy(log_probs[cal]), torch.from_numpy(labels[cal]))
    return lambda: calibrator.probs(torch.from_numpy(log_probs[test])).numpy()


def fit_reference(build: Callable[[], Any], probs: np.ndarray, labels: np.ndarray, cal: np.ndarray,
                  test: np.ndarray) -> Callable[[], np.ndarray]:
    reference = build()
    with contextlib.redirect_stderr(io.StringIO()):  # netcal's progress bars
        reference.fit(probs[cal], labels[cal])

    def predict() -> np.ndarray:
        with contextlib.redirect_stderr(io.StringIO()):
            return np.asarray(reference.predict_proba(probs[test]), dtype=np.float64)

    return predict


def fit_netcal_ts(probs: np.ndarray, labels: np.ndarray, cal: np.ndarray, test: np.ndarray) -> Callable[[], np.ndarray]:
    import netcal.scaling

    reference = netcal.scaling.TemperatureScaling().fit(probs[cal], labels[cal], tensorboard=False)
    return lambda: np.asarray(reference.transform(probs[test]), dtype=np.float64)


def _cells(fit: Fit | None, *, cpu: bool) -> tuple[str, str]:
    """(seconds, test NLL) as the table shows them: "—" where there is no fit, the error where it failed."""
    if fit is None:
        return "—", "—"
    if fit.error:
        return f"failed: {fit.error}", "—"
    return f"{fit.seconds:.2f}" + (f" ({fit.cpu_seconds:.2f})" if cpu else ""), f"{fit.nll:.5f}"


def table(results: list[tuple[Method, Fit, Fit | None]]) -> list[str]:
    """The Markdown table of one file."""
    lines = ["| method | calib fit + apply s (CPU s) | calib test NLL | probmetrics counterpart | its fit + apply s "
             "| its test NLL | NLL calib − it | max \\|Δp̂\\| |", "|---|---|---|---|---|---|---|---|"]
    for method, ours, theirs in results:
        both = theirs is not None and not theirs.error and not ours.error
        gap = f"{ours.nll - theirs.nll:+.2g}" if both else "—"
        apart = f"{np.abs(ours.probs - theirs.probs).max():.1e}" if both else "—"
        (our_seconds, our_nll), (their_seconds, their_nll) = _cells(ours, cpu=True), _cells(theirs, cpu=False)
        lines.append(f"| {method.label} | {our_seconds} | {our_nll} | {method.reference or '—'} | {their_seconds} "
                     f"| {their_nll} | {gap} | {apart} |")
    return lines


FileResults = tuple[str, int, list[tuple[Method, Fit, Fit | None]]]
"""A file's name, its number of classes K and its rows' fits (calib's, probmetrics' or None)."""


def run_file(path: str, methods: list[Method], seed: int, references: bool) -> tuple[dict[str, float], FileResults]:
    """Fit and print one file's table; returns the TS test-NLL differences (calib − probmetrics, − netcal) and the
    fits."""
    from calib.posthoc._base import log_probabilities

    probs, labels = load_records(path)
    cal, test = split(labels, seed)
    log_probs = log_probabilities(probs).numpy()
    print(f"\n{Path(path).name}: {len(labels)} samples, K = {probs.shape[1]}, {len(cal)} calibration / {len(test)} "
          f"test (seed {seed}); log p down to {log_probs.min():.1f}\n", flush=True)
    results, gaps = [], {}
    for method in methods:
        ours = timed(lambda method=method: fit_calib(method.name, log_probs, labels, cal, test), labels[test])
        theirs = None
        if references and method.build is not None:
            theirs = timed(lambda method=method: fit_reference(method.build, probs, labels, cal, test), labels[test])
        results.append((method, ours, theirs))
        print(f"  {method.label}: calib {ours.seconds:.2f} s" + (f", reference {theirs.seconds:.2f} s" if theirs
                                                                   else ""), flush=True)
        if method.label == "TS" and references:
            netcal_ts = timed(lambda: fit_netcal_ts(probs, labels, cal, test), labels[test])
            gaps = {"probmetrics": ours.nll - theirs.nll, "netcal": ours.nll - netcal_ts.nll}
    print("\n" + "\n".join(table(results)), flush=True)
    if gaps:
        print(f"\nTS test NLL, calib − probmetrics temp-scaling: {gaps['probmetrics']:+.2g}; calib − netcal "
              f"TemperatureScaling: {gaps['netcal']:+.2g} (acceptance: |·| <= 1e-4)", flush=True)
    return gaps, (Path(path).name, probs.shape[1], results)


def _ratio(ours: Fit, theirs: Fit | None) -> float | None:
    if theirs is None or ours.error or theirs.error:
        return None
    return ours.seconds / theirs.seconds


def summary(files: list[FileResults]) -> list[str]:
    """The fit + apply seconds of every row on every file side by side, calib's and probmetrics', and their ratio
    (a :data:`SAME_METHOD` row's in bold where it exceeds :data:`RATIO_LIMIT`)."""
    header = "| method | " + " | ".join(f"{name} (K = {classes}): calib s | probmetrics s | ratio"
                                        for name, classes, _ in files) + " |"
    lines = [header, "|---|" + "---|---|---|" * len(files)]
    for position, (method, _, _) in enumerate(files[0][2] if files else []):
        cells = []
        for _, _, results in files:
            _, ours, theirs = results[position]
            ratio = _ratio(ours, theirs)
            shown = "—" if ratio is None else f"{ratio:.2f}"
            if ratio is not None and method.label in SAME_METHOD and ratio > RATIO_LIMIT:
                shown = f"**{shown}**"
            cells += [_cells(ours, cpu=False)[0], _cells(theirs, cpu=False)[0], shown]
        lines.append(f"| {method.label} | " + " | ".join(cells) + " |")
    return lines


def acceptance(files: list[FileResults]) -> list[str]:
    """Issue 62's checks on the fits: at K >= 100 each of :data:`SLOW_ROWS` within :data:`SECONDS_LIMIT`, and every
    :data:`SAME_METHOD` row within :data:`RATIO_LIMIT` times probmetrics' seconds; one line each, "ok" or
    "NOT MET"."""
    lines = []
    for name, classes, results in files:
        for method, ours, theirs in results:
            if classes >= 100 and method.label in SLOW_ROWS and not ours.error:
                verdict = "ok" if ours.seconds <= SECONDS_LIMIT else "NOT MET"
                lines.append(f"{name} {method.label}: {ours.seconds:.1f} s (<= {SECONDS_LIMIT:g} s) {verdict}")
            ratio = _ratio(ours, theirs)
            if method.label in SAME_METHOD and ratio is not None:
                verdict = "ok" if ratio <= RATIO_LIMIT else "NOT MET"
                lines.append(f"{name} {method.label}: {ratio:.2f}x probmetrics (<= {RATIO_LIMIT:g}x) {verdict}")
    return lines


def warm_up(references: bool) -> None:
    """One small temperature-scaling fit of calib's and of each reference before the first timing: what they
    import on first use (the registry's plugins, torch's optimiser machinery) takes seconds, under load a minute,
    which the first row would otherwise count as its fit."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), size=60)
    labels = np.arange(60) % 3
    fit_calib("temperature_scaling", np.log(probs), labels, np.arange(60), np.arange(60))()
    if references:
        fit_reference(REFERENCES["TS"][1], probs, labels, np.arange(60), np.arange(60))()
        fit_netcal_ts(probs, labels, np.arange(60), np.arange(60))()


def cpu_model() -> str:
    """The processor's name as /proc/cpuinfo gives it (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("files", nargs="+", help="netcal-format .npz records (predictions, ground_truth)")
    parser.add_argument("--methods", nargs="+", help="labels of the rows to run (default: all registered)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the stratified 50/50 split")
    parser.add_argument("--no-references", action="store_true", help="time calib only (no probmetrics, netcal)")
    args = parser.parse_args(argv)
    import torch

    methods = rows(args.methods)
    warm_up(not args.no_references)
    print(f"{time.strftime('%Y-%m-%d')} · {cpu_model()} · {len(os.sched_getaffinity(0))} cores · torch threads "
          f"{torch.get_num_threads()} · load average {os.getloadavg()[0]:.1f}", flush=True)
    worst, files = 0.0, []
    for path in args.files:
        gaps, results = run_file(path, methods, args.seed, not args.no_references)
        worst = max([worst, *map(abs, gaps.values())])
        files.append(results)
    print("\nFit + apply seconds side by side (wall; ratio: calib's over probmetrics'):\n\n" + "\n".join(summary(files))
          + "\n\nIssue 62's bounds:\n" + "\n".join(acceptance(files)), flush=True)
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
