"""``stage1.train_size``: a stratified, seeded sample of the training split, the rest held out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Subset

from calib._config import ConfigError
from calib.datasets import DATASETS, load_dataset
from calib.datasets._base import DatasetSplits
from calib.datasets.fashion_mnist import GrayImageDataset
from calib.datasets.subsets import _training_labels, restrict_training, stratified_sample
from calib.datasets.tiny_imagenet import ImageList


def test_class_counts_by_largest_remainder():
    labels = np.array([0] * 6 + [1] * 3 + [2])
    keep, rest = stratified_sample(labels, 5)
    # quotas 5·(6, 3, 1)/10 = 3, 1.5, 0.5 → floors 3, 1, 0; one left: the tie 0.5 = 0.5 goes to class 1
    assert np.bincount(labels[keep], minlength=3).tolist() == [3, 2, 0]
    assert sorted(keep.tolist() + rest.tolist()) == list(range(10))
    assert keep.tolist() == sorted(keep.tolist())
    # class by class, ascending, one RandomState permutes the class's indices; the first ones are taken
    rng = np.random.RandomState(1)
    expected = sorted([*rng.permutation(np.arange(6))[:3], *rng.permutation(np.arange(6, 9))[:2]])
    assert keep.tolist() == expected


def test_same_sample_every_time_another_seed_differs_and_a_bad_size_is_refused():
    labels = torch.arange(1000) % 10
    first, _ = stratified_sample(labels, 100)
    again, _ = stratified_sample(labels, 100)
    other, _ = stratified_sample(labels, 100, seed=2)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert np.bincount(labels.numpy()[first]).tolist() == [10] * 10
    for bad in (0, 1000, 2.5):
        with pytest.raises(ValueError, match=rf"`size` must be an integer in \[1, 1000\) for 1000 labels, "
                                             rf"got size={bad}"):
            stratified_sample(labels, bad)


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


def test_none_changes_nothing_and_the_whole_split_or_more_is_an_error():
    data = load_dataset("digits-noisy", "")
    total = len(data.train_eval)
    assert restrict_training(data, None).data is data and restrict_training(data, None).heldout is None
    for size in (total, total + 1):
        with pytest.raises(ConfigError, match=rf"below the {total} images of digits-noisy.*train_size={size}\. "
                                              rf"Leave it null"):
            restrict_training(data, size, "digits-noisy")


def test_fewer_images_than_classes_is_an_error():
    data = load_dataset("digits-noisy", "")
    with pytest.raises(ConfigError, match=r"`stage1.train_size` must be at least the 10 classes of digits-noisy "
                                          r"\(.*every class\), got stage1.train_size=9\."):
        restrict_training(data, 9, "digits-noisy")
    assert len(restrict_training(data, 10, "digits-noisy").data.train_eval) == 10


def test_labels_come_from_the_dataset_and_the_tensor_view_stays_lazy():
    data = load_dataset("synthetic-cifar10", "")  # CIFAR's layout: labels in `targets`, tensors built on demand
    subset = restrict_training(data, 1000, "synthetic-cifar10")
    assert "_tensors" not in data.__dict__ and "_tensors" not in subset.data.__dict__
    tensors = subset.data.tensors
    assert tensors is not None and tensors.train.labels.tolist() == [subset.data.train_eval[i][1] for i in range(1000)]
    shares = torch.bincount(data.tensors.train.labels).double() * 1000 / len(data.train_eval)
    assert ((torch.bincount(tensors.train.labels) - shares).abs() < 1).all()  # each class its share, rounded


@pytest.mark.parametrize("name", ["digits", "digits-noisy", "synthetic-cifar10"])
def test_registered_training_sizes_and_classes_are_the_loaders(name):
    data = load_dataset(name, "")
    assert DATASETS.get(name).train_images == len(data.train_eval)
    assert DATASETS.get(name).val_images == len(data.val)
    assert DATASETS.get(name).num_classes == data.num_classes == len(_training_labels(data).unique())


def _never_called(image):
    raise AssertionError("an image was decoded")


@pytest.mark.parametrize("layout", ["tiny-imagenet", "fashion-mnist"])
def test_the_sample_reads_labels_without_decoding_an_image(layout):
    # Tiny-ImageNet's files do not exist here and Fashion-MNIST's transform fails: reading an item would raise.
    labels = [k % 4 for k in range(40)]
    if layout == "tiny-imagenet":
        dataset = ImageList([(f"/nonexistent/{i}.JPEG", label) for i, label in enumerate(labels)], _never_called)
    else:
        dataset = GrayImageDataset(np.zeros((40, 28, 28), np.uint8), np.array(labels), _never_called)
    view = Subset(dataset, list(range(2, 38)))  # the training part of a train/validation split
    data = DatasetSplits(train=view, train_eval=view, val=view, test=dataset, num_classes=4, input_shape=(1, 28, 28))
    subset = restrict_training(data, 12, layout)
    kept = [labels[view.indices[i]] for i in subset.data.train_eval.indices]
    assert len(kept) == 12 and sorted(kept) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert len(subset.heldout) == 36 - 12
