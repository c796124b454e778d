"""A user's file of precomputed features (.pt or .npz) is read into checked float32/int64 splits and a head."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from calib.artifacts import features_file
from calib.artifacts.features_file import FeaturesFile, FeaturesFileError, read_features_file

DROP = object()

# A 2×3 head (C=2, d=3) and features whose logits are worked out by hand below.
FEATURES = [[1.0, 2.0, 3.0], [0.0, -1.0, 0.5]]
WEIGHT = [[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]]
BIAS = [0.25, -1.0]
# row 0: 1 - 3 + 0.25 = -1.75,   0.5 + 4 - 1 = 3.5
# row 1: -0.5 + 0.25 = -0.25,    -2 - 1 = -3
LOGITS = [[-1.75, 3.5], [-0.25, -3.0]]
LOGITS_NO_BIAS = [[-2.0, 4.5], [-0.5, -2.0]]


def contents(**changes: Any) -> dict[str, Any]:
    """A valid file's dict (head only; train has 2 rows, val 3, test 1), with ``changes`` applied (DROP removes)."""
    data: dict[str, Any] = {
        "train_features": torch.tensor(FEATURES), "train_labels": torch.tensor([0, 1]),
        "val_features": torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0], [0.0, 0.0, 2.0]]),
        "val_labels": torch.tensor([1, 0, 1]),
        "test_features": torch.tensor([[0.0, 0.0, 0.0]]), "test_labels": torch.tensor([0]),
        "head_weight": torch.tensor(WEIGHT), "head_bias": torch.tensor(BIAS),
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not DROP}


def with_logits(**changes: Any) -> dict[str, Any]:
    logits = {"train_logits": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "val_logits": torch.zeros(3, 2),
              "test_logits": torch.ones(1, 2)}
    return contents(**{**logits, **changes})


def as_numpy(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in data.items()}


def write(tmp_path: Path, data: Any, name: str = "feats.pt") -> Path:
    path = tmp_path / name
    if path.suffix == ".npz":
        np.savez(path, **as_numpy(data))
    else:
        torch.save(data, path)
    return path


# -- reading -----------------------------------------------------------------------------------------------


def test_logits_are_computed_from_the_head_as_worked_out_by_hand(tmp_path):
    result = read_features_file(write(tmp_path, contents()))
    assert isinstance(result, FeaturesFile)
    assert (result.num_classes, result.num_features, result.class_names) == (2, 3, None)
    assert set(result.splits) == {"train", "val", "test"}
    train = result.splits["train"]
    assert torch.equal(train.logits, torch.tensor(LOGITS))
    assert torch.equal(train.features, torch.tensor(FEATURES))
    assert torch.equal(train.labels, torch.tensor([0, 1]))
    assert torch.equal(result.splits["val"].logits, torch.tensor([[0.25, 1.5], [2.25, 0.0], [-1.75, -1.0]]))
    assert torch.equal(result.splits["test"].logits, torch.tensor([BIAS]))
    assert torch.equal(result.head_state["weight"], torch.tensor(WEIGHT))
    assert torch.equal(result.head_state["bias"], torch.tensor(BIAS))


def test_logits_are_computed_in_float64_before_rounding_to_float32(tmp_path):
    # 1 + 1e-8 - 1 is 0 in float32 arithmetic, 1e-8 in float64.
    data = contents(train_features=torch.tensor([[1.0, 1e-8, -1.0], [0.0, 0.0, 0.0]], dtype=torch.float64),
                    head_weight=torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64),
                    head_bias=DROP)
    logits = read_features_file(write(tmp_path, data)).splits["train"].logits
    assert logits.dtype == torch.float32
    assert logits[0, 0].item() == pytest.approx(1e-8, rel=1e-6)


def test_the_bias_defaults_to_zero(tmp_path):
    result = read_features_file(write(tmp_path, contents(head_bias=DROP)))
    assert torch.equal(result.splits["train"].logits, torch.tensor(LOGITS_NO_BIAS))
    assert torch.equal(result.head_state["bias"], torch.zeros(2))
    assert result.head_state["bias"].dtype == torch.float32


