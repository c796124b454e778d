"""Tests for calib/metrics/_binning.py: the FOCAL-R bin conventions."""

from __future__ import annotations

import numpy as np

from calib.metrics._binning import (
    bin_indices_from_edges,
    bin_statistics,
    equal_mass_edges,
    equal_width_bin_indices,
    equal_width_edges,
    top_label,
)


class TestEqualWidth:
    def test_edges(self) -> None:
        np.testing.assert_array_equal(equal_width_edges(4), [0.0, 0.25, 0.5, 0.75, 1.0])

    def test_upper_edge_closed(self) -> None:
        # 4 bins: (0, .25], (.25, .5], (.5, .75], (.75, 1]; an inner edge belongs to the bin below.
        values = np.array([0.25, 0.2500001, 0.5, 0.75, 0.76])
        assert equal_width_bin_indices(values, 4).tolist() == [0, 1, 1, 2, 3]

    def test_one_is_in_last_bin(self) -> None:
        assert equal_width_bin_indices(np.array([1.0]), 15).tolist() == [14]
        assert equal_width_bin_indices(np.array([1.0]), 1).tolist() == [0]

    def test_zero_is_in_first_bin(self) -> None:
        assert equal_width_bin_indices(np.array([0.0, 1e-300]), 15).tolist() == [0, 0]

    def test_matches_gt_le_loop(self) -> None:
        # The FOCAL-R test `gt(lower) & le(upper)`, written as a loop over bins.
        rng = np.random.default_rng(0)
        values = np.concatenate([rng.random(1000), equal_width_edges(15)[1:]])
        edges = equal_width_edges(15)
        expected = np.full(values.size, -1)
        for b in range(15):
            expected[(values > edges[b]) & (values <= edges[b + 1])] = b
        np.testing.assert_array_equal(equal_width_bin_indices(values, 15), expected)


class TestEqualMass:
    def test_edges_hand(self) -> None:
        # N = 6, M = 3: interp at positions [0, 2, 4, 6] of sorted [.1 .2 .3 .4 .5 .6];
        # position 6 is past the last index 5 and clamps to the maximum 0.6.
        values = np.array([0.6, 0.1, 0.5, 0.2, 0.4, 0.3])
        np.testing.assert_allclose(equal_mass_edges(values, 3), [0.1, 0.3, 0.5, 0.6])

    def test_interpolated_edge(self) -> None:
        # N = 4, M = 3: positions [0, 4/3, 8/3, 4] of sorted [.2 .4 .6 .8]:
        # 4/3 -> .4 + (1/3)(.2) = .4667, 8/3 -> .6 + (2/3)(.2) = .7333, 4 -> clamped .8.
        edges = equal_mass_edges(np.array([0.2, 0.4, 0.6, 0.8]), 3)
        np.testing.assert_allclose(edges, [0.2, 0.4 + 0.2 / 3, 0.6 + 0.4 / 3, 0.8])

    def test_smallest_value_is_excluded(self) -> None:
        # The documented FOCAL-R pitfall: the minimum equals edges[0] and (lower, upper] drops it.
        values = np.array([0.6, 0.1, 0.5, 0.2, 0.4, 0.3])
        indices = bin_indices_from_edges(values, equal_mass_edges(values, 3))
        assert indices.tolist() == [2, -1, 1, 0, 1, 0]

    def test_out_of_range_is_excluded(self) -> None:
        edges = np.array([0.2, 0.5, 0.8])
        assert bin_indices_from_edges(np.array([0.1, 0.2, 0.3, 0.5, 0.8, 0.9]), edges).tolist() == [
            -1,
            -1,
            0,
            0,
            1,
            -1,
        ]

    def test_repeated_edges(self) -> None:
        # Ties give empty bins (e, e]; every value still lands in exactly one bin.
        values = np.array([0.5, 0.5, 0.5, 0.9])
        # Positions [0, 4/3, 8/3, 4] of sorted [.5 .5 .5 .9]: .5, .5, .5 + (2/3)(.4) = .7667, .9.
        edges = equal_mass_edges(values, 3)
        np.testing.assert_allclose(edges, [0.5, 0.5, 0.5 + 0.8 / 3, 0.9])
        assert bin_indices_from_edges(values, edges).tolist() == [-1, -1, -1, 2]


class TestBinStatistics:
    def test_hand(self) -> None:
        # bin 0: {0.3 (wrong)} -> count 1, conf 0.3, acc 0
        # bin 1: empty         -> count 0, both means 0
        # bin 2: {0.75 (right), 0.25 (wrong)} -> count 2, conf 0.5, acc 0.5; index -1 ignored
        values = np.array([0.3, 0.75, 0.25, 0.9])
        targets = np.array([0.0, 1.0, 0.0, 1.0])
        counts, conf, acc = bin_statistics(values, targets, np.array([0, 2, 2, -1]), 3)
        assert counts.tolist() == [1, 0, 2]
        np.testing.assert_allclose(conf, [0.3, 0.0, 0.5])
        np.testing.assert_allclose(acc, [0.0, 0.0, 0.5])

    def test_top_label(self) -> None:
        # Row 1 ties 0.5/0.5: the lowest index wins, so it predicts class 0 (label 1: wrong).
        conf, correct = top_label(np.array([[0.2, 0.8], [0.5, 0.5]]), np.array([1, 1]))
        assert conf.tolist() == [0.8, 0.5]
        assert correct.tolist() == [1.0, 0.0]
