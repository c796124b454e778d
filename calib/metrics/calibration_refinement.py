"""The calibration / refinement split of the NLL and the Brier score (Berta, Holzmüller, Jordan, Bach, "Rethinking
Early Stopping: Refine, Then Calibrate", arXiv 2501.19195): a proper loss L of predictions f is

    L(f) = [L(f) − L(g∘f)] + L(g∘f) = calibration error + refinement error,

g the recalibrator that minimises L over its family. It is estimated on the evaluated set itself by cross-fitting:
the samples fall into K folds (scikit-learn's ``StratifiedKFold(K, shuffle=True, random_state=seed)``, K = 5 and
seed 0 as probmetrics' ``MetricsWithCalibration`` with ``CVSplitter(5)`` in its metric list); g is fitted on the
other K − 1 folds' log-probabilities and applied to the held-out fold, so every sample gets an out-of-fold g∘f.
The recalibrator is a registered post-hoc calibrator (``calib.posthoc.POSTHOC``), temperature scaling by default
(the paper's). docs/methods.md §6.15.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from sklearn.model_selection import KFold, StratifiedKFold

from calib.metrics._validation import ArrayLike, check_probs_labels
from calib.metrics.brier import _brier_compute
from calib.metrics.nll import NLL_FLOOR, _nll_compute
from calib.registries import POSTHOC

__all__ = [
    "CROSS_FIT_FOLDS",
    "CROSS_FIT_SEED",
    "DEFAULT_RECALIBRATOR",
    "RECALIBRATOR_OPTIONS",
    "brier_calibration_error",
    "brier_refinement_error",
    "calibration_refinement",
    "cross_fitted_probs",
    "nll_calibration_error",
    "nll_refinement_error",
]

CROSS_FIT_FOLDS = 5
"""K of the cross-fit: probmetrics' ``CVSplitter(n_cv=5)``."""

CROSS_FIT_SEED = 0
"""``random_state`` of the shuffled folds: probmetrics' ``MetricsWithCalibration(..., random_state=0)``."""

DEFAULT_RECALIBRATOR = "temperature_scaling"
"""The recalibrator g: temperature scaling, the family Berta et al. estimate the refinement error with."""

RECALIBRATOR_OPTIONS = {"temperature_scaling": {"optimizer": "brent"}}
"""How the cross-fit builds a recalibrator: temperature scaling by its bounded scalar search, the NLL optimum of
its default fit without a torch optimizer (whose first use in a process costs about 2 s: every trial evaluates
this metric)."""


