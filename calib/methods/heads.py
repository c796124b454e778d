"""Classifier heads retrained in Stage II, with weights that can be masked in the forward pass.

:class:`StackedLinears` holds K heads of one shape side by side (weights (K, out, in)) so that a
population of Stage-II configs trains in one process with batched matrix products; head k of the
stack computes exactly what its own :class:`MaskableHead` (or TST head) computes.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["MaskableHead", "StackedLinears"]


class MaskableHead(nn.Module):
    """Linear layers ``widths[0] → widths[1] → … → widths[-1]`` with ReLU between them.

    ``MaskableHead([d, C])`` is the linear classifier; ``MaskableHead([d, r, C])`` is MaC-Cal's
    bottleneck z = W2·ReLU(W1·h + b1) + b2 (docs/methods.md §1.3). In :meth:`forward`, layer i uses the
    weight ``weight_scale · (masks[i] ⊙ W_i)``; biases are never masked.
    """

    def __init__(self, widths: Sequence[int]) -> None:
        super().__init__()
        if len(widths) < 2 or min(widths) < 1:
            raise ValueError(f"`widths` must list at least two sizes >= 1, got widths={list(widths)}.")
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))

    @property
    def weights(self) -> list[nn.Parameter]:
        return [layer.weight for layer in self.layers]

    def forward(
        self, h: torch.Tensor, masks: Sequence[torch.Tensor] | None = None, weight_scale: float = 1.0
    ) -> torch.Tensor:
        x = h
        for i, layer in enumerate(self.layers):
            weight = layer.weight if masks is None else layer.weight * masks[i]
            if weight_scale != 1.0:
                weight = weight * weight_scale
            x = F.linear(x, weight, layer.bias)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


class StackedLinears(nn.Module):
    """K copies of a chain of linear layers, stacked along a leading population dimension.

    ``members[k]`` lists head k's ``nn.Linear`` layers (every member the same shapes); ReLU follows
    the layers whose index is in ``relu_after``. Layer i holds ``weights[i]`` (K, out, in) and
    ``biases[i]`` (K, out), initialised from the members' values. :meth:`forward` maps (K, B, in)
    inputs to (K, B, out); member k sees only its own weights, masks and scale, so the gradient of a
    sum of per-member losses gives every member its own gradient.
    """

    def __init__(self, members: Sequence[Sequence[nn.Linear]], relu_after: Collection[int]) -> None:
        super().__init__()
        if not members or len({tuple(tuple(layer.weight.shape) for layer in m) for m in members}) != 1:
            raise ValueError("`members` must be a non-empty list of heads whose layers all have the same shapes.")
        depth = len(members[0])
        self.relu_after = frozenset(relu_after)
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([m[i].weight.detach() for m in members]).clone()) for i in range(depth))
        self.biases = nn.ParameterList(
            nn.Parameter(torch.stack([m[i].bias.detach() for m in members]).clone()) for i in range(depth))

    @property
    def size(self) -> int:
        """K, the number of members."""
        return self.weights[0].shape[0]

    def forward(
        self, h: torch.Tensor, masks: Sequence[torch.Tensor] | None = None, weight_scale: torch.Tensor | None = None,
        straight_through: bool = False,
    ) -> torch.Tensor:
        """Member k's layer i uses ``weight_scale[k] · (masks[i][k] ⊙ W_i[k])`` (masks and scale optional).

        ``straight_through``: the masked weights in the forward pass, but the gradient reaches W as if
        unmasked (∂L/∂W = ∂L/∂(M ⊙ W)), the straight-through reading of MaC-Cal's Eq. 9-11."""
        x = h
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            if masks is not None:
                weight = weight - (weight * (1 - masks[i])).detach() if straight_through else weight * masks[i]
            if weight_scale is not None:
                weight = weight * weight_scale.view(-1, 1, 1)
            x = torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))
            if i in self.relu_after:
                x = F.relu(x)
        return x

    @torch.no_grad()
    def copy_member_into(self, k: int, layers: Sequence[nn.Linear]) -> None:
        """Write member ``k``'s weights into ``layers`` (a head of the members' shapes)."""
        for i, layer in enumerate(layers):
            layer.weight.copy_(self.weights[i][k])
            layer.bias.copy_(self.biases[i][k])
