"""Plugins: a user's modules that add datasets, models, losses and methods to calib's registries.

A plugin is a module that registers components when it is imported, as calib's own modules do::

    from calib.registries import DATASETS, METHODS, MODELS

    @MODELS.register("my_net")
    def my_net(num_classes: int, in_channels: int = 3) -> CalibModel: ...

Two ways to name one (docs/extending.md):

- an **installed package** declares the module in the entry-point group ``calib.plugins``
  (``[project.entry-points."calib.plugins"]`` ``my_plugin = "my_package.calib_plugin"``). Every calib
  process imports it the first time it reads a registry: the driver and each Ray worker, provided the
  package is installed there (on a cluster: the cluster file's ``setup_commands``).
- ``--plugin MODULE`` on any study: a dotted module name the driver can import, or the path of a
  ``.py`` file. The driver imports it, and passes it to every Ray worker of the run: its name in the
  ``CALIB_PLUGINS`` variable and, unless it is installed, its code through Ray's runtime environment
  (``py_modules``), so a worker on another node imports the same code.

Each registered name remembers its plugin; a trial's row lists the plugins of the components it used
(``plugins`` column, ``"<module> <version>"``: the distribution's version, or ``sha256:<12 hex>`` of the
module's file for a module that is not installed).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from calib._config import ConfigError
from calib._registry import registering_as

__all__ = ["BUILTIN_MODULES", "ENTRY_POINT_GROUP", "PLUGINS_ENV", "Plugin", "PluginError", "load_components",
           "load_studies", "loaded_plugins", "plugins_of", "ray_py_modules", "studies_folder", "use_plugin"]

ENTRY_POINT_GROUP = "calib.plugins"
PLUGINS_ENV = "CALIB_PLUGINS"
"""JSON list of the ``--plugin`` modules of a run: ``[{"module": "my_plugin", "path": "/abs/my_plugin.py"}]``."""
BUILTIN_MODULES = ("calib.datasets", "calib.models", "calib.losses", "calib.training.procedures", "calib.methods",
                   "calib.posthoc")
"""calib's own components: imported first, so a plugin cannot take their names."""


class PluginError(ConfigError):
    """A plugin that cannot be imported or that breaks a registry; the message shows its error."""


@dataclass(frozen=True)
class Plugin:
    """A loaded plugin: its module, its version and how it was named."""

    module: str
    version: str
    source: str

    def __str__(self) -> str:
        return f"{self.module} {self.version}"


_lock = threading.RLock()
_state = {"loaded": False, "loading": False}
_plugins: dict[str, Plugin] = {}


def load_components() -> None:
    """Fill the registries once per process: calib's modules, the installed plugins, then ``$CALIB_PLUGINS``.

    Reads during the loading (a module that looks a name up while it registers) see what is registered so far.
    """
    _fill_once(_state, _load_all_components)


def _load_all_components() -> None:
    for name in BUILTIN_MODULES:
        importlib.import_module(name)
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        _load_entry_point(entry)
    for spec in json.loads(os.environ.get(PLUGINS_ENV) or "[]"):
        _load_module(spec["module"], spec.get("path"))


def _fill_once(state: dict[str, bool], fill: Callable[[], None]) -> None:
    """Run ``fill`` once per process (``state`` says whether it has run): a call during the fill (a module that
    reads a registry while it registers) returns at once, and a fill that raises runs again at the next call."""
    if state["loaded"]:
        return
    with _lock:
        if state["loaded"] or state["loading"]:
            return
        state["loading"] = True
        try:
            fill()
            state["loaded"] = True
        finally:
            state["loading"] = False


_studies_state = {"loaded": False, "loading": False}


def studies_folder() -> Path:
    """The study scripts' folder: ``studies/`` beside the ``calib`` package of this process (the checkout)."""
    return Path(__file__).resolve().parents[1] / "studies"


def load_studies() -> None:
    """Fill :data:`calib.registries.STUDIES` once per process: import every script of :func:`studies_folder`
    (as the module ``calib_studies_<name>``; a script runs nothing on import), each declaring its study
    (:func:`calib.study.declaration.declare_study`). Nothing without the folder (calib installed alone)."""
    _fill_once(_studies_state, _import_study_scripts)


def _import_study_scripts() -> None:
    for path in sorted(studies_folder().glob("*.py")) if studies_folder().is_dir() else []:
        name = f"calib_studies_{path.stem}"
        if name in sys.modules:
            continue
        try:
            _import_file(name, str(path))
        except Exception as err:
            text = "".join(traceback.format_exception_only(type(err), err)).strip()
            raise ConfigError(f"The study script {path} failed to import: {text}. Fix it, or move it out of "
                              f"{path.parent}.") from err


def _import_file(module_name: str, path: str) -> types.ModuleType:
    """The module ``module_name`` imported from its file ``path`` (in ``sys.modules`` unless its import raised)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _file_version(path: str | None) -> str:
    """``sha256:<12 hex>`` of a module's file: the version of code that is not an installed distribution."""
    if path and os.path.isfile(path):
        return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    return "unknown"


def _failure(what: str, err: BaseException) -> PluginError:
    last = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    where = f" ({last[0].filename}, line {last[0].lineno})" if last else ""
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    return PluginError(f"The plugin {what} failed to import: {text}{where}. Fix it, or uninstall it / leave out "
                       f"--plugin.")