def _folds(labels: np.ndarray, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(fit, held-out) index pairs: stratified by label where some class has >= ``folds`` samples (scikit-learn
    cannot stratify otherwise), else plain shuffled folds."""
    samples = np.zeros(len(labels))
    if np.bincount(labels).max() < folds:
        return list(KFold(folds, shuffle=True, random_state=seed).split(samples))
    with warnings.catch_warnings():  # a class with fewer samples than folds is fine here: it is spread thinly
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        return list(StratifiedKFold(folds, shuffle=True, random_state=seed).split(samples, labels))


def _check_options(recalibrator: str, folds: int, seed: int) -> None:
    POSTHOC.get(recalibrator)  # an unknown name: UnknownNameError naming the registered calibrators
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(f"`folds` must be an integer >= 2, got folds={folds!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"`seed` must be an integer >= 0, got seed={seed!r}.")


def cross_fitted_probs(probs: np.ndarray, labels: np.ndarray, *, recalibrator: str = DEFAULT_RECALIBRATOR,
                       folds: int = CROSS_FIT_FOLDS, seed: int = CROSS_FIT_SEED) -> np.ndarray | None:
    """g∘f of every sample of checked ``probs`` (N, C) and ``labels`` (N,): g = ``recalibrator`` fitted on the
    log-probabilities log max(p, 4.94e-324) of the other folds; None when N < ``folds``. A fold's degenerate fit
    (e.g. temperature scaling on a separable fold) keeps its documented fallback without a warning."""
    _check_options(recalibrator, folds, seed)
    if len(labels) < folds:
        return None
    logits = torch.from_numpy(np.log(np.maximum(probs, NLL_FLOOR)))
    targets = torch.from_numpy(labels)
    out = np.empty_like(probs)
    for fit, held_out in _folds(labels, folds, seed):
        with warnings.catch_warnings():
            # calib.posthoc's DegenerateFitWarning, matched by its message (that package is a layer above this one)
            warnings.filterwarnings("ignore", message=r".*: degenerate fit: ", category=RuntimeWarning)
            g = POSTHOC.create(recalibrator, **RECALIBRATOR_OPTIONS.get(recalibrator, {})).fit(logits[fit],
                                                                                               targets[fit])
        out[held_out] = g.probs(logits[held_out]).numpy()
    return out


def _split_compute(probs: np.ndarray, labels: np.ndarray, recalibrator: str, folds: int, seed: int
                   ) -> dict[str, float]:
    recalibrated = cross_fitted_probs(probs, labels, recalibrator=recalibrator, folds=folds, seed=seed)
    if recalibrated is None:
        return dict.fromkeys(("nll_calibration", "nll_refinement", "brier_calibration", "brier_refinement"),
                             float("nan"))
    nll, brier = _nll_compute(recalibrated, labels), _brier_compute(recalibrated, labels)
    return {"nll_calibration": _nll_compute(probs, labels) - nll, "nll_refinement": nll,
            "brier_calibration": _brier_compute(probs, labels) - brier, "brier_refinement": brier}


def calibration_refinement(probs: ArrayLike, labels: ArrayLike, *, recalibrator: str = DEFAULT_RECALIBRATOR,
                           folds: int = CROSS_FIT_FOLDS, seed: int = CROSS_FIT_SEED) -> dict[str, float]:
    """The calibration and refinement errors of the NLL and the Brier score, one cross-fit for all four.

    refinement = L(g∘f) with g∘f cross-fitted (module docstring), calibration = L(f) − L(g∘f), for L the NLL
    (:func:`~calib.metrics.negative_log_likelihood`, nats) and the Brier score (:func:`~calib.metrics.brier_score`,
    in [0, 2]). The calibration error is what g recovers out of fold: it can be slightly negative for predictions
    g cannot improve (a well-calibrated f, a small N). NaN for all four when N < ``folds``.

    Args:
        probs: probabilities, shape (N, C); rows sum to 1. Numpy array or torch tensor.
        labels: integer labels in [0, C), shape (N,).
        recalibrator: a registered post-hoc calibrator name (``calib.posthoc.POSTHOC``), with its defaults.
        folds: K >= 2 folds (5).
        seed: ``random_state`` of the shuffled folds, >= 0 (0).

    Returns:
        ``{"nll_calibration", "nll_refinement", "brier_calibration", "brier_refinement"}``.

    >>> from calib.metrics import negative_log_likelihood
    >>> probs, labels = [[0.9, 0.1]] * 5 + [[0.2, 0.8]] * 5, [0, 0, 0, 1, 1, 1, 1, 1, 0, 0]
    >>> split = calibration_refinement(probs, labels, folds=2)
    >>> abs(split["nll_calibration"] + split["nll_refinement"] - negative_log_likelihood(probs, labels)) < 1e-12
    True
    >>> calibration_refinement(probs[:4], labels[:4])["brier_refinement"]  # N = 4 < 5 folds
    nan
    """
    p, y = check_probs_labels(probs, labels)
    return _split_compute(p, y, recalibrator, folds, seed)


def nll_calibration_error(probs: ArrayLike, labels: ArrayLike, **options: object) -> float:
    """NLL(f) − NLL(g∘f) in nats (:func:`calibration_refinement`; ``options``: its keywords)."""
    return calibration_refinement(probs, labels, **options)["nll_calibration"]


def nll_refinement_error(probs: ArrayLike, labels: ArrayLike, **options: object) -> float:
    """NLL(g∘f) in nats, g cross-fitted (:func:`calibration_refinement`)."""
    return calibration_refinement(probs, labels, **options)["nll_refinement"]


def brier_calibration_error(probs: ArrayLike, labels: ArrayLike, **options: object) -> float:
    """Brier(f) − Brier(g∘f) (:func:`calibration_refinement`)."""
    return calibration_refinement(probs, labels, **options)["brier_calibration"]


def brier_refinement_error(probs: ArrayLike, labels: ArrayLike, **options: object) -> float:
    """Brier(g∘f), g cross-fitted (:func:`calibration_refinement`)."""
    return calibration_refinement(probs, labels, **options)["brier_refinement"]
