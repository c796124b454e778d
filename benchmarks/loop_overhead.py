"""calib's Stage-I training loop against a plain PyTorch loop: same model, data, optimiser and schedule.

The plain loop is what one writes by hand: DataLoader, forward, summed cross-entropy, backward,
gradient-norm clip, SGD step, MultiStepLR per epoch. calib's ``train_stage1`` does the same plus its
bookkeeping (per-step training statistics, AMP/scaler plumbing) and a validation pass after every epoch
(one batch here). Two throughputs per loop: the *step* throughput (images over the time spent in the
epochs' training steps, device synchronised at each epoch's end: what ``stage1_images_per_second``
stores) and the *end-to-end* one (images over the whole call, calib's validation passes included).
Runs alternate calib / plain and the median of ``--repeats`` is kept. Prints one line per setup with
both ratios (calib / plain; the goal for the step ratio is ≥ 0.95)::

    python benchmarks/loop_overhead.py                       # CPU: small_cnn on digits-noisy, resnet50 on CIFAR-sized
    python benchmarks/loop_overhead.py --device cuda --amp bf16
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from calib.config import parse_trial_config
from calib.datasets import DatasetSplits, load_dataset
from calib.models import create_model
from calib.training import loader_kwargs, resolve_device, seed_everything, train_stage1
from calib.training.device import autocast, configure_backend


def plain_loop(arch: str, data: DatasetSplits, device: torch.device, *, epochs: int, batch_size: int,
               amp: str, num_workers: int) -> float:
    """The hand-written reference loop (FOCAL-R's recipe); returns the seconds spent in training steps."""
    seed_everything(0)
    configure_backend(device)
    model = create_model(arch, num_classes=data.num_classes, in_channels=data.input_shape[0]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[epochs // 2], gamma=0.1)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda" and amp == "fp16")
    loader = DataLoader(data.train, batch_size=batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(0), **loader_kwargs(device, num_workers))
    criterion = nn.CrossEntropyLoss(reduction="sum")
    step_seconds = 0.0
    for _ in range(epochs):
        model.train()
        start = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast(device, amp):
                logits = model(x)
            loss = criterion(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), 2.0)
            scaler.step(optimizer)
            scaler.update()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_seconds += time.perf_counter() - start
        scheduler.step()
    return step_seconds


def calib_loop(arch: str, data: DatasetSplits, device: torch.device, *, epochs: int, batch_size: int,
               amp: str, num_workers: int) -> float:
    """``calib.training.train_stage1`` with the same recipe; returns the seconds spent in training steps."""
    cfg = parse_trial_config({
        "study": "benchmark", "seed": 0, "dataset": "digits-noisy", "arch": arch,
        "stage1": {"epochs": epochs, "batch_size": batch_size, "milestones": [epochs // 2], "grad_clip": 2.0,
                   "loss_reduction": "sum", "amp": amp},
        "method": {"name": "vanilla"}, "data_root": "/unused", "artifact_root": "/unused",
        "num_workers": num_workers, "device": str(device),
    })
    trained = train_stage1(cfg, data, device)
    return epochs * len(data.train) / trained.images_per_second


def measure(name: str, arch: str, data: DatasetSplits, device: torch.device, args: argparse.Namespace,
            epochs: int) -> float:
    """Print and return the step-throughput ratio calib / plain."""
    kwargs = {"epochs": epochs, "batch_size": args.batch_size, "amp": args.amp, "num_workers": args.num_workers}
    loops: dict[str, Callable[..., float]] = {"calib": calib_loop, "plain": plain_loop}
    steps: dict[str, list[float]] = {"calib": [], "plain": []}
    walls: dict[str, list[float]] = {"calib": [], "plain": []}
    plain_loop(arch, data, device, **{**kwargs, "epochs": 1})  # warm-up: allocator, cuDNN autotuning, threads
    for _ in range(args.repeats):
        for label in ("calib", "plain"):
            start = time.perf_counter()
            steps[label].append(loops[label](arch, data, device, **kwargs))
            walls[label].append(time.perf_counter() - start)
    images = epochs * len(data.train)
    step = {k: images / statistics.median(v) for k, v in steps.items()}
    wall = {k: images / statistics.median(v) for k, v in walls.items()}
    print(f"{name}: {epochs} epochs × {len(data.train)} images, batch {args.batch_size}, amp {args.amp}, "
          f"median of {args.repeats} · steps: calib {step['calib']:.0f} img/s, plain PyTorch {step['plain']:.0f} "
          f"img/s, ratio {step['calib'] / step['plain']:.3f} · end to end (calib validating every epoch): "
          f"ratio {wall['calib'] / wall['plain']:.3f}", flush=True)
    return step["calib"] / step["plain"]


def _tensor_splits(images: torch.Tensor, labels: torch.Tensor, num_classes: int, val_size: int) -> DatasetSplits:
    train = TensorDataset(images, labels)
    val = TensorDataset(images[:val_size], labels[:val_size])
    return DatasetSplits(train=train, train_eval=train, val=val, test=val, num_classes=num_classes,
                         input_shape=tuple(images.shape[1:]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--amp", default="off", choices=["off", "bf16", "fp16"], help="autocast on CUDA")
    parser.add_argument("--epochs", type=int, default=8, help="epochs of the small_cnn setup")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers of both loops")
    parser.add_argument("--resnet-images", type=int, default=128, help="CIFAR-sized images for resnet50 (0: skip)")
    parser.add_argument("--resnet-epochs", type=int, default=2, help="epochs of the resnet50 setup")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    print(f"device {device} · torch {torch.__version__} · threads {torch.get_num_threads()}")

    digits = load_dataset("digits-noisy", "")
    images, labels = digits.train.tensors
    measure("digits-noisy / small_cnn", "small_cnn", _tensor_splits(images, labels, 10, args.batch_size),
            device, args, args.epochs)
    if args.resnet_images:
        generator = torch.Generator().manual_seed(0)
        images = torch.randn(args.resnet_images, 3, 32, 32, generator=generator)
        labels = torch.randint(0, 10, (args.resnet_images,), generator=generator)
        measure("CIFAR-sized / resnet50", "resnet50", _tensor_splits(images, labels, 10, args.batch_size),
                device, args, args.resnet_epochs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
