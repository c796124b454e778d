"""Stage II on cached features against Stage II with a frozen-backbone forward per batch.

Same MaC-Cal head, same epochs, same data order; the only difference is where the features come
from. Prints one line per setup with both timings and their ratio (measured side by side, one run):

    python benchmarks/stage2_cached.py                 # default setup + ResNet-110 on CIFAR-sized inputs
"""

from __future__ import annotations

import argparse
import time

import torch

from calib._help import HelpFormatter
from calib.datasets import load_dataset
from calib.methods.mac_cal import MacCalConfig
from calib.methods.mac_cal_training import fit_mac_cal
from calib.models import create_model
from calib.training import predict, resolve_device


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(name: str, model, images: torch.Tensor, labels: torch.Tensor, params: MacCalConfig,
            device: torch.device) -> None:
    model = model.to(device).eval()
    dataset = torch.utils.data.TensorDataset(images, labels)
    features, _, _ = predict(model, dataset, device, batch_size=params.batch_size)
    kwargs = {"num_features": model.num_features, "num_classes": model.num_classes, "seed": 0, "device": device}
    cached = _time(lambda: fit_mac_cal(params, features, labels, **kwargs))
    forward = _time(lambda: fit_mac_cal(params, images, labels, feature_fn=model.features, **kwargs))
    print(f"{name}: {params.epochs} epochs × {images.shape[0]} samples · cached features {cached:.2f} s · "
          f"backbone forward per batch {forward:.2f} s · speed-up ×{forward / cached:.1f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--epochs", type=int, default=40, help="Stage-II epochs on the default setup")
    parser.add_argument("--resnet-batches", type=int, default=4, help="batches of 128 CIFAR-sized images")
    parser.add_argument("--resnet-epochs", type=int, default=2, help="Stage-II epochs on ResNet-110")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    torch.manual_seed(0)
    print(f"device {device} · torch threads {torch.get_num_threads()}")

    data = load_dataset("digits-noisy", "")
    images, labels = data.train.tensors
    model = create_model("small_cnn", num_classes=data.num_classes, in_channels=1)
    compare("digits-noisy / small_cnn", model, images, labels, MacCalConfig(epochs=args.epochs), device)

    n = 128 * args.resnet_batches
    images = torch.randn(n, 3, 32, 32)
    labels = torch.randint(0, 10, (n,))
    model = create_model("resnet110", num_classes=10)
    compare("CIFAR-sized / resnet110", model, images, labels, MacCalConfig(epochs=args.resnet_epochs), device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
