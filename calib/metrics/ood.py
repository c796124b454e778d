"""OOD detection from max-softmax (MSP) scores, in-distribution as the positive class."""

from __future__ import annotations

import numpy as np

from calib.metrics._validation import ArrayLike, check_scores

__all__ = ["ood_auroc", "ood_fpr_at_95_tpr"]

_TARGET_TPR = 0.95


def _scores_and_targets(id_scores: ArrayLike, ood_scores: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    s_id = check_scores(id_scores, "id_scores")
    s_ood = check_scores(ood_scores, "ood_scores")
    targets = np.concatenate([np.ones(s_id.size), np.zeros(s_ood.size)])
    return np.concatenate([s_id, s_ood]), targets


def ood_auroc(id_scores: ArrayLike, ood_scores: ArrayLike) -> float:
    """AUROC of separating ID from OOD samples, a fraction in [0, 1] (not percent).

    AUROC = P(s_ID > s_OOD) + ½ · P(s_ID = s_OOD)

    for a random ID score s_ID and a random OOD score s_OOD. Convention: the score is a
    confidence such as the max softmax probability (higher = more in-distribution) and ID is the
    positive class (label 1), as in TST-R (``ood_metrics.auroc``) and docs/methods.md §6.7. Libraries
    that take an uncertainty score (e.g. entropy) treat OOD as positive; pass ``-score`` to use
    them here. Computed with ``sklearn.metrics.roc_auc_score``.

    Args:
        id_scores: scores of the in-distribution samples, shape (N_id,), N_id >= 1.
        ood_scores: scores of the out-of-distribution samples, shape (N_ood,), N_ood >= 1.

    Returns:
        AUROC in [0, 1]: 1.0 when every ID score exceeds every OOD score, 0.5 for identical scores.

    >>> ood_auroc([0.9, 0.8], [0.7, 0.85])
    0.75
    """
    scores, targets = _scores_and_targets(id_scores, ood_scores)
    from sklearn.metrics import roc_auc_score  # imported here: scikit-learn takes a second or more to import

    return float(roc_auc_score(targets, scores))


def ood_fpr_at_95_tpr(id_scores: ArrayLike, ood_scores: ArrayLike) -> float:
    """False-positive rate at 95% true-positive rate (FPR95), a fraction in [0, 1] (not percent).

    ID is the positive class and higher scores mean more in-distribution (MSP), as in
    :func:`ood_auroc`. For a threshold t, TPR(t) = fraction of ID scores >= t and
    FPR(t) = fraction of OOD scores >= t. FPR95 is the FPR of the ROC curve at TPR = 0.95:

    - if some threshold gives TPR exactly 0.95 (e.g. 0.95 * N_id is an integer, no ties), FPR95 is
      the fraction of OOD scores >= the highest such threshold, i.e. the smallest FPR on the
      curve at TPR 0.95;
    - otherwise the ROC curve is interpolated linearly at TPR 0.95 between its two neighbouring
      points, as ``ood_metrics.fpr_at_95_tpr`` does with ``np.interp``.

    The two agree except in the exact case, where ``np.interp`` over sklearn's ROC points returns
    the *largest* FPR at TPR 0.95 (the far end of the flat ROC segment). BALCAL-R ``get_fpr95``
    instead thresholds at the 5th percentile of the ID scores (docs/methods.md §6.7).

    Args:
        id_scores: scores of the in-distribution samples, shape (N_id,), N_id >= 1.
        ood_scores: scores of the out-of-distribution samples, shape (N_ood,), N_ood >= 1.

    Returns:
        FPR95 in [0, 1]; lower is better.

    Here the threshold that keeps 19 of the 20 ID scores is 0.1, and 2 of 4 OOD scores are >= 0.1.

    >>> ood_fpr_at_95_tpr(np.arange(1, 21) / 20, [0.02, 0.05, 0.15, 0.5])
    0.5
    """
    scores, targets = _scores_and_targets(id_scores, ood_scores)
    # lazy: scikit-learn takes a second or more to import
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(targets, scores, drop_intermediate=False)
    # tpr is non-decreasing from 0 to 1: j is the first ROC point with TPR >= 0.95.
    j = int(np.searchsorted(tpr, _TARGET_TPR, side="left"))
    if tpr[j] == _TARGET_TPR:
        return float(fpr[j])
    fraction = (_TARGET_TPR - tpr[j - 1]) / (tpr[j] - tpr[j - 1])
    return float(fpr[j - 1] + fraction * (fpr[j] - fpr[j - 1]))
