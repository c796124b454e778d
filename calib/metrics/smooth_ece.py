"""SmoothECE (Błasiok & Nakkiran, ICLR 2024): the ECE with a kernel in place of bins, via ``relplot``."""

from __future__ import annotations

import warnings
from types import ModuleType

import numpy as np

from calib.metrics._binning import top_label
from calib.metrics._validation import ArrayLike, check_probs_labels

__all__ = ["smooth_ece"]


def _import_relplot() -> ModuleType:
    """``relplot``, imported on first use: it pulls in matplotlib.pyplot, seaborn, pandas and sklearn
    (about 1 s), which ``import calib.metrics`` must not pay. Its import adds a ``warnings`` filter
    (``relplot.kernels``); ``catch_warnings`` puts the caller's filters back."""
    with warnings.catch_warnings():
        # lazy: relplot pulls in seaborn (seconds to import); only SmoothECE needs it
        import relplot
    if relplot.config.use_logit_scaling:
        raise RuntimeError(
            "smooth_ece needs relplot's reflected Gaussian kernel, but relplot.config.use_logit_scaling is True "
            "(set elsewhere in this process); set it back to False (relplot's default)."
        )
    return relplot


def _smece_with_bandwidth(confidences: np.ndarray, correct: np.ndarray) -> tuple[float, float]:
    """(smECE at the automatic bandwidth σ*, σ*) from ``relplot.smECE``."""
    value, bandwidth = _import_relplot().smECE(confidences, correct, return_width=True)
    return float(value), float(bandwidth)


def _smece_compute(confidences: np.ndarray, correct: np.ndarray) -> float:
    return _smece_with_bandwidth(confidences, correct)[0]


def smooth_ece(probs: ArrayLike, labels: ArrayLike) -> float:
    """SmoothECE (smECE) of the top-label prediction, a fraction in [0, 1]; no bins to choose.

    smECE_σ = ∫_0^1 |r̂_σ(t)| · δ̂_σ(t) dt,
    r̂_σ(t) = Σ_i K_σ(t, f_i)·(f_i − y_i) / Σ_i K_σ(t, f_i),   δ̂_σ(t) = (1/N) Σ_i K_σ(t, f_i)

    where f_i = max_k p_{i,k} is the max-softmax confidence, y_i = 1[arg-max class = label] and K_σ
    the Gaussian kernel of width σ reflected at 0 and 1, K_σ(t, f) = φ_σ(t − f) + φ_σ(t + f) +
    φ_σ(t − 2 + f) (r̂ is the kernel regression of the residual, δ̂ the kernel density of the
    confidences). The bandwidth is the fixed point σ* with smECE_σ* = σ*, found by ``relplot.smECE``
    by bisection on [0, 1] (10 halvings: σ* is the upper end of a bracket of width 2^-10, so
    smECE_σ* ≤ σ* < smECE_{σ* − 2^-10} + 2^-10). relplot discretises: it rounds the confidences
    onto a grid of max(1000, 10/σ) + 1 points (splitting each sample linearly between two), convolves
    with the kernel and sums over t on max(200, 10/σ) points,
    smECE_σ = Σ_t |Σ_i K_σ(t, f_i)(f_i − y_i)| / Σ_t Σ_i K_σ(t, f_i). Pitfall, inherited: the mass on
    relplot's last grid point (t = 1) is not reflected, so a confidence within 1/1000 of 1 counts with
    about half its weight; with many such correct predictions smECE is higher than with the exact kernel
    (docs/methods.md §6.11).

    Computed by ``relplot.smECE`` (Apple's reference package, imported on first call; its global
    ``relplot.config`` must keep its defaults). Reference: Błasiok and Nakkiran, "Smooth ECE:
    Principled Reliability Diagrams via Kernel Smoothing", ICLR 2024.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).

    Returns:
        smECE at σ*, a fraction in [0, 1]; lower is better.

    >>> probs = [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.375, 0.625]]
    >>> round(smooth_ece(probs, [0, 1, 0, 1]), 4)
    0.2186
    """
    p, y = check_probs_labels(probs, labels)
    return _smece_compute(*top_label(p, y))
