"""Histogram binning (docs/methods.md §5.9), both readings: hand-computed bins, values, ties, empty bins, K = 2 and
renormalisation. The check against netcal is in test_posthoc_references.py."""

import itertools

import numpy as np
import pytest
import torch
from posthoc_cases import check_runs_as_a_method, edge_case_data

from calib._config import ConfigError, from_dict
from calib.methods import METHODS
from calib.posthoc import POSTHOC, DegenerateFitWarning
from calib.posthoc.histogram_binning import (
    HistogramBinningEqualMass,
    HistogramBinningEqualMassConfig,
    HistogramBinningEqualWidth,
    HistogramBinningEqualWidthConfig,
    equal_mass_bin_starts,
)

# Rows 1 and 3 are the same, so their scores tie exactly in every class. Labels 0, 1, 1, 1: class 2 never occurs.
HAND_PROBS = [[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.6, 0.3, 0.1]]
HAND_LABELS = [0, 1, 1, 1]


@pytest.fixture(scope="module")
def hand_fit():
    logits = torch.tensor(HAND_PROBS, dtype=torch.float64).log()
    return HistogramBinningEqualMass(num_bins=2).fit(logits, torch.tensor(HAND_LABELS))


def test_hand_computed_bins(hand_fit):
    # Two bins of 2 nominally (the cut before the 3rd sorted score); ties move a cut down to its tie group.
    # Class 0 scores 0.2 | 0.6, 0.6, 0.7 (the 0.6 tie): targets 0 | 0, 0, 1 → values 0, 1/3; cut (0.2 + 0.6)/2.
    np.testing.assert_array_equal(hand_fit.bin_counts[0], [1, 3])
    np.testing.assert_allclose(hand_fit.bin_values[0], [0.0, 1 / 3])
    np.testing.assert_allclose(hand_fit.cut_points[0], [0.4])
    # Class 1 scores 0.2 | 0.3, 0.3, 0.5: targets 0 | 1, 1, 1 → values 0, 1; cut 0.25.
    np.testing.assert_array_equal(hand_fit.bin_counts[1], [1, 3])
    np.testing.assert_allclose(hand_fit.bin_values[1], [0.0, 1.0])
    np.testing.assert_allclose(hand_fit.cut_points[1], [0.25])
    # Class 2 is absent: every bin is 0.
    np.testing.assert_array_equal(hand_fit.bin_values[2], np.zeros_like(hand_fit.bin_values[2]))


def test_hand_computed_probabilities(hand_fit):
    test = torch.tensor([*HAND_PROBS[:3], [0.3, 0.22, 0.48], [0.45, 0.26, 0.29]], dtype=torch.float64).log()
    expected = [
        [1.0, 0.0, 0.0],      # q = (1/3, 0, 0)
        [0.25, 0.75, 0.0],    # q = (1/3, 1, 0): renormalised; the argmax moves from class 0 to class 1
        [0.0, 1.0, 0.0],      # q = (0, 1, 0)
        [1 / 3, 1 / 3, 1 / 3],  # q = (0, 0, 0): 0.3 < 0.4, 0.22 < 0.25 → uniform
        [0.25, 0.75, 0.0],    # 0.45 > 0.4 and 0.26 > 0.25: the upper bins
    ]
    np.testing.assert_allclose(hand_fit.probs(test).numpy(), expected, atol=1e-300)
    assert hand_fit.probs(test).argmax(1)[1] == 1 and test.argmax(1)[1] == 0


def test_equal_mass_bins_on_distinct_scores():
    scores = np.sort(np.random.default_rng(0).random(103))
    starts = equal_mass_bin_starts(scores, 10)
    counts = np.diff(np.append(starts, 103))
    assert len(counts) == 10 and counts.sum() == 103 and set(counts) <= {10, 11}
    np.testing.assert_array_equal(equal_mass_bin_starts(scores[:4], 15), [0, 1, 2, 3])  # N < B: one bin each
    np.testing.assert_array_equal(equal_mass_bin_starts(np.full(7, 0.5), 3), [0])  # all tied: one bin
    np.testing.assert_array_equal(equal_mass_bin_starts(np.array([0.1, 0.1, 0.1, 0.2, 0.3, 0.4]), 3), [0, 4])


