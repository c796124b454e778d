"""Device selection, seeding and DataLoader settings (the only place that looks at CUDA)."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import numpy as np
import torch

__all__ = [
    "auto_num_workers",
    "autocast",
    "configure_backend",
    "describe_device",
    "loader_kwargs",
    "resolve_device",
    "seed_everything",
]

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """``"auto"`` picks CUDA when available, else the CPU; ``"cuda"`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={name!r} was requested but CUDA is not available on this machine.")
    return device


def describe_device(device: torch.device) -> str:
    """``"cpu"``, or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``: the device and, on CUDA, the GPU model."""
    if device.type != "cuda":
        return str(device)
    return f"{device} ({torch.cuda.get_device_name(device)})"


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def configure_backend(device: torch.device) -> None:
    """On CUDA, let cuDNN pick the fastest convolution algorithms for the (fixed) input shapes.

    This makes CUDA runs fast but not bitwise reproducible; the CPU path is untouched.
    """
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True


def autocast(device: torch.device, amp: str) -> torch.autocast | contextlib.nullcontext:
    """The forward-pass context of ``amp`` ("off", "bf16", "fp16"): autocast on CUDA, nothing on the CPU."""
    if device.type != "cuda" or amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda", dtype=AMP_DTYPES[amp])


def auto_num_workers(device: torch.device, cpus: int) -> int:
    """DataLoader workers for a trial with ``cpus`` CPUs: all but the training process's own on CUDA;
    none on the CPU, where loader processes would compete with the training threads."""
    return max(1, cpus - 1) if device.type == "cuda" else 0


def loader_kwargs(device: torch.device, num_workers: int | None) -> dict[str, Any]:
    """Pinned memory and persistent workers only where they help: CUDA and worker processes.

    ``num_workers=None`` sizes the workers from the CPUs this process may use (Ray sets a trial's
    thread count to its CPUs): :func:`auto_num_workers`.
    """
    if num_workers is None:
        num_workers = auto_num_workers(device, torch.get_num_threads())
    return {
        "num_workers": num_workers,
        "pin_memory": device.type == "cuda",
        "persistent_workers": num_workers > 0,
    }
