"""ODIR's cross-validated choice on real CIFAR outputs does not move with its speed-ups (issue 62): MS-ODIR's and
Dir-ODIR's chosen (λ, μ) and test NLL on netcal's three records (benchmarks/posthoc_fit.py's stratified 50/50 split,
seed 0) as the code before them gave them, recorded 2026-11-29.

Needs the records (EFS-OpenSource/calibration-framework, ``examples/classification/records/``): set
``CALIB_NETCAL_RECORDS`` to their folder, else the tests are skipped. Minutes at 100 classes."""

from pathlib import Path

import pytest
import torch
from posthoc_benchmark import RECORDS, benchmark, needs_records

from calib.metrics.nll import negative_log_likelihood
from calib.posthoc import POSTHOC
from calib.posthoc._base import log_probabilities

BEFORE = {  # (file, method): (λ, μ, test NLL), λ = λ_e·C(C−1) and μ = μ_e·C (docs/methods.md §5.6)
    ("lenet-5-cifar-10.npz", "matrix_scaling"): (9.0, 0.01, 1.2948916048409858),
    ("lenet-5-cifar-10.npz", "dirichlet"): (9.0, 0.01, 1.2948916048418988),
    ("wideresnet-16-4-cifar-10.npz", "matrix_scaling"): (45.0, 0.001, 0.2507727233105743),
    ("wideresnet-16-4-cifar-10.npz", "dirichlet"): (45.0, 0.001, 0.2507727232826549),
    ("densenet-bc-100-cifar-100.npz", "matrix_scaling"): (2475000.0, 1.0, 0.8793217853877779),
    ("densenet-bc-100-cifar-100.npz", "dirichlet"): (2475000.0, 1.0, 0.8793217853877784),
}
"""The issue's tolerance: the same (λ, μ), the test NLL within 1e-4."""

pytestmark = [pytest.mark.usefixtures("one_thread"), needs_records]


@pytest.mark.parametrize(("record", "method"), list(BEFORE))
def test_the_cross_validated_choice_and_test_nll_are_unchanged(record, method):
    bench = benchmark()
    probs, labels = bench.load_records(Path(RECORDS) / record)
    calibration, test = bench.split(labels, 0)
    log_probs = log_probabilities(probs)
    fitted = POSTHOC.create(method).fit(log_probs[calibration], torch.from_numpy(labels[calibration]))
    off_diagonal, intercept, nll = BEFORE[(record, method)]
    assert (fitted.selection.off_diagonal_weight, fitted.selection.intercept_weight) == (off_diagonal, intercept)
    assert fitted.selection.unconverged_fits == 0
    test_nll = negative_log_likelihood(fitted.probs(log_probs[test]).numpy(), labels[test])
    assert test_nll == pytest.approx(nll, abs=1e-4)
