"""``stage1.train_size``: a stratified, seeded sample of the training split, the rest held out."""

from __future__ import annotations

import pytest
import torch

from calib._config import ConfigError
from calib.datasets import DATASETS, load_dataset
from calib.datasets.subsets import restrict_training, stratified_sample


def test_class_counts_by_largest_remainder():
    labels = torch.tensor([0] * 6 + [1] * 3 + [2])
    keep, rest = stratified_sample(labels, 5)
    # quotas 5·(6, 3, 1)/10 = 3, 1.5, 0.5 → floors 3, 1, 0; one left: the tie 0.5 = 0.5 goes to class 1
    assert torch.bincount(labels[keep], minlength=3).tolist() == [3, 2, 0]
    assert sorted(keep.tolist() + rest.tolist()) == list(range(10))
    assert keep.tolist() == sorted(keep.tolist())


def test_same_sample_every_time_and_another_seed_differs():
    labels = torch.arange(1000) % 10
    first, _ = stratified_sample(labels, 100)
    again, _ = stratified_sample(labels, 100)
    other, _ = stratified_sample(labels, 100, seed=2)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.bincount(labels[first]).tolist() == [10] * 10


def test_restricted_views_agree_and_the_rest_is_held_out():
    data = load_dataset("digits-noisy", "")
    total = len(data.train_eval)
    subset = restrict_training(data, 200, "digits-noisy")
    restricted, heldout = subset.data, subset.heldout
    assert len(restricted.train) == len(restricted.train_eval) == 200 and len(heldout) == total - 200
    assert restricted.val is data.val and restricted.test is data.test
    tensors = restricted.tensors
    assert tensors is not None and tensors.train.images.shape[0] == 200
    # item for item, the tensor view holds the images of the dataset view
    for i in (0, 57, 199):
        image, label = restricted.train_eval[i]
        assert label == int(tensors.train.labels[i])
        assert tensors.train.mean is None and torch.equal(image, tensors.train.images[i])
    kept = set(restricted.train_eval.indices)
    assert kept.isdisjoint(heldout.indices) and len(kept | set(heldout.indices)) == total


def test_none_or_the_whole_split_changes_nothing_and_too_many_is_an_error():
    data = load_dataset("digits-noisy", "")
    total = len(data.train_eval)
    assert restrict_training(data, None).data is data and restrict_training(data, None).heldout is None
    assert restrict_training(data, total).heldout is None
    with pytest.raises(ConfigError, match=rf"at most the {total} images of digits-noisy.*train_size={total + 1}"):
        restrict_training(data, total + 1, "digits-noisy")


def test_labels_come_from_the_dataset_and_the_tensor_view_stays_lazy():
    data = load_dataset("synthetic-cifar10", "")  # CIFAR's layout: labels in `targets`, tensors built on demand
    subset = restrict_training(data, 1000, "synthetic-cifar10")
    assert "_tensors" not in data.__dict__ and "_tensors" not in subset.data.__dict__
    tensors = subset.data.tensors
    assert tensors is not None and tensors.train.labels.tolist() == [subset.data.train_eval[i][1] for i in range(1000)]
    shares = torch.bincount(data.tensors.train.labels).double() * 1000 / len(data.train_eval)
    assert ((torch.bincount(tensors.train.labels) - shares).abs() < 1).all()  # each class its share, rounded


@pytest.mark.parametrize("name", ["digits", "digits-noisy", "synthetic-cifar10"])
def test_registered_training_sizes_are_the_splits(name):
    assert DATASETS.get(name).train_images == len(load_dataset(name, "").train_eval)
