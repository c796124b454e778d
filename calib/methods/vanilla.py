"""Vanilla: the Stage-I model as trained, evaluated from its cached logits (no Stage II)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from calib.methods._base import MethodOutcome, MethodSpec
from calib.methods._registry import METHODS

if TYPE_CHECKING:
    from calib.artifacts import Stage1Artifact

__all__ = ["FORMER_UNCALIBRATED_LABELS", "UNCALIBRATED_LABEL", "VanillaConfig", "current_uncalibrated_label",
           "run_vanilla"]

UNCALIBRATED_LABEL = "Vanilla"
"""The row of the uncalibrated model in every table, flag and store ``label`` (MaC-Cal's name for the model as
trained, on its own checkpoint or logits too)."""

FORMER_UNCALIBRATED_LABELS = ("Vanilla (CE)", "CE", "Uncalibrated", "vanilla")
"""Its names before it had one: still accepted where a user types a row, read as it in stored rows."""


def current_uncalibrated_label(label: object) -> object:
    """A row's label as calib names it now: the uncalibrated model's former names (``Vanilla (CE)``, ``CE``,
    ``Uncalibrated``) as ``Vanilla``, also as the Stage I of a combined row (``CE +MaC-Cal`` → ``Vanilla +MaC-Cal``);
    any other label (or a non-string) as it is.

    >>> current_uncalibrated_label("Vanilla (CE)"), current_uncalibrated_label("CE +MaC-Cal")
    ('Vanilla', 'Vanilla +MaC-Cal')
    """
    if not isinstance(label, str):
        return label
    for former in FORMER_UNCALIBRATED_LABELS:
        if label == former or label.startswith(former + " +"):
            return UNCALIBRATED_LABEL + label[len(former):]
    return label


@dataclass(frozen=True, kw_only=True)
class VanillaConfig:
    """Vanilla has no hyperparameters beyond Stage I's."""


def run_vanilla(
    params: VanillaConfig, artifact: Stage1Artifact, *, seed: int, device: torch.device
) -> MethodOutcome:
    return MethodOutcome.from_predictor(lambda features, logits: logits.double().softmax(1), artifact)


METHODS.register("vanilla")(
    MethodSpec(VanillaConfig, run_vanilla, "the Stage-I model, no recalibration", logits_only=True,
               label=UNCALIBRATED_LABEL, order=0, draws=False))
