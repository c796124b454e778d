"""Temperature scaling (docs/methods.md §5.1): recovers a known T, never changes the argmax, keeps T > 0."""

import contextlib
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from calib._config import ConfigError, from_dict
from calib.methods import METHODS
from calib.metrics import expected_calibration_error, softmax64
from calib.posthoc import (
    POSTHOC,
    TEMPERATURE_GRID,
    PostHocCalibrator,
    PostHocPredictor,
    TemperatureScaling,
    TemperatureScalingConfig,
)
from calib.posthoc import _lbfgs as lbfgs_module
from calib.posthoc.temperature_scaling import _TemperatureNLL

TRUE_TEMPERATURE = 2.5


@pytest.fixture(scope="module")
def tempered_data():
    """Logits z and labels drawn from softmax(z / T*), T* = 2.5: the NLL-optimal temperature is ≈ T*."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20000, 10, generator=g) * 4
    labels = torch.multinomial((logits.double() / TRUE_TEMPERATURE).softmax(1), 1, generator=g).squeeze(1)
    return logits, labels


@pytest.fixture(scope="module")
def base_data():
    """z = 2.5·N(0, 1), 5,000 × 10, float64, and labels drawn from softmax(z): logits z·T* have optimum T ≈ T*."""
    g = torch.Generator().manual_seed(0)
    z = 2.5 * torch.randn(5000, 10, generator=g, dtype=torch.float64)
    labels = torch.multinomial(z.softmax(1), 1, generator=g).squeeze(1)
    return z, labels


def nll(logits, labels, temperature):
    """NLL(T) in float64 numpy, independent of the torch code under test."""
    log_p = log_softmax(logits.double().numpy() / temperature, axis=1)
    return float(-log_p[np.arange(labels.shape[0]), labels.numpy()].mean())


def scipy_temperature(logits, labels):
    """The NLL-optimal T by bounded Brent on log T ∈ [log 0.01, log 100], xatol 1e-10."""
    result = minimize_scalar(lambda log_t: nll(logits, labels, math.exp(log_t)), method="bounded",
                             bounds=(math.log(0.01), math.log(100.0)), options={"xatol": 1e-10})  # fmt: skip
    return math.exp(result.x)


class TestTemperatureScaling:
    def test_main(self, tempered_data):
        logits, labels = tempered_data
        ts = TemperatureScaling().fit(logits, labels)
        assert isinstance(ts, PostHocCalibrator) and ts.is_fitted
        assert ts.temperature.item() == pytest.approx(TRUE_TEMPERATURE, abs=0.15)
        torch.testing.assert_close(ts(logits), logits / ts.temperature.item())
        assert torch.equal(ts(logits).argmax(1), logits.argmax(1))  # accuracy unchanged

    def test_grid_ece_picks_the_grid_temperature_with_the_lowest_ece(self, tempered_data):
        logits, labels = tempered_data
        temperature = TemperatureScaling("ece", "grid").fit(logits, labels).temperature.item()
        assert temperature in TEMPERATURE_GRID and round(temperature * 10) == pytest.approx(temperature * 10)
        eces = {t: expected_calibration_error(softmax64(logits / t), labels) for t in TEMPERATURE_GRID}
        assert eces[temperature] == min(eces.values())
        assert temperature == pytest.approx(TRUE_TEMPERATURE, abs=0.3)

    def test_grid_nll(self, tempered_data):
        logits, labels = tempered_data
        temperature = TemperatureScaling("nll", "grid").fit(logits, labels).temperature.item()
        assert temperature in TEMPERATURE_GRID and temperature == pytest.approx(TRUE_TEMPERATURE, abs=0.15)

    def test_grid(self):
        assert len(TEMPERATURE_GRID) == 100 and TEMPERATURE_GRID[0] == 0.1 and TEMPERATURE_GRID[-1] == 10.0
        assert TEMPERATURE_GRID[24] == 2.5

    def test_gpleiss_lbfgs_without_line_search_stops_short(self, tempered_data):
        logits, labels = tempered_data
        ts = TemperatureScaling(lbfgs_line_search=False).fit(logits, labels)
        assert 1.5 < ts.temperature.item() < TRUE_TEMPERATURE - 0.3
        assert ts.fit_fallback is False and abs(ts.grad_log_temperature) > 1e-3  # stopped short, as gpleiss

    @pytest.mark.parametrize("true_temperature", [0.3, 0.5, 0.75, 1.0, 2.0, 5.0])
    def test_default_lbfgs_converges_to_the_scipy_optimum(self, base_data, true_temperature):
        # The old default (lr 0.01, strong Wolfe, one step of 50 iterations) ran out of evaluations
        # below T = 1.5: T = 0.5099 for T* = 0.5 (scipy 0.5022), 0.7602 for T* = 0.75 (scipy 0.7532).
        z, labels = base_data
        logits = z * true_temperature
        ts = TemperatureScaling().fit(logits, labels)
        expected = scipy_temperature(logits, labels)
        assert expected == pytest.approx(true_temperature, rel=0.03)
        assert abs(ts.temperature.item() - expected) / expected < 1e-5
        assert abs(ts.grad_log_temperature) < 1e-6 and ts.fit_fallback is False
        assert nll(logits, labels, ts.temperature.item()) <= nll(logits, labels, expected) + 1e-12

    def test_default_lbfgs_repeats_step_until_converged(self, base_data):
        z, labels = base_data
        one_iteration = TemperatureScaling(max_iter=1).fit(z * 0.3, labels)  # one LBFGS iteration per step
        assert abs(one_iteration.grad_log_temperature) < 1e-6
        expected = scipy_temperature(z * 0.3, labels)
        assert abs(one_iteration.temperature.item() - expected) / expected < 1e-5

    def test_default_lbfgs_raises_when_not_converged(self, base_data, monkeypatch):
        z, labels = base_data
        monkeypatch.setattr(lbfgs_module, "MAX_LBFGS_STEPS", 1)
        with pytest.raises(RuntimeError, match=r"did not converge: \|dNLL/d log T\|=\S+ at T=\S+ after 1 LBFGS steps "
                                               r"of up to 1 iterations; it must be < 1e-06"):
            TemperatureScaling(max_iter=1).fit(z * 0.3, labels)

    def test_gpleiss_runaway_falls_back_to_the_default_fit(self, base_data):
        # logits = 0.5·z: gpleiss's plain LBFGS (lr 0.01, 50 iterations) from T = 1.5 runs away to
        # T = 9.3e-4 with NLL 296.6 (start 1.506); the fit must never end worse than its start.
        z, labels = base_data
        logits = 0.5 * z
        message = (r"The gpleiss LBFGS fit \(no line search, lr 0.01, max_iter 50\) ran away to T=\S+ with NLL \S+, "
                   r"worse than NLL 1.506\d* at the start T=1.5; fell back to the converged strong-Wolfe fit, "
                   r"T=0.50215\d* with NLL 1.118\d*\.")
        with pytest.warns(RuntimeWarning, match=message):
            ts = TemperatureScaling(lbfgs_line_search=False).fit(logits, labels)
        expected = scipy_temperature(logits, labels)
        assert ts.fit_fallback is True and abs(ts.grad_log_temperature) < 1e-6
        assert abs(ts.temperature.item() - expected) / expected < 1e-5
        assert nll(logits, labels, ts.temperature.item()) < nll(logits, labels, 1.5)
        assert ts.fit(z * 2.0, labels).fit_fallback is False  # a refit without a runaway resets the flag

    def test_temperature_stays_positive(self):
        # Perfectly separated, always-correct logits: the NLL keeps falling as T → 0.
        logits = torch.tensor([[3.0, 0.0], [0.0, 3.0]]).repeat(50, 1)
        labels = torch.tensor([0, 1]).repeat(50)
        for objective, optimizer in (("nll", "lbfgs"), ("nll", "grid"), ("ece", "grid")):
            ts = TemperatureScaling(objective, optimizer).fit(logits, labels)
            assert 0 < ts.temperature.item() < 1.5
            assert torch.equal(ts(logits).argmax(1), logits.argmax(1))

    def test_probs_are_float64_on_cpu(self, tempered_data):
        logits, labels = tempered_data
        ts = TemperatureScaling("nll", "grid").fit(logits[:500], labels[:500])
        assert ts.fit_fallback is False and math.isfinite(ts.grad_log_temperature)
        probs = PostHocPredictor(ts)(torch.empty(500, 0), logits[:500])
        assert probs.dtype == torch.float64 and probs.device.type == "cpu"
        torch.testing.assert_close(probs, (logits[:500].double() / ts.temperature).softmax(1))

    def test_errors(self):
        with pytest.raises(ValueError, match=r"`objective`='ece' needs `optimizer`='grid'.*got optimizer='lbfgs'"):
            TemperatureScaling("ece", "lbfgs")
        with pytest.raises(ValueError, match=r"`objective` must be one of 'nll', 'ece', got objective='brier'"):
            TemperatureScaling("brier")
        with pytest.raises(ValueError, match=r"`optimizer` must be one of 'lbfgs', 'brent', 'grid', got "
                                             r"optimizer='adam'"):
            TemperatureScaling("nll", "adam")
        with pytest.raises(ValueError, match=r"`init_temperature` must be a finite number > 0, got init_temperature=0"):
            TemperatureScaling(init_temperature=0)
        with pytest.raises(RuntimeError, match=r"TemperatureScaling is not fitted: call fit\(logits, labels\) first"):
            TemperatureScaling()(torch.zeros(2, 3))
        ts = TemperatureScaling()
        with pytest.raises(ValueError, match=r"`labels` must have shape \(N,\) = \(2,\) with N >= 1, got \(3,\)"):
            ts.fit(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))
        with pytest.raises(ValueError, match=r"`labels` must be in \[0, 3\), got values in \[0, 3\]"):
            ts.fit(torch.zeros(2, 3), torch.tensor([0, 3]))
        with pytest.raises(TypeError, match=r"`labels` must be an integer torch.Tensor"):
            ts.fit(torch.zeros(2, 3), torch.zeros(2))
        with pytest.raises(ValueError, match=r"`logits` must be finite"):
            ts.fit(torch.tensor([[0.0, float("nan")]]), torch.tensor([0]))
        with pytest.raises(ValueError, match=r"`logits` must have shape \(N, C\) with C >= 2, got shape \(4,\)"):
            ts.fit(torch.zeros(4), torch.zeros(4, dtype=torch.long))
        # one logit column is refused up front, as by every other calibrator (it used to fail later, on the labels)
        with pytest.raises(ValueError, match=r"`logits` must have shape \(N, C\) with C >= 2, got shape \(4, 1\)"):
            ts.fit(torch.randn(4, 1), torch.zeros(4, dtype=torch.long))


class TestTemperatureScalingConfig:
    def test_main(self):
        params = TemperatureScalingConfig()
        assert (params.objective, params.optimizer, params.lbfgs_line_search) == ("nll", "lbfgs", True)
        assert from_dict(TemperatureScalingConfig, {"objective": "ece", "optimizer": "grid"}).optimizer == "grid"
        assert METHODS.get("temperature_scaling").config is TemperatureScalingConfig
        assert POSTHOC.get("temperature_scaling") is TemperatureScaling

    @pytest.mark.parametrize(("kwargs", "message"), [
        ({"objective": "ece"}, r"`objective`='ece' needs `optimizer`='grid'.*got optimizer='lbfgs'"),
        ({"optimizer": "grid", "lbfgs_line_search": False}, r"`lbfgs_line_search`=false applies to"),
        ({"optimizer": "brent", "lbfgs_line_search": False}, r"applies to `optimizer`='lbfgs' only, got optimizer="
                                                             r"'brent'"),
        ({"optimizer": "adam"}, r"`optimizer` must be one of 'lbfgs', 'brent', 'grid'"),
        ({"objective": "acc"}, r"`objective` must be one of 'nll', 'ece', got objective='acc'"),
    ])
    def test_errors(self, kwargs, message):
        with pytest.raises(ConfigError, match=message):
            TemperatureScalingConfig(**kwargs)


@pytest.mark.parametrize(("scale", "held_at"), [(3.0, None), (0.3, None), (30.0, 20.0)])
def test_the_bounded_search_finds_the_lbfgs_optimum_without_a_torch_optimizer(scale, held_at):
    # logits with the label's class raised by 1.5, times `scale`: optima near 2.2 and 0.21, and beyond 20 for 30
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 10, 400)
    z = rng.normal(size=(400, 10))
    z[np.arange(400), labels] += 1.5
    z, labels = torch.from_numpy(z * scale), torch.from_numpy(labels)
    with pytest.warns() if held_at else contextlib.nullcontext():
        lbfgs = TemperatureScaling().fit(z, labels)
    with pytest.warns() if held_at else contextlib.nullcontext():
        brent = TemperatureScaling(optimizer="brent").fit(z, labels)
    assert brent.temperature.item() == pytest.approx(lbfgs.temperature.item(), rel=1e-6)
    if held_at is None:
        assert abs(brent.grad_log_temperature) < 1e-6 and brent.degenerate_reason is None
    else:
        assert brent.temperature.item() == held_at and "the NLL optimum lies beyond 20" in brent.degenerate_reason


def test_the_calibration_refinement_metric_builds_no_torch_optimizer():
    # torch's first optimizer in a process imports torch._dynamo (about 2 s): every trial evaluates the metric
    code = ("import sys, numpy as np\n"
            "from calib.metrics import compute_all\n"
            "rng = np.random.default_rng(0)\n"
            "p = rng.dirichlet(np.ones(10), size=300)\n"
            "split = compute_all(p, rng.integers(0, 10, 300))\n"
            "assert np.isfinite(split['nll_refinement']), split\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.parametrize("log_temperature", [-2.0, 0.0, math.log(1.5), 3.0])
def test_the_nll_and_its_derivative_against_autograd(log_temperature):
    # _TemperatureNLL's one numpy pass against torch's cross-entropy of z / T differentiated by autograd.
    generator = torch.Generator().manual_seed(3)
    z = 4 * torch.randn(200, 7, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 7, (200,), generator=generator)
    log_t = torch.tensor(log_temperature, dtype=torch.float64, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(z / log_t.exp(), y)
    expected.backward()
    nll, derivative = _TemperatureNLL(z, y)(log_temperature)
    assert nll == pytest.approx(float(expected), rel=1e-13, abs=1e-15)
    assert derivative == pytest.approx(float(log_t.grad), rel=1e-11, abs=1e-14)