def test_fraction_of_positives_on_random_data():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1000, 4, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 4, (1000,), generator=g)
    calibrator = HistogramBinningEqualMass(num_bins=15).fit(logits, labels)
    probs = logits.softmax(1).numpy()
    for k in range(4):
        order = np.argsort(probs[:, k])
        edges = [j * 1000 // 15 for j in range(16)]  # distinct scores: the bins are ⌊jN/B⌋ .. ⌊(j+1)N/B⌋
        bins = [order[lo:hi] for lo, hi in itertools.pairwise(edges)]
        np.testing.assert_array_equal(calibrator.bin_counts[k], [len(b) for b in bins])
        np.testing.assert_allclose(calibrator.bin_values[k], [np.mean(labels.numpy()[b] == k) for b in bins])


@pytest.mark.parametrize(("name", "logits", "labels"), edge_case_data())
def test_edge_cases(name, logits, labels):
    calibrator = HistogramBinningEqualMass().fit(logits, labels)
    test = torch.cat([logits, 4 * torch.randn(30, logits.shape[1], dtype=torch.float64)])
    out, probs = calibrator(test), calibrator.probs(test)
    assert torch.isfinite(out).all() and out.dtype == torch.float64
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(1), torch.ones(len(test), dtype=torch.float64))
    for k, values in enumerate(calibrator.bin_values):
        assert ((values >= 0) & (values <= 1)).all() and calibrator.bin_counts[k].min() >= 1
    if name == "ties":  # 10 distinct scores per class, 20 copies each: whole tie groups per bin
        assert all(set(counts.tolist()) <= {20, 40} for counts in calibrator.bin_counts)
        torch.testing.assert_close(probs[:10].repeat(20, 1), probs[:200], rtol=0, atol=0)
    if name == "absent_class":
        assert (calibrator.bin_values[4] == 0).all()