def _import_as(plugin: Plugin, what: str, load: Callable[[], types.ModuleType]) -> Plugin:
    """Run ``load`` with every registration attributed to ``plugin``; its failure is a :class:`PluginError`."""
    try:
        with registering_as(plugin):
            load()
    except PluginError:
        raise
    except Exception as err:
        raise _failure(what, err) from err
    _plugins[plugin.module] = plugin
    return plugin


def _load_entry_point(entry: importlib.metadata.EntryPoint) -> None:
    distribution = entry.dist.name if entry.dist is not None else None
    version = entry.dist.version if entry.dist is not None else "unknown"
    what = f"{entry.value!r} (entry point {entry.name!r} of {distribution or 'an installed package'}, group " \
           f"{ENTRY_POINT_GROUP!r})"
    module_name = entry.value.split(":")[0]
    _import_as(Plugin(module_name, version, f"entry point of {distribution}"), what,
               lambda: importlib.import_module(module_name))


def _load_module(module_name: str, path: str | None) -> Plugin:
    """Import a ``--plugin`` module: by name where it can be (installed, on ``sys.path``, or shipped to this Ray
    worker in ``py_modules``), else from its file ``path`` (the driver)."""
    if module_name in _plugins:
        return _plugins[module_name]
    found = None if module_name in sys.modules else importlib.util.find_spec(module_name)
    from_file = path is not None and module_name not in sys.modules and found is None
    file = path if from_file else getattr(found, "origin", None) or getattr(sys.modules.get(module_name), "__file__",
                                                                             None)
    distribution = None if from_file else _distribution_of(module_name)
    version = importlib.metadata.version(distribution) if distribution else _file_version(file)

    def load() -> types.ModuleType:
        return _import_file(module_name, path) if from_file else importlib.import_module(module_name)  # type: ignore[arg-type]

    return _import_as(Plugin(module_name, version, path or "module"), repr(path or module_name), load)


def _distribution_of(module_name: str) -> str | None:
    top = module_name.split(".")[0]
    names = importlib.metadata.packages_distributions().get(top)
    return names[0] if names else None


def use_plugin(name: str) -> Plugin:
    """Import the ``--plugin`` ``name`` (a dotted module name, or a ``.py`` file's path) here and add it to
    ``$CALIB_PLUGINS``, which the Ray workers of the run read (:func:`ray_py_modules` ships its code)."""
    load_components()
    path = None
    if name.endswith(".py") or os.sep in name or "/" in name:
        file = Path(name).expanduser().resolve()
        if file.suffix != ".py":
            raise PluginError(f"`--plugin` names a module (dotted name) or a .py file, got --plugin={name!r}.")
        if not file.is_file():
            raise PluginError(f"`--plugin` file not found: {str(file)!r} (from --plugin={name!r}).")
        module_name, path = file.stem, str(file)
        if not module_name.isidentifier():
            raise PluginError(f"`--plugin` file {path!r}: its name must be a Python module name (letters, digits, "
                              f"'_'), as it is imported as {module_name!r} on every worker.")
        other = sys.modules.get(module_name) or importlib.util.find_spec(module_name)
        where = getattr(other, "__file__", None) or getattr(other, "origin", None)
        if other is not None and where != path:
            raise PluginError(f"`--plugin` file {path!r} would be imported as {module_name!r}, the name of another "
                              f"module ({where}): rename the file.")
    else:
        module_name = name
        if not all(part.isidentifier() for part in name.split(".")):
            raise PluginError(f"`--plugin` must be a dotted module name or a .py file's path, got --plugin={name!r}.")
        try:
            found = importlib.util.find_spec(module_name)
        except (ImportError, ValueError) as err:
            raise _failure(repr(name), err) from err
        if found is None:
            raise PluginError(f"`--plugin` {name!r}: no module of that name can be imported here (sys.path: the "
                              f"working directory and the installed packages). Give its .py file's path instead, or "
                              f"install it.")
    with _lock:
        plugin = _load_module(module_name, path)
        listed = json.loads(os.environ.get(PLUGINS_ENV) or "[]")
        if all(entry["module"] != module_name for entry in listed):
            listed.append({"module": module_name, "path": path})
            os.environ[PLUGINS_ENV] = json.dumps(listed)
    return plugin


def loaded_plugins() -> list[Plugin]:
    """The plugins loaded in this process, in the order they loaded: the installed ones (entry points), then the
    ``--plugin`` ones. Reading it loads them first, as reading any registry does (:func:`load_components`)."""
    load_components()
    return list(_plugins.values())


def plugins_of(names: Iterable[tuple[object, str]]) -> list[str]:
    """``"<module> <version>"`` of the plugins that registered the given (registry, name) pairs, sorted."""
    found = {str(origin) for registry, name in names if (origin := registry.origin(name)) is not None}  # type: ignore[attr-defined]
    return sorted(found)


def ray_py_modules() -> list[str | types.ModuleType]:
    """The code of the ``--plugin`` modules that are not installed, for Ray's ``runtime_env["py_modules"]``:
    a ``.py`` file's path, or the top-level package or module a dotted name lives in."""
    shipped: list[str | types.ModuleType] = []
    for entry in json.loads(os.environ.get(PLUGINS_ENV) or "[]"):
        if entry.get("path"):
            shipped.append(entry["path"])
            continue
        top = entry["module"].split(".")[0]
        if _distribution_of(top) is None and top in sys.modules:
            shipped.append(sys.modules[top])
    return shipped
