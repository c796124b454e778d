"""Device selection, seeding and DataLoader settings (the only place that looks at CUDA)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["loader_kwargs", "resolve_device", "seed_everything"]


def resolve_device(name: str = "auto") -> torch.device:
    """``"auto"`` picks CUDA when available, else the CPU; ``"cuda"`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={name!r} was requested but CUDA is not available on this machine.")
    return device


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def loader_kwargs(device: torch.device, num_workers: int) -> dict[str, Any]:
    """Pinned memory and persistent workers only where they help: CUDA and worker processes."""
    return {
        "num_workers": num_workers,
        "pin_memory": device.type == "cuda",
        "persistent_workers": num_workers > 0,
    }
