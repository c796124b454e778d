"""Parameterized temperature scaling (docs/methods.md §5): the network, loss and Adam step by hand, the argmax."""

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from posthoc_cases import overconfident_logits
from torch import nn

from calib import progress
from calib._config import ConfigError, from_dict
from calib.posthoc import POSTHOC
from calib.posthoc import parameterized_ts as pts_module
from calib.posthoc.parameterized_ts import ParameterizedTemperatureScaling, ParameterizedTemperatureScalingConfig

make_data = functools.partial(overconfident_logits, scale=4.0, temperature=2.5)

pytestmark = pytest.mark.usefixtures("one_thread")


def layers(pts):
    return [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in pts.network if isinstance(m, nn.Linear)]


def forward_np(params, z, top_k=10, clip=100.0):
    """clip(z) / clip(|MLP(top-k sorted clip(z))|, 1e-12, 1e12) in numpy, ReLU between the layers."""
    clipped = np.clip(z, -clip, clip)
    h = -np.sort(-clipped, axis=1)[:, :top_k]
    for i, (w, b) in enumerate(params):
        h = h @ w.T + b
        if i < len(params) - 1:
            h = np.maximum(h, 0)
    return clipped / np.clip(np.abs(h), 1e-12, 1e12)


def mse_np(params, z, labels, top_k=10):
    scaled = forward_np(params, z, top_k)
    p = np.exp(scaled - scaled.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return ((p - np.eye(z.shape[1])[labels]) ** 2).mean()


class TestParameterizedTemperatureScaling:
    def test_network_and_initialisation(self):
        z, labels = make_data(40, 12)
        pts = ParameterizedTemperatureScaling(steps=1, lr=1e-12).fit(z, labels)  # ≈ the initial network
        params = layers(pts)
        assert [w.shape for w, _ in params] == [(5, 10), (5, 5), (1, 5)]  # top-10 → 5 → 5 → 1
        assert sum(w.size + b.size for w, b in params) == 91
        assert [type(m).__name__ for m in pts.network] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
        for w, b in params:  # Glorot uniform, zero biases (Keras Dense defaults)
            assert np.abs(w).max() <= np.sqrt(6 / sum(w.shape)) + 1e-9 and np.abs(b).max() < 1e-9
        same = layers(ParameterizedTemperatureScaling(steps=1, lr=1e-12).fit(z, labels))
        other = layers(ParameterizedTemperatureScaling(steps=1, lr=1e-12, seed=1).fit(z, labels))
        assert all(np.array_equal(a[0], b[0]) for a, b in zip(params, same, strict=True))
        assert not np.allclose(params[0][0], other[0][0])

    def test_forward_by_hand(self):
        z, labels = make_data(60, 12, seed=1)
        pts = ParameterizedTemperatureScaling(steps=30, lr=1e-2, batch_size=16).fit(z, labels)
        test = make_data(20, 12, seed=2)[0]
        test[0, 3], test[1, 5] = 150.0, -250.0  # clipped to ±100
        expected = forward_np(layers(pts), test.numpy())
        np.testing.assert_allclose(pts(test).numpy(), expected, rtol=1e-12)
        np.testing.assert_allclose(pts.temperatures(test).numpy(), test.clamp(-100, 100)[:, 0] / expected[:, 0])

    def test_first_loss_and_adam_step_by_hand(self):
        # Full batch, one step: the loss is the MSE of the initial network; Adam's first step moves each
        # parameter by −lr·g/(|g| + ε) with ε = 1e-7 (Keras), g the gradient (central differences here).
        z, labels = make_data(64, 6, seed=3)
        lr = 1e-3
        before = layers(ParameterizedTemperatureScaling(steps=1, lr=1e-300).fit(z, labels))
        pts = ParameterizedTemperatureScaling(steps=1, lr=lr, batch_size=1000).fit(z, labels)
        zn, yn, checked = z.numpy(), labels.numpy(), 0
        assert pts.loss_history[0] == pytest.approx(mse_np(before, zn, yn, top_k=6), rel=1e-12)

        def loss_at(layer, which, position, delta):
            params = [[w.copy(), b.copy()] for w, b in before]
            params[layer][which][position] += delta
            return mse_np(params, zn, yn, top_k=6)

        for layer, ((w0, b0), (w1, b1)) in enumerate(zip(before, layers(pts), strict=True)):
            for initial, fitted, which in ((w0, w1, 0), (b0, b1, 1)):
                for position in np.ndindex(initial.shape):
                    g = (loss_at(layer, which, position, 1e-6) - loss_at(layer, which, position, -1e-6)) / 2e-6
                    if abs(g) > 1e-5:  # the sign is robust to the difference error
                        checked += 1
                        assert fitted[position] - initial[position] == pytest.approx(-lr * g / (abs(g) + 1e-7),
                                                                                     rel=1e-3)
        assert checked > 30

    def test_the_hand_written_gradients_are_autograds(self):
        # The fit's numpy loss and gradients (issue 45: a third of autograd's time a step) against torch autograd of
        # the MSE of softmax(z / clip(|MLP(top_k)|)) on logits up to the ±100 clip, for 0, 1 and 2 hidden layers.
        generator = torch.Generator().manual_seed(13)
        logits = (60 * torch.randn(50, 12, generator=generator, dtype=torch.float64)).clamp(-100, 100)
        labels = torch.randint(0, 12, (50,), generator=generator)
        for hidden_layers in (0, 1, 2):
            network = ParameterizedTemperatureScaling(num_hidden_layers=hidden_layers)._build_network(10)
            top = logits.topk(10, dim=1).values
            temperature = network(top).abs().clamp(1e-12, 1e12)
            loss = ((logits / temperature).softmax(1) - torch.nn.functional.one_hot(labels, 12)).square().mean()
            loss.backward()
            linears = [m for m in network if isinstance(m, nn.Linear)]
            layer_arrays = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in linears]
            activations = pts_module._network_activations(layer_arrays, top.numpy())
            np.testing.assert_allclose(activations[-1], network(top).detach().numpy(), rtol=1e-13)
            value, temperature_grad = pts_module._mse_and_temperature_gradient(
                logits.numpy() - logits.numpy().max(axis=1, keepdims=True), labels.numpy(),
                temperature.detach().numpy()[:, 0])
            assert value == pytest.approx(loss.item(), rel=1e-13)
            output = activations[-1]
            grads = pts_module._network_gradients(layer_arrays, activations,
                                                  temperature_grad[:, None] * np.sign(output))
            for linear, (weight_grad, bias_grad) in zip(linears, grads, strict=True):
                np.testing.assert_allclose(weight_grad, linear.weight.grad.numpy(), rtol=1e-10, atol=1e-18)
                np.testing.assert_allclose(bias_grad, linear.bias.grad.numpy(), rtol=1e-10, atol=1e-18)

    def test_the_fit_follows_the_autograd_training_loop(self):
        # The training loop restated with autograd and torch's (unfused) Adam: the same batches, losses and network.
        z, labels = make_data(60, 7, seed=14)
        pts = ParameterizedTemperatureScaling(steps=40, lr=1e-2, batch_size=16, seed=2).fit(z, labels)
        network = ParameterizedTemperatureScaling(seed=2)._build_network(7)
        optimizer = torch.optim.Adam(network.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-7)
        order, losses, onehot = torch.Generator().manual_seed(2), [], torch.nn.functional.one_hot(labels, 7).double()
        while len(losses) < 40:
            permutation = torch.randperm(60, generator=order)
            for batch in permutation.split(16):
                temperature = network(z[batch].topk(7, dim=1).values).abs().clamp(1e-12, 1e12)
                loss = ((z[batch] / temperature).softmax(1) - onehot[batch]).square().mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                if len(losses) == 40:
                    break
        np.testing.assert_allclose(pts.loss_history, losses, rtol=1e-11)
        for (weight, bias), (expected_weight, expected_bias) in zip(layers(pts), layers(SimpleNamespace(
                network=network)), strict=True):
            np.testing.assert_allclose(weight, expected_weight, rtol=1e-9, atol=1e-13)
            np.testing.assert_allclose(bias, expected_bias, rtol=1e-9, atol=1e-13)

    def test_training_improves_the_mse(self):
        z, labels = make_data(600, 5, seed=4)
        pts = ParameterizedTemperatureScaling(steps=600, lr=5e-3, batch_size=100).fit(z[:300], labels[:300])
        onehot = torch.nn.functional.one_hot(labels[300:], 5).double()
        calibrated = (pts.probs(z[300:]) - onehot).square().mean()
        uncalibrated = (z[300:].softmax(1) - onehot).square().mean()
        assert calibrated < uncalibrated
        assert 1.5 < pts.temperatures(z).median() < 4.0  # labels were drawn at T = 2.5

    def test_steps_epochs_and_partial_batches(self):
        z, labels = make_data(25, 4, seed=5)
        pts = ParameterizedTemperatureScaling(steps=7, batch_size=10).fit(z, labels)
        assert len(pts.loss_history) == 7 and progress.last() == ("stage2", 2)  # 3 batches (10, 10, 5) an epoch

    def test_deterministic(self):
        z, labels = make_data(100, 5, seed=6)
        a = ParameterizedTemperatureScaling(steps=50, lr=1e-3, batch_size=32, seed=3).fit(z, labels)
        b = ParameterizedTemperatureScaling(steps=50, lr=1e-3, batch_size=32, seed=3).fit(z, labels)
        c = ParameterizedTemperatureScaling(steps=50, lr=1e-3, batch_size=32, seed=4).fit(z, labels)
        assert torch.equal(a(z), b(z)) and not torch.equal(a(z), c(z))

    def test_fewer_classes_than_top_k(self):
        z, labels = make_data(80, 3, seed=7)
        pts = ParameterizedTemperatureScaling(steps=20).fit(z, labels)
        assert pts.network[0].in_features == 3
        np.testing.assert_allclose(pts(z).numpy(), forward_np(layers(pts), z.numpy(), top_k=10), rtol=1e-12)

    def test_argmax_unchanged(self):
        z, labels = make_data(400, 8, seed=8)
        pts = ParameterizedTemperatureScaling(steps=100, lr=1e-3, batch_size=64).fit(z[:200], labels[:200])
        assert torch.equal(pts(z).argmax(1), z.argmax(1)) and (pts.temperatures(z) > 0).all()

    def test_bad_parameters(self):
        for name, value in (("top_k", 0), ("hidden_size", 0), ("steps", 0), ("batch_size", 0)):
            with pytest.raises(ValueError, match=rf"`{name}` must be an integer >= 1, got {name}=0"):
                ParameterizedTemperatureScaling(**{name: value})
        with pytest.raises(ValueError, match=r"num_hidden_layers=-1"):
            ParameterizedTemperatureScaling(num_hidden_layers=-1)
        with pytest.raises(ValueError, match=r"lr=0"):
            ParameterizedTemperatureScaling(lr=0)
        with pytest.raises(ConfigError, match=r"`top_k` must be an integer >= 1, got top_k=0"):
            from_dict(ParameterizedTemperatureScalingConfig, {"top_k": 0})
        with pytest.raises(ConfigError, match=r"`lr` must be a finite number > 0, got lr=-0.1"):
            from_dict(ParameterizedTemperatureScalingConfig, {"lr": -0.1})
        with pytest.raises(ConfigError, match=r"`steps` must be an integer"):
            from_dict(ParameterizedTemperatureScalingConfig, {"steps": 1.5})
        config = from_dict(ParameterizedTemperatureScalingConfig, {})
        assert (config.top_k, config.hidden_size, config.num_hidden_layers, config.lr, config.steps,
                config.batch_size) == (10, 5, 2, 5e-5, 100_000, 1000)
        with pytest.raises(RuntimeError, match="not fitted"):
            ParameterizedTemperatureScaling()(torch.zeros(2, 3))
        z, labels = make_data(30, 4)
        with pytest.raises(ValueError, match=r"`logits` must have the 4 classes of the fit, got 3"):
            ParameterizedTemperatureScaling(steps=2).fit(z, labels)(torch.zeros(2, 3))

    def test_registered(self):
        assert isinstance(POSTHOC.create("parameterized_ts", steps=5), ParameterizedTemperatureScaling)


