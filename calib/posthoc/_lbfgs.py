"""The full-batch float64 LBFGS fit the gradient-fitted post-hoc calibrators share (TS and CTS).

:func:`fit_lbfgs` minimises a torch objective until max|∂L/∂u| < :data:`GRAD_TOLERANCE`, u the fitted parameters
with each penalised entry divided by sqrt(1 + κ), κ its penalty's curvature (:func:`penalty_scale`): the same
optimum, but a strong penalty stays well conditioned. The names are re-exported by
:mod:`calib.posthoc.vector_scaling`, where calibrators import them from.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["GRAD_TOLERANCE", "LBFGS_MAX_ITER", "MAX_LBFGS_STEPS", "LBFGSResult", "fit_lbfgs", "penalty_scale"]

GRAD_TOLERANCE = 1e-6
"""The LBFGS fits end once max|∂L/∂u| < GRAD_TOLERANCE over the fitted parameters u (a ``RuntimeWarning``
if never reached)."""

MAX_LBFGS_STEPS = 100
"""At most this many ``LBFGS.step`` calls of up to :data:`LBFGS_MAX_ITER` iterations each."""

LBFGS_MAX_ITER = 100
"""LBFGS iterations per ``step``."""


@dataclass
class LBFGSResult:
    """How an LBFGS fit ended: the objective, max|∂L/∂u| there, ``step`` calls, whether it converged."""

    loss: float
    grad_max_abs: float
    steps: int
    converged: bool


def fit_lbfgs(
    parameters: list[nn.Parameter],
    objective: Callable[[], torch.Tensor],
    *,
    what: str,
    grad_tolerance: float = GRAD_TOLERANCE,
    max_iter: int = LBFGS_MAX_ITER,
    max_steps: int = MAX_LBFGS_STEPS,
    lr: float = 1.0,
    step_tolerance: float | None = None,
    warn: bool = True,
) -> LBFGSResult:
    """Minimise ``objective()`` over ``parameters`` in place with full-batch float64 LBFGS.

    ``torch.optim.LBFGS`` (``lr``, strong-Wolfe line search, ``max_iter`` iterations and 25·``max_iter``
    evaluations per step, history 100) is stepped again until max|∂L/∂u| < ``grad_tolerance`` (at most
    ``max_steps`` steps); a step that makes no progress restarts LBFGS once with fresh memory. Within a step LBFGS
    iterates until its gradient is below ``step_tolerance`` (default ``grad_tolerance``): a smaller one goes past
    the stopping rule towards the exact optimum (temperature scaling's one parameter: 1e-10). If the
    tolerance is never reached the parameters stay where LBFGS ended and (with ``warn``) a ``RuntimeWarning``
    names ``what``; a non-finite objective is a ``FloatingPointError``.
    """

    def closure() -> torch.Tensor:
        for parameter in parameters:
            parameter.grad = None
        loss = objective()
        loss.backward()
        return loss

    def evaluate() -> tuple[float, float]:
        loss = float(closure().detach())
        if not math.isfinite(loss):
            raise FloatingPointError(f"The {what} fit reached a non-finite objective ({loss}).")
        return loss, max(float(parameter.grad.abs().max()) for parameter in parameters)

    def new_lbfgs() -> torch.optim.LBFGS:
        # max_eval: room for the 25 evaluations strong Wolfe may need in every iteration (torch's default,
        # 1.25·max_iter, can leave the line search none: it then returns t = 0 and stalls)
        return torch.optim.LBFGS(parameters, lr=lr, max_iter=max_iter, max_eval=25 * max_iter,
                                 tolerance_grad=grad_tolerance if step_tolerance is None else step_tolerance,
                                 tolerance_change=1e-15, history_size=100,
                                 line_search_fn="strong_wolfe")

    loss, grad = evaluate()
    lbfgs, restarted, steps = new_lbfgs(), False, 0
    while not grad < grad_tolerance and steps < max_steps:
        steps += 1
        before = [parameter.detach().clone() for parameter in parameters]
        lbfgs.step(closure)
        new_loss, grad = evaluate()
        moved = any(not torch.equal(old, parameter.detach()) for old, parameter in zip(before, parameters, strict=True))
        if not moved or not new_loss < loss:  # no progress: restart once with fresh memory, then give up
            if restarted:
                loss = new_loss
                break
            lbfgs, restarted = new_lbfgs(), True
        else:
            restarted = False
        loss = new_loss
    converged = grad < grad_tolerance
    if not converged and warn:
        warnings.warn(f"The {what} LBFGS fit stopped at max|∂L/∂u|={grad:.3g} after {steps} steps of up to "
                      f"{max_iter} iterations (tolerance {grad_tolerance:g}); objective {loss:.10g}.",
                      RuntimeWarning, stacklevel=3)
    return LBFGSResult(loss, grad, steps, converged)


def penalty_scale(curvature: float) -> float:
    """1/sqrt(1 + κ): LBFGS fits u with θ = u/sqrt(1 + κ) for a parameter θ under an L2 penalty of curvature κ,
    so that a strong penalty (large λ or μ) does not make the problem ill-conditioned."""
    return 1.0 / math.sqrt(1.0 + curvature)
