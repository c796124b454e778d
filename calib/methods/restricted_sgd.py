"""SGD whose whole update can be restricted to a mask: MaC-Cal's gradient restriction (Eq. 11, docs/methods.md §1.3).

A general optimiser over a list of tensors (stacked population heads included): where ``keep`` is 0 a
weight and its momentum buffer do not move; elsewhere the update is ``torch.optim.SGD``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["RestrictedSGD"]


class RestrictedSGD:
    """SGD with momentum and weight decay whose whole update can be masked: Eq. 11, W ← W − η·(M ⊙ update).

    ``step(keep)`` takes one 0/1 float tensor per parameter (None: no restriction): where it is 0 the
    weight and its momentum buffer stay exactly as they were. Autograd already gives dropped weights a
    zero gradient, but weight decay and momentum would still move them (pitfall P2). Elsewhere the
    update is ``torch.optim.SGD``'s (dampening 0, no Nesterov): d = g + λ·W, b ← μ·b + d (b = d at
    the first step), W ← W − η·b. Written with multiplications by the mask, not ``torch.where``
    (several times slower on the CPU); pass the same ``keep`` list object for as long as the masks hold.
    """

    def __init__(self, params: Sequence[torch.Tensor], *, lr: float, momentum: float, weight_decay: float) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)
        self._keep: Sequence[torch.Tensor | None] | None = None
        self._decay: list[torch.Tensor | None] = []

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _momentum_factors(self, keep: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """μ where the mask keeps a weight, exactly 1 where it drops it (its buffer stays)."""
        if keep is not self._keep:
            self._keep = keep
            self._decay = [None if k is None else torch.where(k.bool(), self.momentum, 1.0).to(k.dtype) for k in keep]
        return self._decay

    @torch.no_grad()
    def step(self, keep: Sequence[torch.Tensor | None]) -> None:
        factors = self._momentum_factors(keep) if self.momentum else [None] * len(keep)
        for i, (p, mask, factor) in enumerate(zip(self.params, keep, factors, strict=True)):
            update = p.grad if p.grad is not None else torch.zeros_like(p)
            if self.weight_decay:
                update = update.add(p, alpha=self.weight_decay)
            if mask is not None:
                update = update * mask  # dropped: no gradient, no weight decay
            if self.momentum:
                old = self.buffers[i]
                if old is None:
                    update = update.clone() if mask is None else update
                elif factor is None:
                    update = old.mul(self.momentum).add_(update)
                else:
                    update = update.addcmul_(old, factor)  # μ·b + d where kept, b + 0 where dropped
                self.buffers[i] = update
            if mask is None:
                p.add_(update, alpha=-self.lr)
            else:
                p.addcmul_(update, mask, value=-self.lr)
