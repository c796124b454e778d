"""The data of the reference checks (tests/posthoc/test_posthoc_references.py, tests/metrics/test_metric_references.py,
docs/how-to/reference-checks.md): seeded over-confident logits at K = 2, 10 and 100 classes.

True class probabilities p ~ Dirichlet(0.3, …, 0.3); logits z = 2.5·log p + ε, ε ~ N(0, 1) per entry; the label is
drawn from p. The model's softmax(z) ∝ p^2.5 (times noise) is sharper than p: over-confident, as the issue's trial.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

CLASS_COUNTS = (2, 10, 100)
"""K of the reference checks."""

CONCENTRATION = 0.3
"""α of the symmetric Dirichlet the true probabilities are drawn from."""

SHARPNESS = 2.5
"""The logits are SHARPNESS·log p + noise."""

NOISE_SCALE = 1.0
"""Standard deviation of the Gaussian noise added to every logit."""


def overconfident_dirichlet(num_samples: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(logits (N, K) float64, labels (N,) int64): p ~ Dirichlet(0.3), z = 2.5·log p + N(0, 1), y ~ p.

    p is drawn as normalised Gamma(0.3) variates, so log p is finite (its smallest entries are about e^−50, far
    from underflow); y is drawn by inverting p's cumulative sum at one uniform per sample.
    """
    rng = np.random.default_rng(seed)
    gamma = rng.standard_gamma(CONCENTRATION, size=(num_samples, num_classes))
    log_p = np.log(gamma) - np.log(gamma.sum(axis=1, keepdims=True))
    logits = SHARPNESS * log_p + NOISE_SCALE * rng.standard_normal((num_samples, num_classes))
    uniform = rng.random((num_samples, 1))
    labels = np.minimum((np.exp(log_p).cumsum(axis=1) < uniform).sum(axis=1), num_classes - 1)
    return logits, labels.astype(np.int64)


@dataclass(frozen=True)
class ReferenceSplit:
    """A calibration set and a test set drawn from :func:`overconfident_dirichlet` with one seed."""

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
    logits, labels = overconfident_dirichlet(calibration_size + test_size, num_classes, seed)
    return ReferenceSplit(num_classes, logits[:calibration_size], labels[:calibration_size],
                          logits[calibration_size:], labels[calibration_size:])
