"""Every renamed public name still works for a release, with a ``DeprecationWarning`` that names the new one
(calib._deprecation.RENAMES lists them): each old form below gives what its new form gives."""

from __future__ import annotations

import warnings

import pytest
import torch

from calib._deprecation import REMOVED_AFTER, RENAMES


def _temperature(**kwargs) -> float:
    from calib.posthoc import TemperatureScaling

    torch.manual_seed(0)
    logits, labels = 4 * torch.randn(300, 5), torch.randint(0, 5, (300,))
    return float(TemperatureScaling(**kwargs).fit(logits, labels).temperature)


def _histogram_binning(name: str):
    from calib.posthoc import POSTHOC

    return POSTHOC.get(name)


def _loss_spec(old: bool):
    from calib.losses import LossSpec
    from calib.losses.focal import FocalLoss, FocalLossConfig

    if old:
        return LossSpec(config=FocalLossConfig, description="focal, the older form", label="FL",
                        build=lambda params, *, num_classes, reduction: FocalLoss(params.gamma, reduction=reduction))
    return LossSpec(config=FocalLossConfig, build=None, description="focal", label="FL", loss=FocalLoss)


def _posthoc_settings(flag: str):
    from in_process import study_module

    from calib.study.settings import study_settings

    args = study_module("posthoc.py").posthoc_parser().parse_args([flag, "histogram_binning_equal_mass.num_bins=5"])
    return study_settings(args)


def _presets(old: bool):
    """A preset's base config and the preset names, through the module's old name or its new one."""
    if old:
        from calib.presets import PRESETS, base_config
    else:
        from calib.study.presets import PRESETS, base_config
    return PRESETS.names(), base_config(PRESETS.get("quick"), study="s", dataset="digits", arch="small_cnn", seed=1,
                                        method={"name": "vanilla"}, data_root="data", artifact_root="artifacts")


OLD_AND_NEW = {  # old form: (its call, the new form's call, the new name its warning must say)
    "TemperatureScaling(line_search=...)": (lambda: _temperature(line_search=False),
                                            lambda: _temperature(lbfgs_line_search=False), "lbfgs_line_search"),
    "post-hoc calibrator 'histogram_binning'": (lambda: _histogram_binning("histogram_binning"),
                                            lambda: _histogram_binning("histogram_binning_equal_mass"),
                                            "'histogram_binning_equal_mass'"),
    "LossSpec(build=...)": (lambda: _loss_spec(True).create(_focal_config(), num_classes=3, reduction="sum"),
                            lambda: _loss_spec(False).create(_focal_config(), num_classes=3, reduction="sum"),
                            "calib.losses.register_loss"),
    "posthoc.py --param METHOD.FIELD=VALUE": (lambda: _posthoc_settings("--param"), lambda: _posthoc_settings("--set"),
                                              "posthoc.py --set"),
    "calib.presets": (lambda: _presets(True), lambda: _presets(False), "calib.study.presets"),
}


def _focal_config():
    from calib.losses.focal import FocalLossConfig

    return FocalLossConfig(gamma=2.0)


def test_every_rename_is_listed_here():
    assert set(OLD_AND_NEW) == set(RENAMES)


@pytest.mark.parametrize("old", sorted(RENAMES))
def test_the_old_name_works_and_warns_naming_the_new(old: str):
    make_old, make_new, new_name = OLD_AND_NEW[old]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new form warns of nothing
        new = make_new()
    with pytest.deprecated_call() as caught:
        was = make_old()
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(new_name in message.split(" is renamed ")[1] and f"calib {REMOVED_AFTER}" in message
               for message in said if " is renamed " in message), said
    if isinstance(new, torch.nn.Module):
        assert (type(was), repr(was)) == (type(new), repr(new))
    else:
        assert was == new


def test_the_warning_points_at_the_callers_line():
    with pytest.deprecated_call() as caught:
        _temperature(line_search=True)
    assert any(w.filename == __file__ for w in caught), [(w.filename, w.lineno) for w in caught]


def test_the_old_module_warns_at_the_importing_line_and_names_only_the_moved_names():
    import calib.presets
    import calib.study.presets

    with pytest.deprecated_call() as caught:
        from calib.presets import Preset
    assert Preset is calib.study.presets.Preset
    assert [w.filename for w in caught] == [__file__]
    with pytest.raises(AttributeError, match=r"module 'calib\.presets' has no attribute 'field_types'"):
        calib.presets.field_types  # noqa: B018 (calib.study.presets imports it; it is not one of its names)


def test_extending_md_lists_every_rename():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "extending.md").read_text()
    table = page[page.index("## 9. Renamed names"):]
    for old in RENAMES:
        shown = old.replace("post-hoc calibrator 'histogram_binning'", "post-hoc calibrator `histogram_binning`")
        assert shown in table or f"`{old}`" in table, old
