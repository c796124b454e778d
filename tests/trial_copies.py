"""Copies of a real trial result under new trial ids, with varied numbers: many store rows without training."""

from __future__ import annotations

import dataclasses
import hashlib
import random

from calib.trial import TrialResult


def copy_of(base: TrialResult, index: int, *, status: str = "ok", study: str | None = None,
            scale: float = 1.0) -> TrialResult:
    """The ``index``-th copy of ``base``: trial id ``sha256(index)[:16]``, metrics and history values varied
    (multiplied by a number in [0.9, 1.1] drawn from ``index``, times ``scale``), ``status``, ``study``."""
    rng = random.Random(index)
    config = base.config if study is None else dataclasses.replace(base.config, study=study)
    factor = rng.uniform(0.9, 1.1) * scale
    return dataclasses.replace(
        base, config=config, trial_id=hashlib.sha256(f"copy {index}".encode()).hexdigest()[:16], status=status,
        error="RuntimeError: injected" if status == "failed" else None,
        metrics={k: v * factor for k, v in base.metrics.items()},
        history=[{k: v * factor if isinstance(v, float) else v for k, v in row.items()} for row in base.history])