def test_the_files_own_logits_are_used_as_they_are_when_a_head_is_given_too(tmp_path):
    result = read_features_file(write(tmp_path, with_logits()))
    assert torch.equal(result.splits["train"].logits, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert torch.equal(result.splits["val"].logits, torch.zeros(3, 2))
    assert torch.equal(result.head_state["weight"], torch.tensor(WEIGHT))


def test_logits_without_a_head(tmp_path):
    result = read_features_file(write(tmp_path, with_logits(head_weight=DROP, head_bias=DROP)))
    assert result.head_state is None
    assert result.num_classes == 2
    assert torch.equal(result.splits["test"].logits, torch.ones(1, 2))


def test_dtypes_are_converted_to_contiguous_float32_and_int64(tmp_path):
    data = with_logits(
        train_features=torch.tensor(FEATURES, dtype=torch.float64).T.contiguous().T,  # not contiguous
        val_features=torch.ones(3, 3, dtype=torch.float16),
        test_features=torch.ones(1, 3, dtype=torch.bfloat16),
        train_labels=torch.tensor([0, 1], dtype=torch.uint8),
        val_labels=torch.tensor([1, 0, 1], dtype=torch.int32),
        train_logits=torch.ones(2, 2, dtype=torch.float64),
        head_weight=torch.nn.Parameter(torch.tensor(WEIGHT, dtype=torch.float64)),
        head_bias=torch.tensor(BIAS, dtype=torch.float16),
    )
    assert not data["train_features"].is_contiguous()
    result = read_features_file(write(tmp_path, data))
    for split in result.splits.values():
        for t in (split.features, split.logits):
            assert t.dtype == torch.float32 and t.is_contiguous()
        assert split.labels.dtype == torch.int64 and split.labels.is_contiguous()
    for t in result.head_state.values():
        assert t.dtype == torch.float32 and t.is_contiguous() and not t.requires_grad
        assert type(t) is torch.Tensor
    assert torch.equal(result.splits["train"].features, torch.tensor(FEATURES))
    assert torch.equal(result.splits["train"].labels, torch.tensor([0, 1]))


def test_npz_files_are_read_like_pt_files(tmp_path):
    data = contents(val_labels=torch.tensor([1, 0, 1], dtype=torch.int16), head_bias=DROP)
    data["train_features"] = data["train_features"].double()
    from_npz = read_features_file(write(tmp_path, data, "feats.npz"))
    from_pt = read_features_file(write(tmp_path, data, "feats.pth"))
    for split in ("train", "val", "test"):
        for field in ("features", "logits", "labels"):
            a, b = getattr(from_npz.splits[split], field), getattr(from_pt.splits[split], field)
            assert a.dtype == b.dtype and torch.equal(a, b)
    assert torch.equal(from_npz.splits["train"].logits, torch.tensor(LOGITS_NO_BIAS))
    assert from_npz.splits["val"].labels.dtype == torch.int64


def test_numpy_arrays_and_lists_inside_a_pt_file(tmp_path):
    data = as_numpy(contents())
    data["train_features"] = FEATURES
    data["head_weight"] = WEIGHT
    data["train_labels"] = [0, 1]
    result = read_features_file(write(tmp_path, data))
    assert torch.equal(result.splits["train"].logits, torch.tensor(LOGITS))
    assert result.splits["train"].labels.dtype == torch.int64
    assert result.splits["val"].features.dtype == torch.float32


def test_class_names_from_both_formats(tmp_path):
    pt = read_features_file(write(tmp_path, contents(class_names=["negative", "positive"])))
    assert pt.class_names == ["negative", "positive"]
    npz = read_features_file(write(tmp_path, contents(class_names=np.array(["negative", "positive"])),
                                   "feats.npz"))
    assert npz.class_names == ["negative", "positive"]
    assert all(type(name) is str for name in npz.class_names)


def test_the_example_in_the_module_docstring_writes_a_file_that_reads(tmp_path, monkeypatch):
    doc = features_file.__doc__
    block = doc[doc.rindex("::\n") + 3:]
    code = "\n".join(line[4:] for line in block.splitlines())
    assert code.count("\n") >= 5 and "torch.save" in code
    torch.manual_seed(0)
    backbone, head = torch.nn.Linear(5, 3), torch.nn.Linear(3, 4)
    splits = {s: (torch.randn(n, 5), torch.randint(0, 4, (n,))) for s, n in (("train", 6), ("val", 3), ("test", 2))}
    monkeypatch.chdir(tmp_path)
    exec(code, {"torch": torch, "backbone": backbone, "head": head, "splits": splits})
    result = read_features_file(tmp_path / "feats.pt")
    assert (result.num_classes, result.num_features) == (4, 3)
    x = splits["val"][0]
    with torch.no_grad():
        assert torch.allclose(result.splits["val"].logits, head(backbone(x)), atol=1e-6)


# -- errors ------------------------------------------------------------------------------------------------


def nan_inf(shape: tuple[int, ...]) -> torch.Tensor:
    t = torch.ones(shape)
    t.view(-1)[0], t.view(-1)[-1] = float("nan"), float("inf")
    return t


BAD_CONTENTS: dict[str, tuple[Callable[[], Any], str]] = {
    "not a dict": (lambda: [1, 2], r"expected a dict of named arrays at the top level, got list"),
    "missing keys": (lambda: contents(train_labels=DROP, test_features=DROP),
                     r"missing required key\(s\): test_features; train_labels\. Accepted keys: train_features, "
                     r"val_features, .*head_weight, head_bias, train_logits.*class_names"),
    "no head, no logits": (lambda: contents(head_weight=DROP, head_bias=DROP),
                           r"missing required key\(s\): head_weight, or the logits of every split "
                           r"\(train_logits, val_logits, test_logits\)"),
    "logits of some splits": (lambda: with_logits(val_logits=DROP, test_logits=DROP),
                              r"missing required key\(s\): val_logits, test_logits \(logits are given for "
                              r"train_logits only: give them for every split, or for none and head_weight instead\)"),
    "bias without weight": (lambda: with_logits(head_weight=DROP),
                            r"missing required key\(s\): head_weight \(head_bias is given without it\)"),
    "unknown key": (lambda: contents(class_name=["a", "b"], extra=1),
                    r"unknown key\(s\): 'class_name' \(did you mean 'class_names'\?\), 'extra'\. Accepted keys"),
    "typo": (lambda: contents(train_features=DROP, trian_features=torch.ones(2, 3)),
             r"missing required key\(s\): train_features; unknown key\(s\): 'trian_features' "
             r"\(did you mean 'train_features'\?\)"),
    "1-D features": (lambda: contents(val_features=torch.ones(3)),
                     r"`val_features` must be 2-D \(N, d\), got shape \(3,\)"),
    "3-D logits": (lambda: with_logits(test_logits=torch.ones(1, 2, 1)),
                   r"`test_logits` must be 2-D \(N, C\), got shape \(1, 2, 1\)"),
    "1-D head": (lambda: contents(head_weight=torch.ones(6)), r"`head_weight` must be 2-D \(C, d\), got shape \(6,\)"),
    "2-D bias": (lambda: contents(head_bias=torch.ones(2, 1)), r"`head_bias` must be 1-D \(C,\), got shape \(2, 1\)"),
    "integer features": (lambda: contents(train_features=torch.ones(2, 3, dtype=torch.int64)),
                         r"`train_features` must be a floating-point array \(N, d\), got dtype int64 "
                         r"\(shape \(2, 3\)\)"),
    "string features": (lambda: contents(train_features=np.array([["a", "b", "c"]] * 2)),
                        r"`train_features` must be a real-valued numeric array \(N, d\), got dtype <U1"),
    "boolean features": (lambda: contents(train_features=np.ones((2, 3), dtype=bool)),
                         r"`train_features` must be a real-valued numeric array \(N, d\), got dtype bool"),
    "features not an array": (lambda: contents(test_features="x.npy"),
                              r"`test_features` must be a tensor, numpy array or list \(N, d\), got str"),
    "ragged list": (lambda: contents(train_features=[[1.0, 2.0, 3.0], [1.0]]),
                    r"`train_features` must be a rectangular array \(N, d\)"),
    "float labels": (lambda: contents(train_labels=torch.tensor([0.0, 1.0])),
                     r"`train_labels` must hold integer class indices \(N,\), got dtype float32 \(shape \(2,\)\); "
                     r"its values are whole numbers"),
    "fractional labels": (lambda: contents(train_labels=torch.tensor([0.5, 1.0])),
                          r"`train_labels` must hold integer class indices \(N,\), got dtype float32 "
                          r"\(shape \(2,\)\)$"),
    "bool labels": (lambda: contents(train_labels=torch.tensor([False, True])),
                    r"`train_labels` must hold integer class indices \(N,\), got dtype bool"),
    "2-D labels": (lambda: contents(val_labels=torch.zeros(3, 1, dtype=torch.int64)),
                   r"`val_labels` must be 1-D \(N,\), got shape \(3, 1\)"),
    "labels rows": (lambda: contents(val_labels=torch.tensor([0, 1])),
                    r"the row counts N of split 'val' differ: `val_features` \(3, 3\), `val_labels` \(2,\); "
                    r"expected one row per example"),
    "logits rows": (lambda: with_logits(train_logits=torch.zeros(3, 2)),
                    r"the row counts N of split 'train' differ: `train_features` \(2, 3\), `train_labels` \(2,\), "
                    r"`train_logits` \(3, 2\)"),
    "widths between splits": (lambda: contents(test_features=torch.ones(1, 4)),
                              r"the feature widths d differ between splits: `train_features` \(2, 3\), "
                              r"`val_features` \(3, 3\), `test_features` \(1, 4\)"),
    "head width": (lambda: contents(head_weight=torch.ones(2, 4)),
                   r"`head_weight` has shape \(2, 4\), expected \(C, d\) with d=3 as in `train_features` \(2, 3\)"),
    "zero width": (lambda: contents(**{f"{s}_features": torch.ones(n, 0) for s, n in
                                       (("train", 2), ("val", 3), ("test", 1))}),
                   r"`train_features` has shape \(2, 0\): expected at least one feature column"),
    "classes head vs logits": (lambda: with_logits(head_weight=torch.ones(3, 3), head_bias=DROP),
                               r"the class counts C differ: `head_weight` \(3, 3\) \(C=3\), `train_logits` \(2, 2\) "
                               r"\(C=2\)"),
    "classes between splits": (lambda: with_logits(head_weight=DROP, head_bias=DROP, val_logits=torch.zeros(3, 5)),
                               r"the class counts C differ: `train_logits` \(2, 2\) \(C=2\), `val_logits` \(3, 5\) "
                               r"\(C=5\), `test_logits` \(1, 2\) \(C=2\)"),
    "bias length": (lambda: contents(head_bias=torch.zeros(3)),
                    r"the class counts C differ: `head_weight` \(2, 3\) \(C=2\), `head_bias` \(3,\) \(C=3\)"),
    "one class": (lambda: contents(head_weight=torch.ones(1, 3), head_bias=DROP, train_labels=torch.tensor([0, 0]),
                                   val_labels=torch.zeros(3, dtype=torch.int64)),
                  r"at least 2 classes are needed, got C=1 \(`head_weight` has shape \(1, 3\)\)"),
    "labels too large": (lambda: contents(val_labels=torch.tensor([1, 5, 2])),
                         r"`val_labels` has 2 label\(s\) outside \[0, 2\) \(min 2, max 5\); expected class indices "
                         r"0\.\.1 for C=2"),
    "negative labels": (lambda: contents(test_labels=torch.tensor([-1])),
                        r"`test_labels` has 1 label\(s\) outside \[0, 2\) \(min -1, max -1\)"),
    "empty split": (lambda: contents(test_features=torch.ones(0, 3), test_labels=torch.zeros(0, dtype=torch.int64)),
                    r"split 'test' is empty \(`test_features` has shape \(0, 3\)\); every split needs at least one"),
    "nan in features": (lambda: contents(val_features=nan_inf((3, 3))),
                        r"`val_features` \(3, 3\) has 2 non-finite value\(s\): 1 NaN, 1 inf; expected finite"),
    "inf in logits": (lambda: with_logits(test_logits=torch.tensor([[1.0, -float("inf")]])),
                      r"`test_logits` \(1, 2\) has 1 non-finite value\(s\): 0 NaN, 1 inf"),
    "nan in head": (lambda: contents(head_weight=nan_inf((2, 3))),
                    r"`head_weight` \(2, 3\) has 2 non-finite value\(s\): 1 NaN, 1 inf"),
    "nan in bias": (lambda: contents(head_bias=torch.tensor([float("nan"), 0.0])),
                    r"`head_bias` \(2,\) has 1 non-finite value\(s\): 1 NaN, 0 inf"),
    "beyond float32": (lambda: contents(train_features=torch.tensor([[1e39, 0.0, 0.0], [0.0, 0.0, 0.0]],
                                                                    dtype=torch.float64)),
                       r"`train_features` \(2, 3\) has 1 non-finite value\(s\) after conversion to float32"),
    "computed logits overflow": (lambda: contents(train_features=torch.tensor([[0.0, 3e38, 0.0], [0.0, 0.0, 0.0]])),
                                 r"the logits computed from head_weight/head_bias and `train_features` have 1 "
                                 r"value\(s\) beyond the float32 range"),
    "class names count": (lambda: contents(class_names=["a", "b", "c"]),
                          r"`class_names` has 3 name\(s\), expected C=2, one per class"),
    "class names not str": (lambda: contents(class_names=["a", 2]),
                            r"`class_names` must hold strings, got int 2 at index 1"),
    "class names not a list": (lambda: contents(class_names="ab"),
                               r"`class_names` must be a list of 2 strings, got str"),
}


@pytest.mark.parametrize("case", list(BAD_CONTENTS))
def test_a_bad_pt_file_names_the_file_the_key_and_what_is_expected(tmp_path, case):
    make, pattern = BAD_CONTENTS[case]
    path = write(tmp_path, make())
    with pytest.raises(FeaturesFileError, match=pattern) as caught:
        read_features_file(path)
    assert str(caught.value).startswith(f"features file {path}: ")


@pytest.mark.parametrize("case", ["missing keys", "typo", "integer features", "labels rows", "head width",
                                  "classes between splits", "labels too large", "nan in features", "empty split"])
def test_a_bad_npz_file_gets_the_same_messages(tmp_path, case):
    make, pattern = BAD_CONTENTS[case]
    path = write(tmp_path, make(), "feats.npz")
    with pytest.raises(FeaturesFileError, match=pattern):
        read_features_file(path)


def test_class_names_in_npz_must_be_str(tmp_path):
    path = write(tmp_path, contents(class_names=np.array([1, 2])), "feats.npz")
    with pytest.raises(FeaturesFileError, match=r"`class_names` must be a 1-D array of str, got dtype int64"):
        read_features_file(path)


def test_an_object_array_in_npz_is_refused(tmp_path):
    path = write(tmp_path, contents(class_names=np.array(["a", 1], dtype=object)), "feats.npz")
    with pytest.raises(FeaturesFileError, match=r"`class_names` is an object array \(pickled Python objects\), "
                                                r"which is not read.*dtype=str"):
        read_features_file(path)


def test_an_unsupported_suffix_lists_the_two_formats(tmp_path):
    path = tmp_path / "feats.csv"
    path.write_text("1,2\n")
    with pytest.raises(FeaturesFileError, match=rf"{re.escape(str(path))}: unsupported file type '\.csv'; expected "
                                                r"\.pt or \.pth \(a dict written with torch\.save\) or \.npz"):
        read_features_file(path)


def test_a_missing_file(tmp_path):
    path = tmp_path / "nowhere.pt"
    with pytest.raises(FeaturesFileError, match=rf"{re.escape(str(path))}: the file does not exist"):
        read_features_file(str(path))


def test_a_directory(tmp_path):
    (tmp_path / "feats.npz").mkdir()
    with pytest.raises(FeaturesFileError, match=r"feats\.npz: the path is not a regular file"):
        read_features_file(tmp_path / "feats.npz")


class Model:
    """Not a tensor: weights_only=True refuses it."""


def test_a_pickled_object_is_refused_saying_only_tensors_and_arrays_are_read(tmp_path):
    path = write(tmp_path, contents(head_weight=Model()))
    with pytest.raises(FeaturesFileError, match=r"torch\.load\(weights_only=True\) cannot load it \(it holds an "
                                                r"object of class [\w.]*Model\)\. Only tensors, numpy arrays, lists"):
        read_features_file(path)


def test_a_damaged_pt_file(tmp_path):
    path = tmp_path / "feats.pt"
    path.write_bytes(b"not a torch file")
    with pytest.raises(FeaturesFileError, match=r"feats\.pt: torch\.load\(weights_only=True\) cannot load it "
                                                r"\(UnpicklingError: .+\)\. Only tensors"):
        read_features_file(path)


def test_a_truncated_pt_file(tmp_path):
    path = write(tmp_path, contents())
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(FeaturesFileError, match=r"feats\.pt: torch\.load\(weights_only=True\) cannot load it "
                                                r"\(\w[\w.]*: .+\)\. Only tensors"):
        read_features_file(path)


def test_a_damaged_npz_file(tmp_path):
    path = tmp_path / "feats.npz"
    path.write_bytes(b"not an archive")
    with pytest.raises(FeaturesFileError, match=r"feats\.npz: numpy\.load\(allow_pickle=False\) cannot load it "
                                                r"\(.+\); expected an \.npz archive"):
        read_features_file(path)


def test_a_single_npy_array_named_npz(tmp_path):
    path = tmp_path / "feats.npz"
    with path.open("wb") as f:
        np.save(f, np.zeros((2, 3)))
    with pytest.raises(FeaturesFileError, match=r"it holds a single array \(\.npy\), not an \.npz archive"):
        read_features_file(path)
