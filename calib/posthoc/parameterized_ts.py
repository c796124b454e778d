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

import contextlib
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch import nn

from calib import progress
from calib._config import check_values, checked_field, integer, number
from calib.posthoc._base import POSTHOC, PostHocCalibrator, check_logits, check_logits_labels
from calib.posthoc._method import PostHocConfig, register_posthoc_method

__all__ = ["ParameterizedTemperatureScaling", "ParameterizedTemperatureScalingConfig"]

TEMPERATURE_CLIP = (1e-12, 1e12)
"""The official clip of |MLP output| to a temperature."""


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """torch limited to one thread inside, its setting restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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

    @threadpool_limits.wrap(limits=1, user_api="blas")  # (1000, C) products: a second BLAS thread only waits
    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> ParameterizedTemperatureScaling:
        """Fit the temperature network on logits z (N, C >= 2) and labels y (N,); returns ``self``.

        Each step's loss and gradient are computed in numpy, by hand (:meth:`_MSESamples.mse_and_temperature_gradient`,
        :class:`_Network`), and the Adam update too (:class:`_Adam`, torch's formula) on the network's parameters as
        one flat array, copied into the torch layers at the end: the same values as autograd's and torch's Adam,
        without the per-step cost of small torch calls (at K = 100 a step costs a few passes over its (B, C) batch)."""
        z, y = check_logits_labels(logits, labels, min_classes=2)
        clipped = self._clip(z)
        top = clipped.topk(min(self.top_k, z.shape[1]), dim=1).values  # fixed inputs: sorted once
        self.num_classes, self.network = z.shape[1], self._build_network(top.shape[1])
        linears = [module for module in self.network if isinstance(module, nn.Linear)]
        flat = np.concatenate([torch.cat([linear.weight, linear.bias[:, None]], dim=1).detach().numpy().ravel()
                               for linear in linears])
        grad = np.zeros_like(flat)
        network = _Network(_augmented_views(flat, linears))
        grad_layers = _augmented_views(grad, linears)
        adam = _Adam(flat.size, self.lr)
        samples = _MSESamples.of(clipped.numpy(), y.numpy(), top.numpy())
        batch_samples = samples.empty(min(self.batch_size, len(y)))  # each batch gathered into these
        buffer = np.empty_like(batch_samples.others)
        self.loss_history = []
        with _one_torch_thread():  # torch's (B, C) product in each step: a second thread only waits
            for step, indices in zip(range(self.steps), self._batches(len(y)), strict=False):
                batch = samples.take(indices, out=batch_samples)
                activations = network.activations(batch.inputs.T)
                output = activations[-1][0]
                magnitude = np.abs(output)
                temperature = np.minimum(np.maximum(magnitude, TEMPERATURE_CLIP[0]), TEMPERATURE_CLIP[1])
                value, temperature_grad = batch.mse_and_temperature_gradient(temperature, buffer[:len(output)])
                if not math.isfinite(value):
                    raise FloatingPointError(f"The PTS loss became {value} at step {step}.")
                # T = clip(|o|): ∂T/∂o = sign(o) inside the clip's range, T = |o| (autograd's rule for abs and clamp)
                temperature_grad *= np.sign(output)
                temperature_grad *= temperature == magnitude
                network.gradients(activations, temperature_grad[None, :], out=grad_layers)
                adam.step(flat, grad)
                self.loss_history.append(value)
        with torch.no_grad():
            for linear, layer in zip(linears, network.layers, strict=True):
                linear.weight.copy_(torch.from_numpy(layer[:, :-1]))
                linear.bias.copy_(torch.from_numpy(layer[:, -1]))
        self.network.requires_grad_(False)
        self._finish_fit()
        return self

    def _batches(self, num_samples: int) -> Iterator[np.ndarray]:
        """The mini-batches' sample indices: a permutation an epoch (seeded by ``seed``), cut into batches."""
        generator = torch.Generator().manual_seed(self.seed)
        for epoch in itertools.count():
            progress.record("stage2", epoch)
            permutation = torch.randperm(num_samples, generator=generator).numpy()
            for start in range(0, num_samples, self.batch_size):
                yield permutation[start:start + self.batch_size]

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """clip(z) / T(z)."""
        self._check_inputs(logits)
        clipped = self._clip(logits)
        return (clipped / self._temperatures_of_clipped(clipped)).to(logits.dtype)


def _augmented_views(flat: np.ndarray, linears: list[nn.Linear]) -> list[np.ndarray]:
    """Each layer's [weight | bias] (out, in + 1) as a view of one flat array, in the layers' order."""
    views, offset = [], 0
    for linear in linears:
        rows, columns = linear.weight.shape
        views.append(flat[offset:offset + rows * (columns + 1)].reshape(rows, columns + 1))
        offset += rows * (columns + 1)
    return views


class _Adam:
    """torch's Adam (β = (0.9, 0.999), ε = 1e-7, no weight decay) on one flat float64 array, in numpy:
    m ← β1 m + (1 − β1) g, v ← β2 v + (1 − β2) g², θ ← θ − lr/(1 − β1^t) · m / (sqrt(v)/sqrt(1 − β2^t) + ε)."""

    def __init__(self, size: int, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-7) -> None:
        self.lr, self.betas, self.eps, self.steps = lr, betas, eps, 0
        self.mean, self.square = np.zeros(size), np.zeros(size)
        self.denominator, self.scratch = np.zeros(size), np.zeros(size)

    def step(self, theta: np.ndarray, grad: np.ndarray) -> None:
        """One update of ``theta`` in place from its gradient."""
        beta1, beta2 = self.betas
        self.steps += 1
        scratch = np.subtract(grad, self.mean, out=self.scratch)
        scratch *= 1.0 - beta1
        self.mean += scratch  # torch's lerp
        self.square *= beta2
        np.multiply(grad, 1.0 - beta2, out=scratch)
        scratch *= grad
        self.square += scratch
        np.sqrt(self.square, out=self.denominator)
        self.denominator /= math.sqrt(1.0 - beta2**self.steps)
        self.denominator += self.eps
        np.multiply(self.mean, self.lr / (1.0 - beta1**self.steps), out=scratch)
        scratch /= self.denominator
        theta -= scratch


class _Network:
    """The MLP of :meth:`ParameterizedTemperatureScaling._build_network` in numpy on batches held column-wise: each
    layer one (out, in + 1) array [W | b], each layer's input a (in + 1, B) array whose last row is ones, so one
    product gives W a + b and one gives [∂L/∂W | ∂L/∂b] (ReLU after every layer but the last)."""

    def __init__(self, layers: list[np.ndarray]) -> None:
        self.layers = layers
        self._hidden: dict[int, list[np.ndarray]] = {}  # by batch size: the hidden layers' outputs, a row of ones below

    def activations(self, inputs: np.ndarray) -> list[np.ndarray]:
        """The inputs (in + 1, B), each hidden layer's output (with its row of ones) and the network's output (1, B);
        the hidden ones are buffers the next call overwrites."""
        batch = inputs.shape[1]
        if batch not in self._hidden:
            self._hidden[batch] = [np.ones((layer.shape[0] + 1, batch)) for layer in self.layers[:-1]]
        activations = [inputs]
        for layer, hidden in zip(self.layers[:-1], self._hidden[batch], strict=True):
            units = hidden[:-1]
            np.matmul(layer, activations[-1], out=units)
            np.maximum(units, 0.0, out=units)
            activations.append(hidden)
        activations.append(self.layers[-1] @ activations[-1])
        return activations

    def gradients(self, activations: list[np.ndarray], output_grad: np.ndarray, out: list[np.ndarray]) -> None:
        """Each layer's [∂L/∂W | ∂L/∂b] into ``out`` (arrays shaped as the layers) by backpropagating ∂L/∂output
        (1, B) through the network whose :meth:`activations` these are."""
        grad = output_grad
        for position in range(len(self.layers) - 1, -1, -1):
            np.matmul(grad, activations[position].T, out=out[position])
            if position > 0:
                grad = self.layers[position][:, :-1].T @ grad
                grad *= activations[position][:-1] > 0


def _network_activations(layers: list[tuple[np.ndarray, np.ndarray]], inputs: np.ndarray) -> list[np.ndarray]:
    """:meth:`_Network.activations` of the MLP of (weight, bias) ``layers`` on inputs (B, in), batch-major: the inputs
    and each hidden layer's output with a last column of ones, and the output (B, 1)."""
    network = _Network([np.concatenate([weight, bias[:, None]], axis=1) for weight, bias in layers])
    return [activation.T for activation in network.activations(np.concatenate(
        [inputs, np.ones((len(inputs), 1))], axis=1).T)]


def _network_gradients(layers: list[tuple[np.ndarray, np.ndarray]], activations: list[np.ndarray],
                       output_grad: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(∂L/∂weight, ∂L/∂bias) of each layer by :meth:`_Network.gradients` from ∂L/∂output (B, 1) and the
    :func:`_network_activations` of the same layers."""
    network = _Network([np.concatenate([weight, bias[:, None]], axis=1) for weight, bias in layers])
    out = [np.empty_like(layer) for layer in network.layers]
    network.gradients([activation.T for activation in activations], output_grad.T, out)
    return [(grad[:, :-1], grad[:, -1]) for grad in out]


@dataclass(frozen=True)
class _MSESamples:
    """What PTS's loss needs of its samples, computed once a fit: the clipped logits shifted by their row maxima,
    d = z − max_k z, without the label's column (N, C − 1: ``others``), the label's d_y (``label_shift``), and the
    network's inputs, the sorted top-k logits with a last column of ones (N, k + 1: ``inputs``)."""

    others: np.ndarray
    label_shift: np.ndarray
    inputs: np.ndarray

    @classmethod
    def of(cls, clipped: np.ndarray, labels: np.ndarray, top: np.ndarray) -> _MSESamples:
        """From the clipped logits (N, C), labels (N,) and the sorted top-k logits (N, k)."""
        shifted = clipped - clipped.max(axis=1, keepdims=True)  # softmax-invariant
        rows = np.arange(len(labels))
        others = np.ones(shifted.shape, dtype=bool)
        others[rows, labels] = False
        return cls(shifted[others].reshape(len(labels), -1), shifted[rows, labels],
                   np.concatenate([top, np.ones((len(labels), 1))], axis=1))

    def empty(self, rows: int) -> _MSESamples:
        """Uninitialised arrays for ``rows`` samples (for :meth:`take`)."""
        return _MSESamples(*(np.empty((rows, *array.shape[1:])) for array in (self.others, self.label_shift,
                                                                             self.inputs)))

    def take(self, indices: np.ndarray, out: _MSESamples) -> _MSESamples:
        """The samples of the (valid) ``indices``, gathered into the first rows of ``out``'s arrays (views)."""
        rows = len(indices)
        taken = _MSESamples(out.others[:rows], out.label_shift[:rows], out.inputs[:rows])
        for source, target in ((self.others, taken.others), (self.label_shift, taken.label_shift),
                               (self.inputs, taken.inputs)):
            np.take(source, indices, axis=0, out=target, mode="clip")  # "clip": "raise" would buffer ``out``
        return taken

    def mse_and_temperature_gradient(self, temperature: np.ndarray,
                                     buffer: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        """L = mean over samples and classes of (softmax(z/T) − onehot(y))² and ∂L/∂T_i at temperatures T (B,) > 0;
        ``buffer``: a scratch array shaped as ``others``.

        From row sums of e_k = exp(d_k/T) alone (p_k = e_k/S, S = Σ_k e_k), so one (B, C − 1) buffer and no
        per-class residual: with S' = Σ_{k≠y} e_k (1 − p_y = S'/S), Q' = Σ_{k≠y} e_k², A' = Σ_{k≠y} d_k e_k and
        R' = Σ_{k≠y} d_k e_k², the row's Σ_k r_k² = Q'/S² + (S'/S)² (r = p − onehot(y)), and with s = d/T
        ∂L/∂T_i = −2/(BC T_i) (Σ_k s_k p_k r_k − (Σ_k s_k p_k)(Σ_k p_k r_k)) where
        Σ s p r = (R'/S² − d_y p_y S'/S)/T, Σ s p = (A'/S + d_y p_y)/T, Σ p r = Q'/S² − p_y S'/S (the softmax's
        invariance to a shift: d for z); sums over k ≠ y, so 1 − p_y has no cancellation when p_y ≈ 1. The row
        sums are matrix-vector products with a vector of ones (BLAS: a sixth of a reduction's time)."""
        batch, others_count = self.others.shape
        num_classes, others, label_shift = others_count + 1, self.others, self.label_shift
        inverse = 1.0 / temperature
        # d/T by torch (one thread: see fit): numpy's product with a broadcast column loops per row, at twice the cost
        exps = np.empty_like(others) if buffer is None else buffer
        torch.mul(torch.from_numpy(others), torch.from_numpy(inverse)[:, None], out=torch.from_numpy(exps))
        np.exp(exps, out=exps)
        label_exp = np.exp(label_shift * inverse)
        ones = np.ones(others_count)
        others_sum = exps @ ones  # S'
        total = others_sum + label_exp  # S
        first = _row_dots(exps, others)  # A'
        exps *= exps
        squares_others = exps @ ones  # Q'
        second = _row_dots(exps, others)  # R'
        label_prob, rest = label_exp / total, others_sum / total  # p_y, 1 − p_y
        total_square, shift_prob = total**2, label_shift * label_prob
        squares = squares_others / total_square
        sum_pr = squares - label_prob * rest
        sum_spr = (second / total_square - shift_prob * rest) * inverse
        sum_sp = (first / total + shift_prob) * inverse
        temperature_grad = -2.0 / (batch * num_classes) * inverse * (sum_spr - sum_sp * sum_pr)
        loss = float((squares + rest**2).sum()) / (batch * num_classes)
        return loss, temperature_grad


def _row_dots(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Σ_k left_ik right_ik (B,) of two (B, C) arrays: a stack of (1, C) × (C, 1) products (BLAS, a third faster
    than numpy's einsum)."""
    return np.matmul(left[:, None, :], right[:, :, None])[:, 0, 0]


def _mse_and_temperature_gradient(shifted: np.ndarray, labels: np.ndarray,
                                  temperature: np.ndarray) -> tuple[float, np.ndarray]:
    """PTS's MSE and ∂L/∂T_i (:meth:`_MSESamples.mse_and_temperature_gradient`) for a batch of clipped logits shifted
    by their row maxima, d = z − max_k z (B, C), labels y (B,) and temperatures T (B,) > 0."""
    return _MSESamples.of(shifted, labels, np.zeros((len(labels), 0))).mse_and_temperature_gradient(temperature)


register_posthoc_method(
    "parameterized_ts", ParameterizedTemperatureScalingConfig, ParameterizedTemperatureScaling,
    "parameterized temperature scaling (per-sample T from an MLP of the top-k logits) fitted on the validation logits",
    label="PTS", order=4,
)