def test_registry_config_and_errors():
    assert POSTHOC.get("histogram_binning_equal_mass") is HistogramBinningEqualMass
    assert METHODS.get("histogram_binning_equal_mass").config is HistogramBinningEqualMassConfig
    # the former name, still accepted where a user types it; the registries list the new name only
    assert POSTHOC.get("histogram_binning") is HistogramBinningEqualMass and "histogram_binning" in METHODS
    assert METHODS.canonical("histogram_binning") == "histogram_binning_equal_mass"
    assert "histogram_binning" not in METHODS.names() and "histogram_binning" not in POSTHOC.names()
    assert HistogramBinningEqualMassConfig().num_bins == 15
    assert from_dict(HistogramBinningEqualMassConfig, {"num_bins": 10}).num_bins == 10
    with pytest.raises(ConfigError, match=r"`num_bins` must be an integer >= 1, got num_bins=0"):
        HistogramBinningEqualMassConfig(num_bins=0)
    with pytest.raises(ConfigError, match=r"`num_bins` must be an integer, got num_bins=2.5"):
        from_dict(HistogramBinningEqualMassConfig, {"num_bins": 2.5})
    with pytest.raises(ValueError, match=r"`num_bins` must be an integer >= 1, got num_bins=-3"):
        HistogramBinningEqualMass(num_bins=-3)
    with pytest.raises(RuntimeError, match=r"HistogramBinningEqualMass is not fitted"):
        HistogramBinningEqualMass()(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 2"):
        HistogramBinningEqualMass().fit(torch.randn(9, 3), torch.arange(9) % 3)(torch.zeros(2, 2))


def test_runs_as_a_method_on_float32_logits():
    cases = [("histogram_binning_equal_mass", HistogramBinningEqualMassConfig()),
             ("histogram_binning_equal_mass", HistogramBinningEqualMassConfig(num_bins=4, calibration_size=60))]
    check_runs_as_a_method(cases)


# --- Equal width (HB) ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def width_fit():
    logits = torch.tensor(HAND_PROBS, dtype=torch.float64).log()
    with pytest.warns(DegenerateFitWarning, match=r"class 2 absent from the calibration set"):
        return HistogramBinningEqualWidth(num_bins=3).fit(logits, torch.tensor(HAND_LABELS))


def test_equal_width_hand_computed_bins(width_fit):
    # Bins (0, 1/3], (1/3, 2/3], (2/3, 1]. Class 0 scores 0.7, 0.6, 0.2, 0.6 → bins 2, 1, 0, 1, targets 1, 0, 0, 0.
    assert width_fit.binned_classes == [0, 1, 2]
    np.testing.assert_array_equal(width_fit.bin_counts[0], [1, 2, 1])
    np.testing.assert_allclose(width_fit.bin_values[0], [0.0, 0.0, 1.0], rtol=0, atol=0)
    # Class 1 scores 0.2, 0.3, 0.5, 0.3 → bins 0, 0, 1, 0, targets 0, 1, 1, 1; bin 2 empty: its midpoint 5/6.
    np.testing.assert_array_equal(width_fit.bin_counts[1], [3, 1, 0])
    np.testing.assert_allclose(width_fit.bin_values[1], [2 / 3, 1.0, 5 / 6], rtol=0, atol=1e-15)
    # Class 2 never occurs: 0 in every bin (netcal fits no model for it), empty bins included.
    np.testing.assert_array_equal(width_fit.bin_values[2], [0.0, 0.0, 0.0])
    assert "class 2 absent" in width_fit.degenerate_reason


def test_equal_width_hand_computed_probabilities(width_fit):
    test = torch.tensor([HAND_PROBS[0], HAND_PROBS[1], [0.8, 0.1, 0.1], [0.15, 0.7, 0.15]], dtype=torch.float64).log()
    expected = [
        [0.6, 0.4, 0.0],   # q = (1, 2/3, 0)
        [0.0, 1.0, 0.0],   # q = (0, 2/3, 0): the argmax moves from class 0 to class 1
        [0.6, 0.4, 0.0],   # 0.8 → bin 2 (1), 0.1 → bin 0 (2/3)
        [0.0, 1.0, 0.0],   # 0.7 → class 1's empty bin (5/6), renormalised
    ]
    np.testing.assert_allclose(width_fit.probs(test).numpy(), expected, rtol=0, atol=1e-15)


def test_equal_width_binary_bins_the_class_1_score():
    # K = 2: one binning of p_1 (Guo et al.; netcal), p̂ = (1 − θ, θ). Bins of 1/4: p_1 0.1, 0.2 (labels 0, 1) in
    # bin 0: 1/2; (0.25, 0.5] empty: its midpoint 0.375; 0.6 (1) in bin 2: 1; 0.9, 0.95 (1, 0) in bin 3: 1/2.
    p1 = torch.tensor([0.1, 0.2, 0.6, 0.9, 0.95], dtype=torch.float64)
    logits = torch.stack([(1 - p1).log(), p1.log()], dim=1)
    calibrator = HistogramBinningEqualWidth(num_bins=4).fit(logits, torch.tensor([0, 1, 1, 1, 0]))
    assert calibrator.binned_classes == [1] and not calibrator.degenerate
    np.testing.assert_allclose(calibrator.bin_values[0], [0.5, 0.375, 1.0, 0.5], rtol=0, atol=1e-15)
    test = torch.tensor([0.05, 0.4, 0.7, 0.99], dtype=torch.float64)
    probs = calibrator.probs(torch.stack([(1 - test).log(), test.log()], dim=1)).numpy()
    np.testing.assert_allclose(probs, [[0.5, 0.5], [0.625, 0.375], [0.0, 1.0], [0.5, 0.5]], rtol=0, atol=1e-15)
    with pytest.warns(DegenerateFitWarning, match=r"class 1 absent from the calibration set: every non-empty bin"):
        absent = HistogramBinningEqualWidth(num_bins=4).fit(logits, torch.zeros(5, dtype=torch.long))
    np.testing.assert_allclose(absent.bin_values[0], [0.0, 0.375, 0.0, 0.0], rtol=0, atol=0)


def test_equal_width_scores_on_edges_and_zero():
    # A score on an inner edge is in the bin below ((lower, upper]); a score of 0 in the first bin.
    p1 = torch.tensor([0.0, 0.5, 0.5, 1.0], dtype=torch.float64)
    logits = torch.stack([(1 - p1).clamp_min(1e-300).log(), p1.clamp_min(1e-300).log()], dim=1)
    calibrator = HistogramBinningEqualWidth(num_bins=2).fit(logits, torch.tensor([0, 1, 0, 1]))
    np.testing.assert_array_equal(calibrator.bin_counts[0], [3, 1])
    np.testing.assert_allclose(calibrator.bin_values[0], [1 / 3, 1.0], rtol=0, atol=1e-15)


@pytest.mark.parametrize(("name", "logits", "labels"), edge_case_data())
def test_equal_width_edge_cases(name, logits, labels):
    calibrator = HistogramBinningEqualWidth().fit(logits, labels)
    test = torch.cat([logits, 4 * torch.randn(30, logits.shape[1], dtype=torch.float64)])
    out, probs = calibrator(test), calibrator.probs(test)
    assert torch.isfinite(out).all() and out.dtype == torch.float64
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(1), torch.ones(len(test), dtype=torch.float64))
    assert all(((v >= 0) & (v <= 1)).all() and len(v) == 15 for v in calibrator.bin_values)
    assert all(c.sum() == len(labels) for c in calibrator.bin_counts)
    if name == "absent_class":
        assert (calibrator.bin_values[4] == 0).all() and calibrator.degenerate
        assert (probs[:, 4] < 1e-300).all()  # 0, floored


