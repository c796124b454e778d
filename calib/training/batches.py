"""Where Stage I's batches come from: a DataLoader over the dataset, or the dataset's tensors held on
the training device and augmented there per batch (``stage1.data_pipeline``).

Both draw the epoch's order from the trial's data-order generator in the same way (the DataLoader's
``RandomSampler``: ``torch.randperm``) and give the model float32 inputs on the device, in the memory
format the model uses.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from calib.datasets import Augmentation, DatasetSplits, TensorSplit
from calib.training.augment import apply_augmentation, draw_augmentation, to_model_input
from calib.training.device import loader_kwargs

__all__ = [
    "DEVICE_MEMORY_SHARE", "NO_AUGMENTATION", "DeviceBatches", "LoaderBatches", "eval_batches", "resolve_pipeline",
]

NO_AUGMENTATION = Augmentation(crop_padding=0, horizontal_flip=False)
"""The images as they are (``stage1.augment: false``)."""

DEVICE_MEMORY_SHARE = 0.25
"""``data_pipeline: auto`` holds a dataset on the GPU when its tensors take at most this share of the
free GPU memory (the rest is the model's, its activations', and other trials' sharing the GPU)."""


def resolve_pipeline(setting: str, data: DatasetSplits, device: torch.device) -> str:
    """"device" or "loader" for ``stage1.data_pipeline`` = ``setting`` on ``device``.

    "auto" is "device" on CUDA when the dataset has tensors within :data:`DEVICE_MEMORY_SHARE` of the
    free GPU memory, else "loader"; "device" for a dataset without tensors is a ``ValueError``.
    """
    if setting == "loader":
        return "loader"
    if setting == "device":
        if data.tensors is None:
            raise ValueError("`stage1.data_pipeline`='device' needs a dataset with a tensor view; this one has "
                             "none: use 'loader' or 'auto'.")
        return "device"
    if device.type != "cuda" or (data.tensor_loader is None and data.tensors is None):
        return "loader"
    free, _ = torch.cuda.mem_get_info(device)
    return "device" if _tensor_bytes(data) <= DEVICE_MEMORY_SHARE * free else "loader"


def _tensor_bytes(data: DatasetSplits) -> int:
    """Bytes of the dataset's tensors: counted once they exist, else estimated as uint8 pixels of every
    image, without building them (for Tiny-ImageNet that would decode 110,000 JPEGs)."""
    if "_tensors" in data.__dict__ and data.tensors is not None:
        return data.tensors.nbytes
    images = len(data.train_eval) + len(data.val) + len(data.test)
    return images * math.prod(data.input_shape)


def _to_model(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x


class _Indexed(Dataset):
    """``dataset[i]`` as ``(x, y, i)``: the sample's position travels with it through a DataLoader."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Any, Any, int]:
        x, y = self.dataset[index]
        return x, y, index


class LoaderBatches:
    """Training batches from a shuffling DataLoader (pinned memory and non-blocking copies on CUDA).

    Iterating gives ``(x, y)``; :meth:`indexed` gives ``(x, y, index)``, ``index`` the samples' positions in the
    split (same batches, same order: the sampler draws the same permutation either way).
    """

    def __init__(self, dataset: Dataset, batch_size: int, generator: torch.Generator, device: torch.device,
                 num_workers: int | None, channels_last: bool = False) -> None:
        self.loader = DataLoader(_Indexed(dataset), batch_size=batch_size, shuffle=True, generator=generator,
                                 **loader_kwargs(device, num_workers))
        self.num_samples = len(dataset)  # type: ignore[arg-type]
        self.device, self.channels_last = device, channels_last

    def indexed(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        for x, y, index in self.loader:
            yield (_to_model(x.to(self.device, non_blocking=True), self.channels_last),
                   y.to(self.device, non_blocking=True), index.to(self.device, non_blocking=True))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y, _ in self.indexed():
            yield x, y

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class DeviceBatches:
    """Training batches gathered from tensors held on the device, cropped, flipped and normalised there.

    The augmentation's draws come from ``augment_generator`` (CPU, seeded per trial; its state is part
    of a Stage-I checkpoint, so a resumed run draws what the uninterrupted one would have). ``augment=False``
    gives the plain images (``stage1.augment``).
    """

    def __init__(self, data: DatasetSplits, batch_size: int, generator: torch.Generator, device: torch.device,
                 augment_generator: torch.Generator, channels_last: bool = False, *, augment: bool = True) -> None:
        assert data.tensors is not None
        self.split: TensorSplit = data.tensors.train
        self.augmentation = data.tensors.augmentation if augment else NO_AUGMENTATION
        self.images = self.split.images.to(device)
        self.labels = self.split.labels.to(device)
        self.batch_size, self.generator, self.augment_generator = batch_size, generator, augment_generator
        self.device, self.channels_last = device, channels_last

    @property
    def num_samples(self) -> int:
        return len(self.labels)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y, _ in self.indexed():
            yield x, y

    def indexed(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The batches as ``(x, y, index)``, ``index`` the samples' positions in the training split."""
        # The data-order generator is consumed as a single-process DataLoader consumes it: one seed draw
        # for its workers, RandomSampler's randperm, and, as the sampler runs out, the (empty) slice of a
        # second randperm. Without augmentation both pipelines see the same batches in the same order.
        n = len(self.labels)
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        order = torch.randperm(n, generator=self.generator).to(self.device)
        for start in range(0, n, self.batch_size):
            if start + self.batch_size >= n:
                torch.randperm(n, generator=self.generator)
            index = order[start:start + self.batch_size]
            draws = draw_augmentation(self.augmentation, len(index), self.augment_generator)
            x = to_model_input(apply_augmentation(self.images[index], self.augmentation, draws), self.split)
            yield _to_model(x, self.channels_last), self.labels[index], index

    def state_dict(self) -> dict:
        return {"augment_generator": self.augment_generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.augment_generator.set_state(state["augment_generator"])


def eval_batches(source: Dataset | TensorSplit, device: torch.device, *, batch_size: int,
                 num_workers: int | None = 0, channels_last: bool = False
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Un-augmented batches in order: of a Dataset through a DataLoader, or of a :class:`TensorSplit`
    (moved to the device one batch at a time, then scaled and normalised there)."""
    if isinstance(source, TensorSplit):
        for start in range(0, len(source.labels), batch_size):
            x = source.images[start:start + batch_size].to(device, non_blocking=True)
            yield _to_model(to_model_input(x, source), channels_last), source.labels[start:start + batch_size]
        return
    loader = DataLoader(source, batch_size=batch_size, shuffle=False, **loader_kwargs(device, num_workers))
    for x, y in loader:
        yield _to_model(x.to(device, non_blocking=True), channels_last), torch.as_tensor(y)
