"""docs/architecture.md §9, the module map, names every module of calib and names nothing that is gone.

The rule: a row's first cell is a path (``calib/trial.py``, or a folder ``calib/store/``); a module is named when a
row is its own path, or when the row of the deepest folder holding it names its file (```rescore.py```) in the
row's text. A package's ``__init__.py`` is named by its folder's row. Every ``.py`` file a row names exists in that
row's folder (or a folder below it).

Also held to the code: the map's rows of the registries and presets (every name), §9's paragraph on the layers
(those of tests/core/test_layers.py, in order) and §3's table of the trial config (every ``TrialConfig`` field).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from calib import registries
from calib.config import _PLACEMENT_KEYS, TrialConfig
from calib.study.presets import PRESETS
from tests.core.test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[2]


def module_map() -> dict[str, str]:
    """Row path → the row's text, from the table of §9."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## 9. Module map"):]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| `([^`]+)` \| (.*) \|$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def named_files(row_text: str) -> set[str]:
    """The ``.py`` file names a row's text names in backticks (``paper/cells.py`` and ``cells.py`` both give
    ``cells.py``)."""
    return {name.rsplit("/", 1)[-1] for name in re.findall(r"`([\w/]+\.py)`", row_text)}


def unnamed_modules(rows: dict[str, str], modules: list[str]) -> list[str]:
    """The modules (paths relative to the repository) that no row of ``rows`` names, by the rule above."""
    folders = sorted((path for path in rows if path.endswith("/")), key=len, reverse=True)
    missing = []
    for module in modules:
        if module in rows:
            continue
        folder = next((f for f in folders if module.startswith(f)), None)
        if folder is None:
            missing.append(module)
        elif module != f"{folder}__init__.py" and module.rsplit("/", 1)[-1] not in named_files(rows[folder]):
            missing.append(module)
    return missing


def test_the_map_has_its_rows():
    rows = module_map()
    assert {"calib/trial.py", "calib/store/", "calib/search/", "studies/"} <= set(rows)
    assert "`rescore.py`" in rows["calib/store/"]


def test_every_module_of_calib_is_in_the_map():
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "calib").rglob("*.py") if "__pycache__" not in p.parts)
    assert len(modules) > 150
    assert unnamed_modules(module_map(), modules) == [], "name each in docs/architecture.md §9"


def test_every_name_in_the_map_exists():
    gone = []
    for path, text in module_map().items():
        target = ROOT / path
        if not target.exists():
            gone.append(path)
            continue
        if target.is_dir():
            present = {p.name for p in target.rglob("*.py")}
            gone += [f"{path}: {name}" for name in sorted(named_files(text) - present)]
    assert gone == []


def test_the_registries_row_names_each_registry():
    row = module_map()["calib/registries.py"]
    assert [name for name in registries.__all__ if f"`{name}`" not in row] == []


def test_the_trial_config_table_has_every_key():
    """§3's table names each field of ``TrialConfig``, and its sentence on ``trial_id`` each placement key."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## 3. The trial config"):text.index("## 4. ")]
    keys = " ".join(re.findall(r"^\| (.*?) \|", section, re.M))
    assert [f.name for f in dataclasses.fields(TrialConfig) if f"`{f.name}`" not in keys] == []
    placement = " ".join(section[section.index("placement keys ("):].split(")")[0].split())
    assert [key for key in _PLACEMENT_KEYS if f"`{key}`" not in placement] == []


def test_the_presets_row_names_each_preset():
    row = next(text for text in module_map().values() if text.startswith("`PRESETS`"))  # wherever presets live
    assert [name for name in PRESETS.names() if f"`{name}`" not in row] == []


def test_the_maps_paragraph_names_the_layers_in_order():
    """§9's first paragraph names each package and module of tests/core/test_layers.py's layers, a layer after
    the one above it (the ``_`` modules as "the `_` modules")."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    paragraph = text[text.index("## 9. Module map"):].split("\n\n")[1]
    last = -1
    for layer, prefixes in LAYERS:
        places = []
        for prefix in prefixes:
            path = prefix.removeprefix("calib.").replace(".", "/")
            name = "the `_` modules" if path.startswith("_") else f"`{path}/`" if (ROOT / "calib" / path).is_dir() \
                else f"`{path}.py`"
            assert name in paragraph, (layer, name)
            places.append(paragraph.index(name))
        assert min(places) > last, layer
        last = max(places)


def test_the_rule_catches_a_missing_module_and_accepts_its_package_row():
    rows = {"calib/store/": "`scan.py` (scanning), `paper/cells.py`", "calib/trial.py": "run_trial"}
    modules = ["calib/trial.py", "calib/store/__init__.py", "calib/store/scan.py", "calib/store/cells.py",
               "calib/store/rescore.py", "calib/other.py", "calib/store/sub/__init__.py"]
    assert unnamed_modules(rows, modules) == ["calib/store/rescore.py", "calib/other.py",
                                              "calib/store/sub/__init__.py"]