def test_equal_width_differs_from_equal_mass_and_is_binary_only_at_two_classes():
    g = torch.Generator().manual_seed(3)
    logits, labels = 2 * torch.randn(400, 3, generator=g, dtype=torch.float64), torch.randint(0, 3, (400,), generator=g)
    width, mass = HistogramBinningEqualWidth().fit(logits, labels), HistogramBinningEqualMass().fit(logits, labels)
    assert not torch.allclose(width.probs(logits), mass.probs(logits))
    assert HistogramBinningEqualWidth().fit(logits[:, :2], labels % 2).binned_classes == [1]


def test_equal_width_registry_config_and_errors():
    assert POSTHOC.get("histogram_binning_equal_width") is HistogramBinningEqualWidth
    assert METHODS.get("histogram_binning_equal_width").config is HistogramBinningEqualWidthConfig
    assert HistogramBinningEqualWidthConfig().num_bins == 15 and HistogramBinningEqualWidth().num_bins == 15
    with pytest.raises(ConfigError, match=r"`num_bins` must be an integer >= 1, got num_bins=0"):
        HistogramBinningEqualWidthConfig(num_bins=0)
    with pytest.raises(ConfigError, match=r"`num_bins` must be an integer, got num_bins=2.5"):
        from_dict(HistogramBinningEqualWidthConfig, {"num_bins": 2.5})
    with pytest.raises(ValueError, match=r"`num_bins` must be an integer >= 1, got num_bins=True"):
        HistogramBinningEqualWidth(num_bins=True)
    with pytest.raises(RuntimeError, match=r"HistogramBinningEqualWidth is not fitted"):
        HistogramBinningEqualWidth()(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"`logits` must have the 3 classes of the fit, got 2"):
        HistogramBinningEqualWidth().fit(torch.randn(9, 3), torch.arange(9) % 3)(torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"`logits` must have shape \(N, C\) with C >= 2"):
        HistogramBinningEqualWidth().fit(torch.randn(9, 1), torch.zeros(9, dtype=torch.long))


def test_equal_width_runs_as_a_method_on_float32_logits():
    check_runs_as_a_method([("histogram_binning_equal_width", HistogramBinningEqualWidthConfig()),
                            ("histogram_binning_equal_width",
                             HistogramBinningEqualWidthConfig(num_bins=4, calibration_size=60))])
