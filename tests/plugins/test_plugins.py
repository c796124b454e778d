"""Plugins: registration from the outside, and plugins reaching every Ray worker.

The successful loads run in subprocesses (as a user's study does), so that this test process's registries
keep calib's own components only (the README's column table covers those).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from calib._registry import Registry, registering_as
from calib.plugins import Plugin, PluginError, plugins_of, use_plugin

REPO = Path(__file__).resolve().parents[2]

PACKAGE_COMPONENTS = '''
"""A user's package: a dataset registered through the entry-point group calib.plugins."""
import os

import torch
from torch.utils.data import TensorDataset

from calib.datasets import DatasetInfo, DatasetSplits
from calib.registries import DATASETS


def _blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    centres = torch.tensor([[2.0, 0.0], [0.0, 2.0], [-2.0, -2.0]])
    points = centres[labels] + 0.8 * torch.randn(n, 2, generator=g)
    images = points.repeat(1, 8).reshape(n, 1, 4, 4)
    return TensorDataset(images, labels)


def load(root, download=False):
    os.makedirs(os.path.join(root, "loaded-by"), exist_ok=True)
    open(os.path.join(root, "loaded-by", str(os.getpid())), "w").close()
    train = _blobs(120, 1)
    return DatasetSplits(train=train, train_eval=train, val=_blobs(60, 2), test=_blobs(90, 3), num_classes=3,
                         input_shape=(1, 4, 4))


DATASETS.register("demo-blobs")(DatasetInfo(load=load, require=lambda root: None, num_classes=3,
                                            input_shape=(1, 4, 4), description="three Gaussian blobs"))
'''

MODULE_PLUGIN = '''
"""A module that is not installed (--plugin FILE.py): an architecture."""
import torch
from torch import nn

from calib.models import CalibModel
from calib.registries import MODELS


class DemoMLP(CalibModel):
    def __init__(self, num_classes, in_channels=1):
        super().__init__(num_features=8, num_classes=num_classes)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 16, 8), nn.ReLU())

    def features(self, x):
        return self.body(x)


MODELS.register("demo_mlp")(DemoMLP)
'''


def _run(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


class TestRegistryOrigins:
    def test_main(self):
        registry: Registry[int] = Registry("thing")
        registry.register("own")(1)
        plugin = Plugin("my_plugin", "1.2.0", "test")
        with registering_as(plugin):
            registry.register("theirs")(2)
        assert registry.origin("own") is None
        assert registry.origin("theirs") == plugin
        assert plugins_of([(registry, "own"), (registry, "theirs"), (registry, "theirs")]) == ["my_plugin 1.2.0"]

    def test_errors(self):
        registry: Registry[int] = Registry("thing")
        with registering_as(Plugin("first", "1", "test")):
            registry.register("name")(1)
        with pytest.raises(ValueError, match=r"thing 'name' is already registered \(by first 1\)"):
            registry.register("name")(2)


class TestUsePlugin:
    def test_errors(self, tmp_path):
        with pytest.raises(PluginError, match="`--plugin` file not found"):
            use_plugin(str(tmp_path / "absent.py"))
        (tmp_path / "notes.txt").write_text("")
        with pytest.raises(PluginError, match=r"names a module .dotted name. or a \.py file"):
            use_plugin(str(tmp_path / "notes.txt"))
        with pytest.raises(PluginError, match="no module of that name can be imported here"):
            use_plugin("no_such_calib_plugin_module")
        with pytest.raises(PluginError, match="must be a dotted module name"):
            use_plugin("not a module")
        (tmp_path / "json.py").write_text("")
        with pytest.raises(PluginError, match="the name of another module"):
            use_plugin(str(tmp_path / "json.py"))
        broken = tmp_path / "broken_plugin.py"
        broken.write_text("raise RuntimeError('the plugin is broken')\n")
        with pytest.raises(PluginError, match=r"failed to import: RuntimeError: the plugin is broken \(.*broken_plugin"
                                               r"\.py, line 1\)"):
            use_plugin(str(broken))
        assert "broken_plugin" not in sys.modules
        assert "broken_plugin" not in os.environ.get("CALIB_PLUGINS", "")


@pytest.fixture
def installed_plugin(tmp_path):
    """The package calib-demo-plugin, pip-installed into this environment for the test, then uninstalled."""
    package = tmp_path / "calib-demo-plugin"
    (package / "calib_demo_plugin").mkdir(parents=True)
    (package / "calib_demo_plugin" / "__init__.py").write_text("")
    (package / "calib_demo_plugin" / "components.py").write_text(PACKAGE_COMPONENTS)
    (package / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "calib-demo-plugin"
        version = "0.1.0"

        [project.entry-points."calib.plugins"]
        demo = "calib_demo_plugin.components"

        [tool.setuptools]
        packages = ["calib_demo_plugin"]
    '''))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
           str(package)]
    subprocess.run(pip, check=True, capture_output=True, cwd=tmp_path)
    try:
        yield
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "calib-demo-plugin"], check=True,
                       capture_output=True)


