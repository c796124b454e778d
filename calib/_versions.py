"""Package versions, git commit and host recorded with every trial."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
from pathlib import Path

import calib

__all__ = ["run_environment"]


@functools.cache
def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
            text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def run_environment() -> dict[str, str | None]:
    """calib/torch/Python versions, the git commit of the calib checkout, the host name, and the
    ``CUDA_VISIBLE_DEVICES`` this process saw (Ray sets it to the GPUs it assigned to the trial)."""
    # lazy: torch takes seconds to import; this foundation module stays without it
    import torch

    return {
        "calib_version": calib.__version__,
        "torch_version": torch.__version__,
        "git_commit": _git_commit(),
        "python_version": platform.python_version(),
        "host": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
