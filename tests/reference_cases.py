"""The data of the reference checks (tests/posthoc/test_posthoc_references.py, tests/metrics/test_metric_references.py,
docs/how-to/reference-checks.md): seeded over-confident logits at K = 2, 10 and 100 classes.

True class probabilities p ~ Dirichlet(0.3, …, 0.3); logits z = 2.5·log p + ε, ε ~ N(0, 0.5²) per entry; the label
is drawn from p (calib.datasets.synthetic_logits, the post-hoc study's many-class data). The model's
softmax(z) ∝ p^2.5 (times noise) is sharper than p: over-confident, as the issue's trial.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calib.datasets.synthetic_logits import overconfident_logits

CLASS_COUNTS = (2, 10, 100)
"""K of the reference checks."""


@dataclass(frozen=True)
class ReferenceSplit:
    """A calibration set and a test set drawn from calib's over-confident logits with one seed."""

    num_classes: int
    calibration_logits: np.ndarray
    calibration_labels: np.ndarray
    test_logits: np.ndarray
    test_labels: np.ndarray

    def calibration_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The calibration set as (float64 logits, int64 labels) tensors, what calib's calibrators fit on."""
        return torch.from_numpy(self.calibration_logits), torch.from_numpy(self.calibration_labels)


def reference_split(num_classes: int, calibration_size: int, test_size: int, seed: int) -> ReferenceSplit:
    """The first ``calibration_size`` samples of one draw calibrate, the next ``test_size`` test."""
    logits, labels = overconfident_logits(calibration_size + test_size, num_classes, seed)
    return ReferenceSplit(num_classes, logits[:calibration_size], labels[:calibration_size],
                          logits[calibration_size:], labels[calibration_size:])