def test_loaded_plugins_lists_what_this_process_loaded(installed_plugin, tmp_path):
    """What a plugin author checks: the installed package's entry point is found (with its distribution's
    version), then a --plugin file joins it (with its code's hash and path), each once."""
    module = tmp_path / "code" / "demo_model.py"
    module.parent.mkdir()
    module.write_text(MODULE_PLUGIN)
    script = textwrap.dedent(f"""
        import json
        from calib.plugins import loaded_plugins, use_plugin

        def listed():
            return [[p.module, p.version, p.source] for p in loaded_plugins()]

        before = listed()
        use_plugin({str(module)!r})
        use_plugin({str(module)!r})
        print(json.dumps([before, listed()]))
    """)
    done = _run("-c", script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = json.loads(done.stdout.splitlines()[-1])
    import hashlib

    entry_point = ["calib_demo_plugin.components", "0.1.0", "entry point of calib-demo-plugin"]
    version = "sha256:" + hashlib.sha256(module.read_bytes()).hexdigest()[:12]
    assert before == [entry_point]
    assert after == [entry_point, ["demo_model", version, str(module.resolve())]]


@pytest.mark.ray
def test_plugins_reach_every_ray_worker(installed_plugin, tmp_path):
    """An installed package's dataset (entry point) and a --plugin file's architecture train on two Ray workers;
    each row names both plugins with their versions."""
    module = tmp_path / "code" / "demo_model.py"
    module.parent.mkdir()
    module.write_text(MODULE_PLUGIN)
    store, data = tmp_path / "store", tmp_path / "data"
    done = _run(str(REPO / "studies" / "compare_methods.py"), "--plugin", str(module), "--datasets", "demo-blobs",
                "--archs", "demo_mlp", "--methods", "Vanilla (CE)", "--seeds", "1", "2", "--epochs", "2",
                "--cpus-per-trial", "1",
                "--store", str(store), "--data-root", str(data), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "demo-blobs · demo_mlp" in done.stdout
    loaders = {int(p.name) for p in (data / "loaded-by").iterdir()}
    assert len(loaders) >= 2  # the two seeds' Stage I trained at once, in two worker processes

    import pandas as pd

    trials = pd.read_parquet(store / "trials")
    assert len(trials) == 2 and set(trials["status"]) == {"ok"}
    source = module.read_bytes()
    import hashlib

    version = "sha256:" + hashlib.sha256(source).hexdigest()[:12]
    for plugins in trials["plugins"]:
        assert list(plugins) == ["calib_demo_plugin.components 0.1.0", f"demo_model {version}"]
    config = json.loads(trials["config_json"].iloc[0])
    assert (config["dataset"], config["arch"]) == ("demo-blobs", "demo_mlp")
