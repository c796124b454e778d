"""Handover: the latest state of a Stage-I training, kept beside its claim so that a trial taking over
a dead holder's claim continues where that training stopped instead of starting again.

The holder writes the state (:func:`calib.training.train_stage1`'s checkpoint: weights, optimiser,
schedule, generators, history) at most every ``$CALIB_STAGE1_HANDOVER_SECONDS`` (default 300; 0:
every epoch), to ``<artifact_root>/stage1/<stage1_id>.handover.pt`` on a local or shared directory
or ``<artifact_root>/stage1/<stage1_id>/handover.pt`` on S3, and deletes it once the artifact is
published. Resuming from it gives the same model as an uninterrupted training. When the study stops cleanly, the
state is written at the end of the current epoch whatever its age, before the claim is released
(:meth:`Handover.keeping` with the claim).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from calib import storage
from calib.artifacts.checks import CorruptArtifactError, say, torch_load

if TYPE_CHECKING:
    from calib.artifacts.claim import Claim

__all__ = ["HANDOVER_ENV", "Handover"]

HANDOVER_ENV = "CALIB_STAGE1_HANDOVER_SECONDS"


class Handover:
    """The handover state of ``stage1_id`` under ``artifact_root``; ``scratch`` is a local directory
    for its temporary files."""

    def __init__(self, artifact_root: str, stage1_id: str, scratch: Path, every_seconds: float | None = None) -> None:
        self.stage1_id = stage1_id
        self.location = (storage.join(artifact_root, "stage1", stage1_id, "handover.pt")
                         if storage.is_remote(artifact_root)
                         else storage.join(artifact_root, "stage1", f"{stage1_id}.handover.pt"))
        self.scratch = scratch
        self.every_seconds = float(os.environ.get(HANDOVER_ENV, 300)) if every_seconds is None else every_seconds
        self._last = time.monotonic()

    def latest(self) -> dict[str, Any] | None:
        """The state a previous holder left, or None (none, or one that does not load: then it is ignored)."""
        local = self.scratch / f".{self.stage1_id}.handover.{uuid.uuid4().hex}.pt"
        try:
            if storage.is_remote(self.location):
                storage.download(self.location, local)
                path = local
            else:
                path = Path(self.location)
                if not path.exists():
                    return None
            return torch_load(path)
        except FileNotFoundError:
            return None
        except CorruptArtifactError as err:
            say(f"Stage I {self.stage1_id}: the training state a previous holder left does not load ({err}); "
                f"training from the start")
            return None
        finally:
            local.unlink(missing_ok=True)

    def keeping(self, on_checkpoint: Callable[[dict[str, Any]], None] | None, claim: Claim | None = None
                ) -> Callable[[dict[str, Any]], None]:
        """``on_checkpoint`` that also writes the handover state when it is due, and, once ``claim`` says the
        study is stopping, writes it at once and hands the claim over (then writes nothing more: the next run
        continues from that state)."""
        handed_over = False

        def on_state(state: dict[str, Any]) -> None:
            nonlocal handed_over
            if claim is not None and claim.stop_requested.is_set() and not handed_over:
                self.write(state)
                handed_over = True
                claim.hand_over(int(state["epoch"]))
            elif not handed_over and time.monotonic() - self._last >= self.every_seconds:
                self.write(state)
            if on_checkpoint is not None:
                on_checkpoint(state)
        return on_state

    def write(self, state: dict[str, Any]) -> None:
        """Write ``state`` through a temporary file (a rename locally, one PUT on S3)."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        tmp = self.scratch / f".{self.stage1_id}.handover.{uuid.uuid4().hex}.tmp"
        try:
            torch.save(state, tmp)
            if storage.is_remote(self.location):
                storage.upload(tmp, self.location)
            else:
                os.replace(tmp, self.location)
        finally:
            tmp.unlink(missing_ok=True)
        self._last = time.monotonic()

    def discard(self) -> None:
        """Delete the handover state (the artifact is published)."""
        storage.delete(self.location)
