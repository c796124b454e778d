"""Data the post-hoc calibrators' tests share: overconfident logits with their labels, and the edge cases every
calibrator must survive."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def overconfident_logits(num_samples: int, num_classes: int, *, seed: int = 0, scale: float = 3.0,
                         temperature: float | Sequence[float] = 2.0, shift: Sequence[float] | None = None,
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits z = scale·N(0, 1) and labels drawn from softmax(z / temperature + shift): z is overconfident for
    a temperature above 1. ``temperature`` may be one per class, ``shift`` one per class."""
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(num_samples, num_classes, generator=g, dtype=torch.float64)
    target = z / torch.as_tensor(temperature, dtype=torch.float64)
    if shift is not None:
        target = target + torch.tensor(shift, dtype=torch.float64)
    labels = torch.multinomial(target.softmax(1), 1, generator=g).squeeze(1)
    return z, labels


def synthetic_logits(num_samples: int, num_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The issue-39 over-confident logits (calib.datasets.synthetic_logits: Dirichlet(0.3) probabilities, logits
    2.5·log p + N(0, 0.5²) noise, labels drawn from p) as float64 and int64 tensors."""
    from calib.datasets.synthetic_logits import overconfident_logits

    logits, labels = overconfident_logits(num_samples, num_classes, seed)
    return torch.from_numpy(logits), torch.from_numpy(labels)


def edge_case_data() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, logits, labels) for the edge cases every method must survive: a class absent from the calibration
    set, ties in confidence, 50 samples of 10 classes, and a constant logit column."""
    g = torch.Generator().manual_seed(1)
    absent = torch.randn(200, 5, generator=g, dtype=torch.float64)
    absent_labels = torch.randint(0, 4, (200,), generator=g)  # class 4 never occurs
    rows = torch.randn(10, 4, generator=g, dtype=torch.float64)
    ties = rows.repeat(20, 1)
    tie_labels = torch.randint(0, 4, (200,), generator=g)
    small = 3 * torch.randn(50, 10, generator=g, dtype=torch.float64)
    small_labels = torch.randint(0, 10, (50,), generator=g)
    constant = torch.randn(300, 4, generator=g, dtype=torch.float64)
    constant[:, 2] = 0.7
    constant_labels = torch.randint(0, 4, (300,), generator=g)
    return [("absent_class", absent, absent_labels), ("ties", ties, tie_labels),
            ("50_samples_10_classes", small, small_labels), ("constant_column", constant, constant_labels)]


def check_runs_as_a_method(cases: list[tuple[str, object]]) -> None:
    """Each (method name, config) runs through the method registry on float32 logits (120 validation and 80 test
    samples of 4 classes) and returns float64 probabilities that sum to 1: on the validation samples it did
    not fit on (all of them without ``calibration_size``) and on the test split."""
    from types import SimpleNamespace

    from calib.methods import METHODS

    g = torch.Generator().manual_seed(7)
    splits = {name: SimpleNamespace(features=torch.empty(n, 0), logits=torch.randn(n, 4, generator=g),
                                    labels=torch.randint(0, 4, (n,), generator=g))
              for name, n in (("val", 120), ("test", 80))}
    for name, params in cases:
        outcome = METHODS.get(name)(params, SimpleNamespace(splits=splits), seed=0, device=torch.device("cpu"))
        held_out = 120 if params.calibration_size is None else 120 - params.calibration_size  # val metrics: the rest
        for probs, n in ((outcome.val_probs, held_out), (outcome.test_probs, 80)):
            assert probs.shape == (n, 4) and probs.dtype == torch.float64 and torch.isfinite(probs).all()
            torch.testing.assert_close(probs.sum(1), torch.ones(n, dtype=torch.float64))
