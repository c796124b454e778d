"""Reading a file of predictions and labels (netcal's records, logits/probs + labels, .npy pairs, Parquet), and the
benchmarks' stratified calibration/test splits of it."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from trial_fixtures import tiny_config

from calib._config import ConfigError
from calib.artifacts import get_or_train_stage1
from calib.artifacts.predictions_file import PredictionsFileError, calibration_test_split, read_predictions
from calib.artifacts.sources import predictions_split, resolve_source
from calib.config import config_hash, parse_trial_config, stage1_identity

PROBS = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5], [0.5, 0.4, 0.1]], dtype=np.float32)
LABELS = np.array([0, 2, 2, 1])


def test_netcal_probabilities_are_detected_renormalised_and_logged(tmp_path):
    path = tmp_path / "records.npz"
    np.savez(path, predictions=PROBS, ground_truth=LABELS)
    read = read_predictions(path)
    assert read.kind == "probabilities" and read.num_classes == 3 and read.labels.dtype == np.int64
    p = PROBS.astype(np.float64)
    np.testing.assert_allclose(read.scores, np.log(p / p.sum(axis=1, keepdims=True)), rtol=0, atol=1e-15)
    # the softmax of the scores is the renormalised probabilities
    np.testing.assert_allclose(np.exp(read.scores), p / p.sum(axis=1, keepdims=True), atol=1e-15)
    assert read.describe() == ("4 samples, 3 classes, probabilities (keys predictions, ground_truth; calibrated as "
                               "their log), accuracy 50.00%")


def test_logits_probs_npy_pairs_and_parquet_give_the_same_scores(tmp_path):
    logits = np.log(PROBS.astype(np.float64)) + np.array([[1.0], [-2.0], [0.5], [3.0]])  # another constant per row
    np.savez(tmp_path / "l.npz", logits=logits, labels=LABELS)
    read = read_predictions(tmp_path / "l.npz")
    assert read.kind == "logits" and np.array_equal(read.scores, logits)
    np.savez(tmp_path / "p.npz", probs=PROBS, labels=LABELS)
    assert read_predictions(tmp_path / "p.npz").kind == "probabilities"
    np.save(tmp_path / "preds.npy", logits)
    np.save(tmp_path / "labels.npy", LABELS.astype(np.int32))
    pair = read_predictions(tmp_path / "preds.npy", tmp_path / "labels.npy")
    assert pair.kind == "logits" and np.array_equal(pair.scores, logits) and np.array_equal(pair.labels, LABELS)
    columns = pd.DataFrame({"cat": PROBS[:, 0], "dog": PROBS[:, 1], "fox": PROBS[:, 2], "label": LABELS})
    columns.to_parquet(tmp_path / "c.parquet")
    by_columns = read_predictions(tmp_path / "c.parquet")
    assert by_columns.kind == "probabilities" and by_columns.source == "3 class columns, labels column label"
    np.testing.assert_allclose(by_columns.scores, read_predictions(tmp_path / "p.npz").scores, atol=1e-15)
    pd.DataFrame({"logits": list(logits), "labels": LABELS.astype(float)}).to_parquet(tmp_path / "list.parquet")
    listed = read_predictions(tmp_path / "list.parquet")
    assert listed.kind == "logits" and np.array_equal(listed.scores, logits) and listed.labels.dtype == np.int64


def test_a_binary_model_s_single_column_is_class_one(tmp_path):
    np.savez(tmp_path / "b.npz", predictions=np.array([0.9, 0.2, 0.6]), ground_truth=np.array([1, 0, 0]))
    read = read_predictions(tmp_path / "b.npz")
    np.testing.assert_allclose(np.exp(read.scores), [[0.1, 0.9], [0.8, 0.2], [0.4, 0.6]], atol=1e-15)
    np.savez(tmp_path / "z.npz", logits=np.array([[2.0], [-1.0]]), labels=np.array([1, 0]))
    assert np.array_equal(read_predictions(tmp_path / "z.npz").scores, [[0.0, 2.0], [0.0, -1.0]])


def _bad(tmp_path, name, **arrays):
    np.savez(tmp_path / name, **arrays)
    return tmp_path / name


@pytest.mark.parametrize(("arrays", "message"), [
    ({"predictions": PROBS}, "keys missing or ambiguous: expected netcal's keys `predictions` and `ground_truth`, "
                             "or `logits` or `probs` with `labels`; the file has `predictions`"),
    ({"predictions": PROBS, "ground_truth": LABELS, "extra": LABELS}, "unexpected keys"),
    ({"logits": PROBS, "probs": PROBS, "labels": LABELS}, "unexpected keys"),
    ({"predictions": PROBS, "ground_truth": LABELS[:3]}, "the labels must have shape (N,) with N = 4 (one per row of "
                                                         "the predictions), got (3,)"),
    ({"predictions": PROBS[None], "ground_truth": LABELS}, "must have shape (N, K), or (N,) for a binary model"),
    ({"predictions": PROBS, "ground_truth": np.array([0, 3, 2, 1])}, "labels must be in 0..2 (K = 3 prediction "
                                                                     "columns), got values in 0..3"),
    ({"predictions": PROBS, "ground_truth": np.array([0, -1, 2, 1])}, "got values in -1..2"),
    ({"predictions": PROBS, "ground_truth": np.array([0.0, 1.5, 2, 1])}, "labels must be integers (class indices), "
                                                                         "got dtype float64 with non-integer"),
    ({"logits": np.array([[0.0, np.nan], [1, 2]]), "labels": np.array([0, 1])}, "1 prediction value(s) are NaN or inf"),
    ({"logits": np.array([[0.0, np.inf], [1, 2]]), "labels": np.array([0, 1])}, "are NaN or inf"),
    ({"predictions": PROBS * [[1], [0.95], [1], [1]], "ground_truth": LABELS},
     "probabilities whose rows do not sum to 1: row 1 sums to 0.95 (tolerance 0.001)"),
    ({"probs": PROBS + 1, "labels": LABELS}, "probabilities must be in [0, 1], got 1.7"),
    ({"logits": np.zeros((4, 0)), "labels": np.zeros(4, int)}, "the predictions have 0 class(es); calibration needs "
                                                               "at least 2"),
    ({"logits": np.zeros((3, 4)), "labels": np.array([2, 2, 2])}, "every label is 2: the labels must hold at least "
                                                                  "2 classes"),
    ({"predictions": np.array([["a", "b"]]), "ground_truth": np.array([0])}, "must be numbers, got dtype <U1"),
])
def test_every_bad_file_is_one_error_naming_the_problem(tmp_path, arrays, message):
    with pytest.raises(PredictionsFileError, match=r"predictions file .*bad\.npz: ") as err:
        read_predictions(_bad(tmp_path, "bad.npz", **arrays))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_paths_and_formats(tmp_path):
    with pytest.raises(PredictionsFileError, match="does not exist"):
        read_predictions(tmp_path / "absent.npz")
    (tmp_path / "x.csv").write_text("1,2\n")
    with pytest.raises(PredictionsFileError, match=re.escape("unsupported file type '.csv'; expected .npz")):
        read_predictions(tmp_path / "x.csv")
    np.save(tmp_path / "p.npy", PROBS)
    with pytest.raises(PredictionsFileError, match=re.escape("a .npy pair is written PREDICTIONS.npy,LABELS.npy")):
        read_predictions(tmp_path / "p.npy")
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    with pytest.raises(PredictionsFileError, match=re.escape("numpy.load(allow_pickle=False) cannot read it")):
        read_predictions(tmp_path / "broken.npz")
    pd.DataFrame({"a": [0.5, 0.5], "b": [0.5, 0.5]}).to_parquet(tmp_path / "nolabels.parquet")
    with pytest.raises(PredictionsFileError, match="expected one labels column named labels, label, ground_truth"):
        read_predictions(tmp_path / "nolabels.parquet")
    pd.DataFrame({"a": ["x", "y"], "label": [0, 1]}).to_parquet(tmp_path / "text.parquet")
    with pytest.raises(PredictionsFileError, match=r"column\(s\) a are not numeric"):
        read_predictions(tmp_path / "text.parquet")


def test_splits_are_stratified_seeded_and_disjoint():
    labels = np.repeat(np.arange(4), [10, 20, 7, 3])
    calibration, test = calibration_test_split(labels, 0, 0.5)
    assert len(calibration) + len(test) == 40 and not set(calibration) & set(test)
    assert calibration.tolist() == sorted(calibration.tolist())
    for k, n in enumerate((10, 20, 7, 3)):  # every class split as evenly as its count allows
        assert abs(int((labels[calibration] == k).sum()) - n / 2) <= 1
    again, _ = calibration_test_split(labels, 0, 0.5)
    other, _ = calibration_test_split(labels, 1, 0.5)
    assert np.array_equal(calibration, again) and not np.array_equal(calibration, other)
    small, _ = calibration_test_split(labels, 0, 0.25)
    assert len(small) == 10
    with pytest.raises(PredictionsFileError, match="class 1 has a single sample"):
        calibration_test_split(np.array([0, 0, 1, 2, 2]), 0, 0.5)


def test_a_predictions_stage1_is_the_split_of_its_seed(tmp_path):
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), size=60)
    labels = np.tile(np.arange(3), 20)
    np.savez(tmp_path / "model.npz", predictions=probs, ground_truth=labels)

    def config(seed, method="vanilla", **source):
        base = tiny_config(tmp_path, method={"name": method}, seed=seed)
        base.update(dataset="model", arch="predictions",
                    source={**resolve_source("predictions", str(tmp_path / "model.npz")),
                            "calibration_fraction": 0.5, **source})
        return parse_trial_config(base)

    cfg = config(3)
    artifact, hit = get_or_train_stage1(cfg, device=__import__("torch").device("cpu"))
    _, calibration, test = predictions_split(cfg)
    assert not hit and len(artifact.splits["train"].labels) == 0
    assert np.array_equal(artifact.splits["val"].labels.numpy(), labels[calibration])
    np.testing.assert_allclose(artifact.splits["test"].logits.numpy(), np.log(probs[test]), atol=1e-12)
    ids = {config_hash(stage1_identity(c)) for c in (config(3), config(4), config(3, calibration_fraction=0.7))}
    assert len(ids) == 3, "the split (seed, calibration share) is part of the Stage-I identity"
    assert config_hash(stage1_identity(config(3, "temperature_scaling"))) == config_hash(stage1_identity(cfg))
    with pytest.raises(ConfigError, match=r"`method` must be a method that reads only logits: a predictions file "
                                          r"holds no features and no training split, .*, got method='tst'"):
        config(0, "tst")
    with pytest.raises(ConfigError, match=re.escape("`source.calibration_fraction` must be a number in (0, 1)")):
        config(0, calibration_fraction=1.0)


def test_the_predictions_fields_leave_the_ids_of_other_given_stage1s_as_they_were(tmp_path):
    from calib.config import trial_identity

    np.savez(tmp_path / "f.npz", **{f"{s}_{p}": np.ones((4, 2)) for s in ("train", "val", "test")
                                    for p in ("features", "logits")},
             **{f"{s}_labels": np.array([0, 1, 0, 1]) for s in ("train", "val", "test")})
    base = tiny_config(tmp_path, method={"name": "vanilla"})
    base.update(dataset="f", arch="features", source=resolve_source("features", str(tmp_path / "f.npz")))
    # as before predictions existed: the source is its kind, hash and head (the path is placement)
    assert trial_identity(parse_trial_config(base))["source"] == {
        "kind": "features", "sha256": base["source"]["sha256"], "head": None}
