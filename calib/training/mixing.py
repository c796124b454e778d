"""Mixup (Zhang et al. 2018) and MIT, Mixup Inference in Training (Wang et al. CVPR 2023): docs/methods.md §4.8-4.9."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["mit_coefficients", "mit_decouple", "mix"]


def mix(x_a: torch.Tensor, x_b: torch.Tensor, lam: float) -> torch.Tensor:
    """x̃ = λ·x_a + (1 − λ)·x_b."""
    return lam * x_a + (1 - lam) * x_b


def mit_coefficients(alpha: float, rng: np.random.Generator, min_gap: float = 1e-3) -> tuple[float, float]:
    """(λ1, λ2) with λ1 = max(λ, 1−λ), λ2 = min(λ', 1−λ') for λ, λ' ~ Beta(α, α).

    λ1 ≥ 0.5 ≥ λ2; a pair with λ1 − λ2 < ``min_gap`` makes the decoupling system singular
    (λ1 = λ2 = 0.5) and is drawn again.
    """
    while True:
        lam, lam_prime = rng.beta(alpha, alpha, size=2)
        lam1, lam2 = max(lam, 1 - lam), min(lam_prime, 1 - lam_prime)
        if lam1 - lam2 >= min_gap:
            return float(lam1), float(lam2)


def mit_decouple(
    out1: torch.Tensor, out2: torch.Tensor, lam1: float, lam2: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recover f(x_a) and f(x_b) from o_k = f(λ_k·x_a + (1−λ_k)·x_b), assuming f is affine.

    Solves o_k = λ_k·f(x_a) + (1−λ_k)·f(x_b), k = 1, 2:
    f̂(x_a) = (o1 − c1·o2)/(λ1 − c1·λ2) with c1 = (1−λ1)/(1−λ2), and
    f̂(x_b) = (o2 − c2·o1)/((1−λ2) − (1−λ1)·c2) with c2 = λ2/λ1. Exact for an affine f.
    """
    c1 = (1 - lam1) / (1 - lam2)
    c2 = lam2 / lam1
    f_a = (out1 - c1 * out2) / (lam1 - c1 * lam2)
    f_b = (out2 - c2 * out1) / ((1 - lam2) - (1 - lam1) * c2)
    return f_a, f_b
