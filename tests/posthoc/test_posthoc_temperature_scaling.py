"""Temperature scaling (METHODS.md §5.1): recovers a known T, never changes the argmax, keeps T > 0."""

import pytest
import torch

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

TRUE_TEMPERATURE = 2.5


@pytest.fixture(scope="module")
def tempered_data():
    """Logits z and labels drawn from softmax(z / T*), T* = 2.5: the NLL-optimal temperature is ≈ T*."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20000, 10, generator=g) * 4
    labels = torch.multinomial((logits.double() / TRUE_TEMPERATURE).softmax(1), 1, generator=g).squeeze(1)
    return logits, labels


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
        temperature = TemperatureScaling(line_search=False).fit(logits, labels).temperature.item()
        assert 1.5 < temperature < TRUE_TEMPERATURE - 0.3

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
        probs = PostHocPredictor(ts)(torch.empty(500, 0), logits[:500])
        assert probs.dtype == torch.float64 and probs.device.type == "cpu"
        torch.testing.assert_close(probs, (logits[:500].double() / ts.temperature).softmax(1))

    def test_errors(self):
        with pytest.raises(ValueError, match=r"`objective`='ece' needs `optimizer`='grid'.*got optimizer='lbfgs'"):
            TemperatureScaling("ece", "lbfgs")
        with pytest.raises(ValueError, match=r"`objective` must be one of 'nll', 'ece', got objective='brier'"):
            TemperatureScaling("brier")
        with pytest.raises(ValueError, match=r"`optimizer` must be one of 'lbfgs', 'grid', got optimizer='adam'"):
            TemperatureScaling("nll", "adam")
        with pytest.raises(ValueError, match=r"`init_temperature` must be > 0 \(it is T\), got init_temperature=0"):
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
        with pytest.raises(ValueError, match=r"`logits` must have shape \(N, C\) with C >= 1, got shape \(4,\)"):
            ts.fit(torch.zeros(4), torch.zeros(4, dtype=torch.long))


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
        ({"objective": "acc"}, r"`objective` must be one of 'nll', 'ece', got objective='acc'"),
    ])
    def test_errors(self, kwargs, message):
        with pytest.raises(ConfigError, match=message):
            TemperatureScalingConfig(**kwargs)
