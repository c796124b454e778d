import pytest

from calib._registry import Registry, UnknownNameError


def make_registry() -> Registry:
    reg: Registry = Registry("loss")
    reg.register("focal")(lambda gamma=3.0: ("focal", gamma))
    reg.register("label_smoothing")(lambda: "ls")
    return reg


class TestRegistry:
    def test_main(self):
        reg = make_registry()
        assert reg.names() == ["focal", "label_smoothing"]
        assert reg.names("lab*") == ["label_smoothing"]
        assert "focal" in reg and "nope" not in reg
        assert reg.create("focal", gamma=2.0) == ("focal", 2.0)
        assert list(reg) == ["focal", "label_smoothing"] and len(reg) == 2

    def test_errors(self):
        reg = make_registry()
        with pytest.raises(ValueError, match="loss 'focal' is already registered"):
            reg.register("focal")(lambda: None)
        with pytest.raises(UnknownNameError, match=r"Unknown loss 'focall'\. Did you mean 'focal'\?") as info:
            reg.get("focall")
        assert "Valid loss names: focal, label_smoothing." in str(info.value)
        assert isinstance(info.value, KeyError)
