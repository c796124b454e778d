"""No module of calib imports from a layer above its own: data flows one way (docs/architecture.md §1, §9).

§1 draws the flow study → Ray Tune → run_trial → store → report. As imports, each stage drives the next
one: the study starts Ray Tune (``calib.run``: a table's grid directly, a search through the Optuna search of
``calib.search``, which sits on it), Tune's workers call ``run_trial`` and write the ``TrialResult`` it returns
into the store. The report is the one stage that imports what comes before it in the picture: the study
calls it to print its table, and it reads the store, so it sits between the trials and the store. Below
the stages are the parts a trial is built of, and the foundation every part uses. Imports inside
functions count as well as those at the top of a file: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAYERS: list[tuple[str, tuple[str, ...]]] = [  # top first: a module imports its own layer and those below
    ("launchers", ("calib.cluster",)),
    ("study", ("calib.study", "calib.presets")),
    ("Optuna search", ("calib.search",)),
    ("Ray Tune", ("calib.run", "calib.tracking")),
    ("run_trial", ("calib.trial",)),
    ("report", ("calib.report",)),
    ("store", ("calib.store",)),
    ("the parts of a trial", ("calib.artifacts", "calib.methods", "calib.posthoc", "calib.training")),
    ("trial config and result", ("calib.config", "calib.overrides", "calib.stage1_source", "calib.trial_result")),
    ("components", ("calib.models", "calib.datasets", "calib.losses", "calib.metrics")),
    ("foundation", ("calib.registries", "calib.plugins", "calib.storage", "calib.progress", "calib._config",
                    "calib._registry", "calib._versions", "calib._lease", "calib._help", "calib._deprecation",
                    "calib.exit_codes", "calib.seeds")),
]
PACKAGE = "calib"  # calib/__init__.py (``__version__``): the ground floor


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((ROOT / "calib").rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the layer holding ``module`` (its longest listed prefix)."""
    if module == PACKAGE:
        return len(LAYERS) - 1
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[str, int]]:
    """The calib modules ``source`` (the code of ``module``) imports, with their lines: ``from calib import
    storage`` names ``calib.storage``, ``from calib.store import read_trials`` names ``calib.store``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.append((child if child in MODULES else base, node.lineno))
    return [(name, line) for name, line in found if name == PACKAGE or name.startswith(PACKAGE + ".")]


def upward_imports(module: str, source: str, is_package: bool = False) -> list[str]:
    """``module``'s imports of a module in a higher layer, as ``"<module>:<line> imports <name>"`` lines."""
    own = layer_of(module)
    assert own is not None, module
    found = []
    for name, line in imported_modules(module, source, is_package):
        target = layer_of(name)
        if target is not None and target < own:
            found.append(f"{module}:{line} ({LAYERS[own][0]}) imports {name} ({LAYERS[target][0]})")
    return found


def test_every_module_has_a_layer():
    unplaced = [m for m in MODULES if layer_of(m) is None]
    assert unplaced == [], f"place these modules in a layer of LAYERS: {unplaced}"


def test_no_module_imports_from_a_higher_layer():
    found = [line for module, path in MODULES.items()
             for line in upward_imports(module, path.read_text(), path.name == "__init__.py")]
    assert found == [], "imports from a higher layer:\n" + "\n".join(found)


def test_the_check_sees_lazy_relative_and_package_imports():
    """What it would have said of the store's CLI taking the study's guarded main, lazily, and of a
    method importing the trial through a relative import."""
    store_cli = "def parser():\n    from calib.study.main import guarded_main\n"
    assert upward_imports("calib.store.__main__", store_cli) == [
        "calib.store.__main__:2 (store) imports calib.study.main (study)"]
    assert upward_imports("calib.methods.tst", "from ..trial import run_trial\n") == [
        "calib.methods.tst:1 (the parts of a trial) imports calib.trial (run_trial)"]
    assert upward_imports("calib.report.build", "from calib import store, metrics\n") == []
    assert upward_imports("calib.metrics", "from calib import study\n", is_package=True) == [
        "calib.metrics:1 (components) imports calib.study (study)"]
