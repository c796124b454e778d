"""Stage I on part of the training split: a stratified sample of ``train_size`` images, the rest held out.

``stage1.train_size`` makes CPU-sized runs of a large dataset and data-size studies possible, and
it gives MaC-Cal's q statistics a part of the training data that Stage I never saw (its
``stats_source="heldout"``). The sample is drawn with a fixed seed (1, as the validation splits),
so every seed, loss and method of a study trains on the same images.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from calib._config import ConfigError
from calib.datasets._base import DatasetSplits, TensorData

__all__ = ["SUBSET_SEED", "TrainingSubset", "check_train_size", "restrict_training", "stratified_sample"]

SUBSET_SEED = 1


def stratified_sample(labels: np.ndarray | torch.Tensor, size: int, seed: int = SUBSET_SEED, *, key: str = "size"
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(sample, rest): indices into ``labels``, both ascending; the sample holds ``size`` items stratified by class.

    Class k (n_k of the N items) gives ⌊size · n_k / N⌋ items, and the ``size − Σ ⌊·⌋`` left over go one
    each to the classes with the largest remainders (ties: the smaller class). One
    ``np.random.RandomState(seed)`` permutes each class's indices in turn, classes in ascending order; the
    first items of each permutation are the sample. A ``size`` outside [1, N) is a ``ValueError`` that
    calls it ``key``.
    """
    labels = np.asarray(labels)
    num = len(labels)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size < num:
        raise ValueError(f"`{key}` must be an integer in [1, {num}) for {num} labels, got {key}={size!r}.")
    classes, counts = np.unique(labels, return_counts=True)
    exact = size * counts / num
    quotas = np.floor(exact).astype(np.int64)
    by_remainder = np.lexsort((classes, -(exact - quotas)))  # largest remainder first, then smaller class
    quotas[by_remainder[:size - quotas.sum()]] += 1
    rng = np.random.RandomState(seed)
    chosen = [rng.permutation(np.flatnonzero(labels == k))[:quota] for k, quota in zip(classes, quotas, strict=True)]
    sample = np.sort(np.concatenate(chosen))
    return sample, np.setdiff1d(np.arange(num), sample)


def check_train_size(train_size: int, num_classes: int | None, train_images: int | None, dataset: str,
                     key: str = "stage1.train_size") -> None:
    """A ``ConfigError`` naming ``key`` (the trial config's, or the ``--train-size`` flag) unless a Stage-I sample
    of ``train_size`` images of ``dataset`` holds at least its ``num_classes`` (the stratified sample holds every
    class) and fewer than the ``train_images`` of its training split (all of them is no ``train_size``: one Stage
    I, one id). A bound that is None is not checked."""
    if num_classes is not None and train_size < num_classes:
        raise ConfigError(f"`{key}` must be at least the {num_classes} classes of {dataset} (Stage I trains on a "
                          f"stratified sample that holds every class), got {key}={train_size}.")
    if train_images is not None and train_size >= train_images:
        leave_out = "out" if key.startswith("--") else "null (the default)"
        raise ConfigError(f"`{key}` must be below the {train_images} images of {dataset}'s training split, got "
                          f"{key}={train_size}. Leave it {leave_out} to train on all of them.")


@dataclasses.dataclass
class TrainingSubset:
    """The splits Stage I trains on, and the held-out training images (evaluation transform; None
    when Stage I trains on the whole training split)."""

    data: DatasetSplits
    heldout: Dataset | None


def _dataset_labels(dataset: Dataset) -> torch.Tensor | None:
    """The labels a dataset holds without reading its images (``targets``, as every image dataset of
    calib and torchvision has them, or a TensorDataset's second tensor; through Subsets), or None."""
    if isinstance(dataset, Subset):
        inner = _dataset_labels(dataset.dataset)
        return None if inner is None else inner[torch.as_tensor(dataset.indices, dtype=torch.long)]
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        return dataset.tensors[1]
    targets = getattr(dataset, "targets", None)
    return None if targets is None else torch.as_tensor(targets)


def _training_labels(data: DatasetSplits) -> torch.Tensor:
    labels = _dataset_labels(data.train_eval)
    if labels is not None:
        return labels.long()
    if data.tensors is not None:
        return data.tensors.train.labels
    return torch.tensor([int(label) for _, label in data.train_eval])  # decodes every image: no other way


def restrict_training(data: DatasetSplits, train_size: int | None, dataset: str = "") -> TrainingSubset:
    """``data`` with its training views restricted to a stratified sample of ``train_size`` images.

    ``None`` returns ``data`` unchanged with no held-out part. A size that is not below the training
    split's, or below the number of classes (the sample holds every class), is a :class:`ConfigError`
    that names both numbers (:func:`check_train_size`, as ``parse_trial_config`` checks it).
    """
    if train_size is None:
        return TrainingSubset(data, None)
    labels = _training_labels(data)
    check_train_size(train_size, data.num_classes, labels.numel(), dataset or "the dataset")
    keep, rest = (torch.from_numpy(indices) for indices in stratified_sample(labels.numpy(), train_size))

    def restricted_tensors() -> TensorData:  # built on first read, as the dataset's own view is
        tensors = data.tensors
        assert tensors is not None
        train = dataclasses.replace(tensors.train, images=tensors.train.images[keep], labels=tensors.train.labels[keep])
        return TensorData(train, tensors.val, tensors.test, tensors.augmentation)

    has_tensors = data.tensor_loader is not None or data.__dict__.get("_tensors") is not None
    restricted = DatasetSplits(
        train=Subset(data.train, keep.tolist()), train_eval=Subset(data.train_eval, keep.tolist()),
        val=data.val, test=data.test, num_classes=data.num_classes, input_shape=data.input_shape,
        tensor_loader=restricted_tensors if has_tensors else None)
    return TrainingSubset(restricted, Subset(data.train_eval, rest.tolist()))
