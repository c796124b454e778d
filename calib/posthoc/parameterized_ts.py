"""Parameterized temperature scaling (Tomani, Cremers, Buettner, ECCV 2022), docs/methods.md §5.

A per-sample temperature from a small MLP of the sorted top-k logits:

    z̃ = clip(z, −100, 100)                         the official code clips the logits (``clip=1e2``)
    T(z) = clip(|MLP(top_k(z̃))|, 1e-12, 1e12)      top_k: the k largest entries of z̃, descending
    calibrated logits = z̃ / T(z)                   T > 0: the argmax is unchanged (the clip can tie
                                                    logits beyond ±100)

MLP: k → 5 → 5 → 1 with ReLU (defaults: top-10 logits, 2 hidden layers of 5 units), Glorot-uniform
weights and zero biases (Keras ``Dense`` defaults) seeded by ``seed``. Fitted by minimising the MSE
between softmax(z̃ / T(z)) and the one-hot labels (Keras ``MeanSquaredError``: mean over samples and
classes) with Adam (lr 5e-5, β = (0.9, 0.999), ε = 1e-7 as Keras) on shuffled mini-batches of 1000
(a new permutation each epoch, the last batch partial) for 100,000 steps, no weight decay, no early
stopping. With C < k classes the network reads all C sorted logits (the official slice ``[:, :k]``).

Official code: tochris/pts-uncertainty ``pts_calibrator.py`` (TensorFlow; its constructor has no
defaults; the lr, batch size and step count are the paper's, as in the SMART authors' benchmark
UsernameOfGit-hub/calibench ``Component/model/pts.py``). Fitting is float64 on the CPU here.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from calib import progress
from calib._config import check_values, checked_field, integer, number
from calib.posthoc._base import POSTHOC, PostHocCalibrator, check_logits, check_logits_labels
from calib.posthoc._method import PostHocConfig, register_posthoc_method

__all__ = ["ParameterizedTemperatureScaling", "ParameterizedTemperatureScalingConfig"]

TEMPERATURE_CLIP = (1e-12, 1e12)
"""The official clip of |MLP output| to a temperature."""


@dataclass(frozen=True, kw_only=True)
class ParameterizedTemperatureScalingConfig(PostHocConfig):
    """PTS as a method, fitted on the cached validation logits (docs/methods.md §5; the paper's defaults).

    Fixed, not configurable here: MSE loss, Adam β = (0.9, 0.999), ε = 1e-7, no weight decay, logits
    clipped to ±100, T clipped to [1e-12, 1e12] (see :class:`ParameterizedTemperatureScaling`). The
    network is initialised, and the batches ordered, from the trial seed.

    Attributes:
        top_k: sorted logits the network reads, >= 1 (10).
        hidden_size: units per hidden layer, >= 1 (5).
        num_hidden_layers: hidden layers, >= 0 (2).
        lr: Adam learning rate, > 0 (5e-5).
        steps: Adam steps, >= 1 (100,000).
        batch_size: mini-batch size, >= 1 (1000).
        calibration_size, calibration_draw: the calibration set (:class:`~calib.posthoc.PostHocConfig`).
    """

    top_k: int = checked_field(10, integer(at_least=1))
    hidden_size: int = checked_field(5, integer(at_least=1))
    num_hidden_layers: int = checked_field(2, integer(at_least=0))
    lr: float = checked_field(5e-5, number(above=0))
    steps: int = checked_field(100_000, integer(at_least=1))
    batch_size: int = checked_field(1000, integer(at_least=1))


@POSTHOC.register("parameterized_ts")
class ParameterizedTemperatureScaling(PostHocCalibrator):
    """Per-sample temperature T(z) = |MLP(top-k sorted logits)| (PTS), fitted by MSE with Adam.

    Args:
        top_k: the network reads the k largest (clipped) logits, sorted descending (10).
        hidden_size: units per hidden layer (5).
        num_hidden_layers: hidden ReLU layers, >= 0 (2; 0: a linear map of the top-k logits).
        lr: Adam learning rate (5e-5).
        steps: Adam steps (mini-batches) in all (100,000).
        batch_size: samples per mini-batch (1000; the whole set if it is smaller).
        logit_clip: logits are clipped to [−logit_clip, logit_clip] before everything (100).
        seed: seeds the network's initialisation and the batch order.

    After :meth:`fit`: ``network`` (the MLP, float64, frozen), ``num_classes``, ``loss_history`` (each
    step's batch loss).
    """

    def __init__(
        self,
        *,
        top_k: int = ParameterizedTemperatureScalingConfig.top_k,
        hidden_size: int = ParameterizedTemperatureScalingConfig.hidden_size,
        num_hidden_layers: int = ParameterizedTemperatureScalingConfig.num_hidden_layers,
        lr: float = ParameterizedTemperatureScalingConfig.lr,
        steps: int = ParameterizedTemperatureScalingConfig.steps,
        batch_size: int = ParameterizedTemperatureScalingConfig.batch_size,
        logit_clip: float = 100.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_values(ParameterizedTemperatureScalingConfig, locals())
        number(above=0).check("logit_clip", logit_clip)
        self.top_k, self.hidden_size, self.num_hidden_layers = top_k, hidden_size, num_hidden_layers
        self.lr, self.steps, self.batch_size, self.logit_clip, self.seed = lr, steps, batch_size, logit_clip, seed
        self.network: nn.Sequential | None = None
        self.num_classes = 0
        self.loss_history: list[float] = []

    def _build_network(self, num_inputs: int) -> nn.Sequential:
        """k → H → … → H → 1 with ReLU; Glorot-uniform weights, zero biases, seeded by ``seed``."""
        generator = torch.Generator().manual_seed(self.seed)
        widths = [num_inputs] + [self.hidden_size] * self.num_hidden_layers + [1]
        layers: list[nn.Module] = []
        for width_in, width_out in itertools.pairwise(widths):
            linear = nn.Linear(width_in, width_out, dtype=torch.float64)
            nn.init.xavier_uniform_(linear.weight, generator=generator)
            nn.init.zeros_(linear.bias)
            layers += [linear, nn.ReLU()]
        return nn.Sequential(*layers[:-1])

    def _clip(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.to(torch.float64).clamp(-self.logit_clip, self.logit_clip)

    def _temperatures_of_clipped(self, clipped: torch.Tensor) -> torch.Tensor:
        top = clipped.topk(min(self.top_k, clipped.shape[1]), dim=1).values
        return self.network(top).abs().clamp(*TEMPERATURE_CLIP)

    def _check_inputs(self, logits: torch.Tensor) -> None:
        self.check_fitted()
        check_logits(logits, min_classes=2, fitted_classes=self.num_classes)

    def temperatures(self, logits: torch.Tensor) -> torch.Tensor:
        """T(z_i) for each row of z (N, C); shape (N,), float64."""
        self._check_inputs(logits)
        return self._temperatures_of_clipped(self._clip(logits)).squeeze(1)

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> ParameterizedTemperatureScaling:
        """Fit the temperature network on logits z (N, C >= 2) and labels y (N,); returns ``self``.

        Each step's loss and gradient are computed in numpy, by hand (:func:`_mse_and_temperature_gradient`,
        :func:`_network_gradients`): the same values as autograd's, at a third of the time of 100,000 steps of
        autograd's small graphs; the update is torch's Adam (fused)."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        clipped = self._clip(z)
        top = clipped.topk(min(self.top_k, z.shape[1]), dim=1).values  # fixed inputs: sorted once
        self.num_classes, self.network = z.shape[1], self._build_network(top.shape[1])
        optimizer = torch.optim.Adam(self.network.parameters(), lr=self.lr, betas=(0.9, 0.999), eps=1e-7, fused=True)
        linears = [module for module in self.network if isinstance(module, nn.Linear)]
        clipped_np, top_np, labels_np = clipped.numpy(), top.numpy(), y.numpy()
        row_max = clipped_np.max(axis=1)
        order_generator = torch.Generator().manual_seed(self.seed)
        self.loss_history = []
        num_samples, step = z.shape[0], 0
        for epoch in itertools.count():
            progress.record("stage2", epoch)
            permutation = torch.randperm(num_samples, generator=order_generator).numpy()
            for start in range(0, num_samples, self.batch_size):
                batch = permutation[start:start + self.batch_size]
                activations = _network_activations(linears, top_np[batch])
                output = activations[-1][:, 0]
                temperature = np.clip(np.abs(output), *TEMPERATURE_CLIP)
                value, temperature_grad = _mse_and_temperature_gradient(clipped_np[batch], row_max[batch],
                                                                        labels_np[batch], temperature)
                if not math.isfinite(value):
                    raise FloatingPointError(f"The PTS loss became {value} at step {step}.")
                # T = clip(|o|): ∂T/∂o = sign(o) inside the clip's range (autograd's rule for abs and clamp)
                inside = (np.abs(output) >= TEMPERATURE_CLIP[0]) & (np.abs(output) <= TEMPERATURE_CLIP[1])
                output_grad = temperature_grad * np.sign(output) * inside
                for linear, (weight_grad, bias_grad) in zip(
                        linears, _network_gradients(linears, activations, output_grad[:, None]), strict=True):
                    linear.weight.grad, linear.bias.grad = torch.from_numpy(weight_grad), torch.from_numpy(bias_grad)
                optimizer.step()
                self.loss_history.append(value)
                step += 1
                if step >= self.steps:
                    break
            if step >= self.steps:
                break
        self.network.requires_grad_(False)
        for linear in linears:
            linear.weight.grad = linear.bias.grad = None
        self._finish_fit()
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """clip(z) / T(z)."""
        self._check_inputs(logits)
        clipped = self._clip(logits)
        return (clipped / self._temperatures_of_clipped(clipped)).to(logits.dtype)


def _network_activations(linears: list[nn.Linear], inputs: np.ndarray) -> list[np.ndarray]:
    """The inputs and each layer's output of the MLP (ReLU after every layer but the last), numpy float64."""
    activations = [inputs]
    for position, linear in enumerate(linears):
        hidden = activations[-1] @ linear.weight.detach().numpy().T + linear.bias.detach().numpy()
        activations.append(hidden if position == len(linears) - 1 else np.maximum(hidden, 0.0))
    return activations


def _network_gradients(linears: list[nn.Linear], activations: list[np.ndarray],
                       output_grad: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(∂L/∂weight, ∂L/∂bias) of each layer by backpropagating ∂L/∂output (B, 1) through the MLP."""
    grads: list[tuple[np.ndarray, np.ndarray]] = []
    grad = output_grad
    for position in range(len(linears) - 1, -1, -1):
        grads.append((grad.T @ activations[position], grad.sum(axis=0)))
        if position > 0:
            grad = (grad @ linears[position].weight.detach().numpy()) * (activations[position] > 0)
    return grads[::-1]


def _mse_and_temperature_gradient(logits: np.ndarray, row_max: np.ndarray, labels: np.ndarray,
                                  temperature: np.ndarray) -> tuple[float, np.ndarray]:
    """L = mean over samples and classes of (softmax(z/T) − onehot(y))² and ∂L/∂T_i for a batch (B, C) of clipped
    logits z with their row maxima, labels y (B,) and temperatures T (B,) > 0.

    With s = z/T, p = softmax(s), r = p − onehot(y): ∂L/∂s_ik = (2/(BC)) p_ik (r_ik − Σ_j p_ij r_ij) and
    ∂s_ik/∂T_i = −s_ik/T_i, so ∂L/∂T_i = −2/(BC T_i) (Σ_k s_ik p_ik r_ik − (Σ_k s_ik p_ik)(Σ_k p_ik r_ik)); two
    (B, C) buffers, in place."""
    batch, num_classes = logits.shape
    rows = np.arange(batch)
    weighted = logits / temperature[:, None]  # s, then s ⊙ p
    residual = weighted - (row_max / temperature)[:, None]  # max_k z_ik/T_i = (max_k z_ik)/T_i as T_i > 0
    np.exp(residual, out=residual)
    residual /= residual.sum(axis=1)[:, None]  # p
    weighted *= residual
    residual[rows, labels] -= 1.0  # r
    squares = np.einsum("ij,ij->i", residual, residual)  # Σ_k r_ik², and Σ_k p_ik r_ik = Σ_k r_ik² + r_iy
    temperature_grad = (-2.0 / (batch * num_classes) / temperature
                        * (np.einsum("ij,ij->i", weighted, residual)
                           - weighted.sum(axis=1) * (squares + residual[rows, labels])))
    loss = float(squares.sum()) / (batch * num_classes)
    return loss, temperature_grad


register_posthoc_method(
    "parameterized_ts", ParameterizedTemperatureScalingConfig, ParameterizedTemperatureScaling,
    "parameterized temperature scaling (per-sample T from an MLP of the top-k logits) fitted on the validation logits",
    label="PTS", order=4,
)
