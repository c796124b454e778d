"""Input validation shared by every metric: one contract test per metric name (ids = names)."""

from __future__ import annotations

import numpy as np
import pytest

from calib.metrics import METRICS, MetricSpec

NAMES = list(METRICS)


@pytest.fixture(params=NAMES, ids=NAMES)
def metric(request: pytest.FixtureRequest) -> MetricSpec:
    return METRICS[request.param]


def test_accepts_valid(metric: MetricSpec, worked: tuple[np.ndarray, np.ndarray]) -> None:
    probs, labels = worked
    assert isinstance(metric(probs, labels), float)


@pytest.mark.parametrize(
    ("probs", "pattern"),
    [
        (np.array([0.5, 0.5]), r"^`probs` must be a 2-D array of shape \(N, C\), got shape \(2,\)\.$"),
        (np.zeros((0, 3)), r"^`probs` must contain at least one sample \(row\), got shape \(0, 3\)\.$"),
        (
            np.ones((2, 1)),
            r"^`probs` must have at least 2 classes \(columns\), got shape \(2, 1\)\. .*\[1 - p, p\]",
        ),
        (
            np.array([[0.5, 0.5], [0.5, np.nan]]),
            r"^`probs` must be finite \(no NaN or inf\), got probs\[1, 1\]=nan\.$",
        ),
        (
            np.array([[1.1, -0.1], [0.5, 0.5]]),
            r"^`probs` entries must lie in \[0, 1\], got probs\[0, 0\]=1\.1\.$",
        ),
        (
            np.array([[0.5, 0.5], [0.6, 0.6]]),
            r"^`probs` rows must sum to 1 \(tolerance 1e-06\), got row 1 summing to 1\.2",
        ),
        (np.array([["a", "b"]] * 2), r"^`probs` must be a real numeric array, got dtype <U1\.$"),
    ],
    ids=["1d", "empty", "one-class", "nan", "outside-01", "row-sum", "strings"],
)
def test_bad_probs(metric: MetricSpec, probs: np.ndarray, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        metric(probs, np.zeros(len(probs), dtype=int))


def test_logits_are_never_guessed(metric: MetricSpec) -> None:
    # Logits that happen to lie in [0, 1] are still rejected, with a pointer to softmax64.
    logits = np.array([[0.2, 0.9, 0.1], [0.7, 0.3, 0.4]])
    with pytest.raises(
        ValueError, match=r"got row 0 summing to 1\.2.*Pass probabilities, not logits.*softmax64"
    ):
        metric(logits, np.array([1, 0]))


def test_row_sum_tolerance(metric: MetricSpec) -> None:
    labels = np.array([0, 1])
    metric(np.array([[0.5 + 5e-7, 0.5], [0.25, 0.75]]), labels)  # within 1e-6: accepted
    with pytest.raises(
        ValueError, match=r"rows must sum to 1 \(tolerance 1e-06\), got row 0 summing to 1\.0000019"
    ):
        metric(np.array([[0.5 + 2e-6, 0.5], [0.25, 0.75]]), labels)


@pytest.mark.parametrize(
    ("labels", "pattern"),
    [
        (
            np.array([0, 1, 1, 0, 2, 3]),
            r"^`labels` must be in \[0, C\) = \[0, 3\) where C = probs\.shape\[1\], got labels\[5\]=3\.$",
        ),
        (np.array([0, -1, 1, 0, 2, 0]), r"got labels\[1\]=-1\.$"),
        (
            np.array([0, 1, 1, 0, 2]),
            r"^`labels` must be a 1-D array of shape \(N,\) = \(6,\) matching `probs` of shape \(6, 3\), "
            r"got shape \(5,\)\.$",
        ),
        (np.zeros((6, 1), dtype=int), r"got shape \(6, 1\)\.$"),
        (np.zeros(6), r"^`labels` must have an integer dtype, got dtype float64\.$"),
        (np.zeros(6, dtype=bool), r"^`labels` must have an integer dtype, got dtype bool\.$"),
    ],
    ids=["too-large", "negative", "short", "2d", "float", "bool"],
)
def test_bad_labels(
    metric: MetricSpec, worked: tuple[np.ndarray, np.ndarray], labels: np.ndarray, pattern: str
) -> None:
    probs, _ = worked
    with pytest.raises(ValueError, match=pattern):
        metric(probs, labels)


@pytest.mark.parametrize("num_bins", [0, -1, 1.5, True, None, "15"], ids=repr)
def test_bad_num_bins(metric: MetricSpec, worked: tuple[np.ndarray, np.ndarray], num_bins: object) -> None:
    probs, labels = worked
    with pytest.raises(
        ValueError, match=rf"^`num_bins` must be an integer >= 1, got num_bins={num_bins!r}\.$"
    ):
        metric(probs, labels, num_bins=num_bins)


def test_numpy_integer_num_bins(metric: MetricSpec, worked: tuple[np.ndarray, np.ndarray]) -> None:
    probs, labels = worked
    assert metric(probs, labels, num_bins=np.int64(5)) == metric(probs, labels, num_bins=5)
    with pytest.raises(ValueError, match=r"^`num_bins` must be an integer >= 1, got num_bins=0\.$"):
        metric(probs, labels, num_bins=np.int64(0))
