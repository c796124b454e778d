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


def test_a_registration_changes_the_version_a_refused_one_does_not():
    reg = make_registry()
    assert reg.version == 2
    reg.register("poly")(lambda: "poly")
    with pytest.raises(ValueError):
        reg.register("poly")(lambda: None)
    assert reg.version == 3


def test_row_tables_are_built_once_until_a_method_or_a_loss_is_registered(monkeypatch):
    """``RegistryRows`` is read hundreds of times per study start (each row table reads the others): built once
    (a study's start took 3 s rebuilding them on every read), and again after a registration (a ``--plugin``)."""
    from calib.registries import LOSSES, METHODS
    from calib.study.rows import METHOD_ROWS, RegistryRows

    builds = []
    rows = RegistryRows(lambda: builds.append(1) or {"CE": "ce", **METHOD_ROWS}, "rows")
    assert rows["CE"] == "ce" and len(rows) == len(METHOD_ROWS) + 1 and next(iter(rows)) == "CE"
    assert len(builds) == 1
    for registry in (METHODS, LOSSES):
        monkeypatch.setattr(registry, "version", registry.version + 1)  # as a plugin's registration does
        assert rows["CE"] == "ce" and len(builds) == 2 + (registry is LOSSES)