class TestEdgeCases:
    def check_outputs(self, pts, z):
        probs = pts.probs(z)
        assert torch.isfinite(pts(z)).all() and torch.isfinite(probs).all()
        torch.testing.assert_close(probs.sum(1), torch.ones(len(z), dtype=torch.float64))
        assert torch.equal(pts(z).argmax(1), z.argmax(1))
        return probs

    def fit(self, z, labels):
        return ParameterizedTemperatureScaling(steps=60, lr=1e-3, batch_size=32).fit(z, labels)

    def test_absent_class(self):
        z, labels = make_data(200, 5, seed=9)
        keep = labels != 4
        self.check_outputs(self.fit(z[keep], labels[keep]), z[keep])

    def test_ties_in_confidence(self):
        z, labels = make_data(100, 4, seed=10)
        z[:, 1] = z[:, 0]
        z[50:] = z[:50]
        pts = self.fit(z, labels)
        probs = self.check_outputs(pts, z)
        assert torch.equal(probs[:, 0], probs[:, 1]) and torch.equal(probs[50:], probs[:50])

    def test_fifty_samples_ten_classes(self):
        z, labels = make_data(50, 10, seed=11)
        self.check_outputs(self.fit(z, labels), z)

    def test_constant_column(self):
        z, labels = make_data(200, 4, seed=12)
        z[:, 2] = 1.0
        self.check_outputs(self.fit(z, labels), z)
