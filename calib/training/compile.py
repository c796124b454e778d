"""``torch.compile`` for the Stage-I training step: which mode, and where its caches live.

Compiling a paper architecture costs one to two minutes per process; the compiler's on-disk caches (Inductor's
FX-graph and autograd caches, Triton kernels) make a later process on the same node compile the same
model in a fraction of that. They are kept in a node-local directory, ``$CALIB_COMPILE_CACHE``
(default ``~/.cache/calib/compile``), shared by every trial of the node.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["COMPILE_MODES", "CUDA_GRAPH_MODES", "DEFAULT_MODE", "compile_cache_dir", "enable_compile_caches",
           "resolve_compile_mode"]

COMPILE_MODES: dict[str, str] = {
    # Measured on an NVIDIA H200 (torch 2.11, bf16, channels_last, batch 128, CIFAR-sized inputs; calib's own
    # loop, steady-state images/s per mode off / default / reduce-overhead; docs/how-to/benchmarks.md).
    # Small kernels leave the GPU idle between launches: CUDA graphs ("reduce-overhead") win.
    "resnet20": "reduce-overhead",  # 11,177 / 13,814 / 33,784
    "resnet50": "reduce-overhead",  # 5,609 / 5,027 / 9,912
    "resnet110": "reduce-overhead",  # 2,641 / 4,301 / 5,648
    # Wide convolutions keep the GPU busy: compiling gains nothing and costs a minute per process.
    "wrn26_10": "off",  # 8,833 / 7,188 / 8,247
    # Neither compiled mode finished compiling in 190 s (one process alone on 16 cores).
    "densenet121": "off",  # 3,125 / – / –
}
"""Architecture → the ``torch.compile`` mode that ``stage1.compile: auto`` uses. Architectures not
listed get :data:`DEFAULT_MODE`; ``python benchmarks/gpu_throughput.py`` measures every mode per
architecture on the GPU at hand, to fill this table."""

DEFAULT_MODE = "off"
"""``auto``'s mode for an architecture not in :data:`COMPILE_MODES`: eager. Of the five measured, Inductor's
``default`` mode lost to eager on two and CUDA graphs won where compiling paid at all; an unmeasured
architecture does not pay a minute or more of compiling per process on a guess."""


CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
"""Modes whose compiled step replays CUDA graphs: a training loop marks each step's start, and an output
needed after the next call must be cloned first."""


def resolve_compile_mode(setting: str, arch: str, device: torch.device) -> str:
    """The mode a trial compiles with: "off" on the CPU or when ``setting`` is "off"; the table's (or
    :data:`DEFAULT_MODE`) for "auto"; else ``setting`` itself."""
    if device.type != "cuda" or setting == "off":
        return "off"
    if setting == "auto":
        return COMPILE_MODES.get(arch, DEFAULT_MODE)
    return setting


def compile_cache_dir() -> Path:
    """The node-local directory of the compiler's caches: ``$CALIB_COMPILE_CACHE`` or
    ``~/.cache/calib/compile``."""
    return Path(os.environ.get("CALIB_COMPILE_CACHE", Path.home() / ".cache" / "calib" / "compile"))


def enable_compile_caches() -> Path:
    """Point Inductor's and Triton's on-disk caches at :func:`compile_cache_dir` (unless the user set
    them) and turn the FX-graph and autograd caches on; call before the first compile of a process."""
    root = compile_cache_dir()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    root.mkdir(parents=True, exist_ok=True)
    return root
