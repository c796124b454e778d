"""PTS's test NLL on real CIFAR outputs does not move with its speed-ups (issue 62): the paper's protocol (100,000
Adam steps on mini-batches of 1000, seed 0) on netcal's three records, benchmarks/posthoc_fit.py's stratified 50/50
split (seed 0), against the test NLL the code before issue 62 gave (docs/how-to/benchmarks.md's table of
2026-11-28); the issue's tolerance: 1e-3.

Needs the records (EFS-OpenSource/calibration-framework, ``examples/classification/records/``): set
``CALIB_NETCAL_RECORDS`` to their folder, else the tests are skipped. A minute or two a record."""

from pathlib import Path

import pytest
import torch
from posthoc_benchmark import RECORDS, benchmark, needs_records

from calib.metrics.nll import negative_log_likelihood
from calib.posthoc import POSTHOC
from calib.posthoc._base import log_probabilities

BEFORE = {"densenet-bc-100-cifar-100.npz": 0.88434, "wideresnet-16-4-cifar-10.npz": 0.27929,
          "lenet-5-cifar-10.npz": 1.31071}
"""PTS's test NLL by record before issue 62 (printed to 5 decimals)."""

pytestmark = [pytest.mark.usefixtures("one_thread"), needs_records]


@pytest.mark.parametrize("record", list(BEFORE))
def test_the_test_nll_is_unchanged(record):
    bench = benchmark()
    probs, labels = bench.load_records(Path(RECORDS) / record)
    calibration, test = bench.split(labels, 0)
    log_probs = log_probabilities(probs)
    fitted = POSTHOC.create("parameterized_ts").fit(log_probs[calibration], torch.from_numpy(labels[calibration]))
    assert len(fitted.loss_history) == 100_000
    test_nll = negative_log_likelihood(fitted.probs(log_probs[test]).numpy(), labels[test])
    assert test_nll == pytest.approx(BEFORE[record], abs=1e-3)
