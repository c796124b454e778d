"""An extension is one file: a post-hoc method, a training loss and a Stage-II method, each added as one new module of
calib (and once more through a plugin), and a Stage-I training procedure (docs/extending.md §1.1, as one module),
appear in the studies' ``--methods`` choices, run, and show in the tables, with no other file edited
(docs/extending.md, "One file per extension").

The new modules go into a copy of calib's package (this checkout stays as it is), which the study scripts import
through ``PYTHONPATH``; the plugin is a ``.py`` file named with ``--plugin``. docs/extending.md's recipes go into
the same copy as the page writes them (``_recipe``): the loss, the method and the post-hoc calibrator with their
test files, the plugin of §0, the architecture of §4 (with its import line), the study script of §5, the ladder of
§6 and the search space of §7.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]

POSTHOC = '''
"""Temperature scaling at a fixed T (no fit): the simplest post-hoc method, as one file: a config class and a
calibrator class, no factory (the calibrator takes the config's fields by name)."""
from dataclasses import dataclass

from calib._config import check_values, checked_field, number
from calib.posthoc._base import PostHocCalibrator, check_logits
from calib.posthoc._method import PostHocConfig, register_posthoc_method


@dataclass(frozen=True, kw_only=True)
class {cls}Config(PostHocConfig):
    temperature: float = checked_field({temperature}, number(above=0))


class {cls}(PostHocCalibrator):
    def __init__(self, temperature=({cls}Config.temperature)):
        super().__init__()
        check_values({cls}Config, locals())
        self.temperature = temperature

    def fit(self, logits, labels):
        self._finish_fit()
        return self

    def forward(self, logits):
        return check_logits(logits) / self.temperature


register_posthoc_method("{name}", {cls}Config, {cls}, "temperature scaling at a fixed T", label="{label}", order=100)
'''

POSTHOC_FACTORY = '''
"""The same, registered as before declared fields: a hand-written ``build(params, seed)`` factory (still accepted)."""
from dataclasses import dataclass

from calib.posthoc._base import PostHocCalibrator, check_logits
from calib.posthoc._method import PostHocConfig, register_posthoc_method


@dataclass(frozen=True, kw_only=True)
class {cls}Config(PostHocConfig):
    temperature: float = {temperature}


class {cls}(PostHocCalibrator):
    def __init__(self, temperature):
        super().__init__()
        self.temperature = temperature

    def fit(self, logits, labels):
        self._finish_fit()
        return self

    def forward(self, logits):
        return check_logits(logits) / self.temperature


register_posthoc_method("{name}", {cls}Config, lambda params, seed: {cls}(params.temperature),
                        "temperature scaling at a fixed T", label="{label}", order=100)
'''

LOSS = '''
"""The Brier score as a training loss, as one file: a config class whose field declares its default and rule once,
and a loss class that takes it by name (built from the config by ``register_loss``'s rule, no factory)."""
from dataclasses import dataclass

from torch import nn
from torch.nn import functional as F

from calib._config import check_fields, checked_field, in_range
from calib.losses._base import register_loss


@dataclass(frozen=True, kw_only=True)
class {cls}Config:
    weight: float = checked_field(1.0, in_range(at_least=0))

    def __post_init__(self):
        check_fields(self)


class {cls}(nn.Module):
    def __init__(self, weight={cls}Config.weight, *, num_classes, reduction="mean"):
        super().__init__()
        self.weight, self.num_classes, self.reduction = weight, num_classes, reduction

    def forward(self, logits, targets, features=None):
        per_sample = (logits.softmax(1) - F.one_hot(targets, self.num_classes)).pow(2).sum(1) * self.weight
        return per_sample.mean() if self.reduction == "mean" else per_sample.sum()


register_loss("{name}", {cls}Config, {cls}, "Brier score", label="{label}", order=100)
'''

LOSS_FACTORY = '''
"""The same, in the form before ``register_loss``: a ``LossSpec`` with a ``build`` factory (still accepted, with a
DeprecationWarning)."""
from dataclasses import dataclass

from torch import nn
from torch.nn import functional as F

from calib.losses._base import LossSpec
from calib.registries import LOSSES


@dataclass(frozen=True, kw_only=True)
class {cls}Config:
    weight: float = 1.0


class {cls}(nn.Module):
    def __init__(self, weight, num_classes, reduction):
        super().__init__()
        self.weight, self.num_classes, self.reduction = weight, num_classes, reduction

    def forward(self, logits, targets, features=None):
        per_sample = (logits.softmax(1) - F.one_hot(targets, self.num_classes)).pow(2).sum(1) * self.weight
        return per_sample.mean() if self.reduction == "mean" else per_sample.sum()


LOSSES.register("{name}")(LossSpec(
    config={cls}Config, build=lambda params, *, num_classes, reduction: {cls}(params.weight, num_classes, reduction),
    description="Brier score", label="{label}", order=100))
'''

STAGE2 = '''
"""A Stage-II method: a new linear head, least squares on the one-hot labels of the training features, as one file."""
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from calib.methods._base import MethodOutcome, MethodSpec
from calib.registries import METHODS


@dataclass(frozen=True, kw_only=True)
class {cls}Config:
    ridge: float = 1.0


def run(params, artifact, *, seed, device):
    train = artifact.splits["train"]
    h = torch.cat([train.features.double(), torch.ones(len(train.labels), 1, dtype=torch.float64)], 1)
    targets = F.one_hot(train.labels, artifact.num_classes).double()
    weight = torch.linalg.solve(h.T @ h + params.ridge * torch.eye(h.shape[1], dtype=torch.float64), h.T @ targets)

    def predict(features, logits):
        hh = torch.cat([features.double(), torch.ones(len(features), 1, dtype=torch.float64)], 1)
        return (hh @ weight).softmax(1)

    return MethodOutcome.from_predictor(predict, artifact)


METHODS.register("{name}")(MethodSpec({cls}Config, run, "ridge head", label="{label}", order=100))
'''

OWN = {"posthoc": ("half_ts", "HalfTS", "FixedT", 2.0), "loss": ("brier_loss", "BrierLoss", "Brier"),
       "stage2": ("ridge_head", "RidgeHead", "Ridge")}
PLUGIN = {"posthoc": ("third_ts", "ThirdTS", "PluginT", 3.0), "loss": ("brier_plugin", "BrierPlugin", "PBrier"),
          "stage2": ("ridge_plugin", "RidgePlugin", "PRidge")}


def _source(kind: str, spec: tuple, *, plugin: bool = False) -> str:
    """The module of one extension; the plugin's post-hoc method and loss keep a hand-written factory (the older
    form)."""
    name, label, cls, *rest = spec
    template = {"posthoc": POSTHOC_FACTORY if plugin else POSTHOC, "loss": LOSS_FACTORY if plugin else LOSS,
                "stage2": STAGE2}[kind]
    return textwrap.dedent(template).format(name=name, label=label, cls=cls,
                                            temperature=rest[0] if rest else None)


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    """A copy of calib with one new module each in calib/posthoc, calib/losses and calib/methods, and a plugin file
    registering three more."""
    root = tmp_path_factory.mktemp("extended")
    shutil.copytree(REPO / "calib", root / "calib", ignore=shutil.ignore_patterns("__pycache__"))
    for kind, folder in (("posthoc", "posthoc"), ("loss", "losses"), ("stage2", "methods")):
        (root / "calib" / folder / f"{OWN[kind][0]}.py").write_text(_source(kind, OWN[kind]))
    # docs/extending.md's recipes, as they are written there
    for folder, name in (("losses", "my_loss"), ("methods", "my_method"), ("posthoc", "my_calibrator")):
        (root / "calib" / folder / f"{name}.py").write_text(_recipe(f"Create `calib/{folder}/{name}.py`"))
    procedure = root / "calib" / "training" / "procedures" / "my_input_noise.py"
    procedure.write_text(_recipe("### 1.1 A Stage-I training procedure"))
    plugin = root / "my_extensions.py"
    plugin.write_text("\n".join(_source(kind, spec, plugin=True) for kind, spec in PLUGIN.items()))
    env = {**os.environ, "PYTHONPATH": str(root)}
    return root, plugin, env


def _recipe(after: str, language: str = "python") -> str:
    """The first ``language`` block of docs/extending.md after the text ``after``, as it is there."""
    text = (REPO / "docs" / "extending.md").read_text()
    block = re.search(rf"```{language}\n(.*?)```", text[text.index(after):], re.S)
    assert block is not None, after
    return block.group(1)


# docs/extending.md's code blocks, each by its first line: the ones the tests of this file run, and the ones they do
# not, with the reason. A block added to the page fails test_every_block_of_the_page_is_run_or_says_why until it is
# in one of the two.
RUN_HERE = {
    "# my_package/calib_plugin.py": "test_the_plugin_and_the_architecture_recipes_build_their_models",
    '"""My loss (Author et al., VENUE YEAR), docs/methods.md §4.x.': "the fixture; a row of the Ray run",
    '"""My loss (calib/losses/my_loss.py)."""': "test_each_recipe_of_the_docs_passes_its_own_tests",
    '"""Input noise, a Stage-I training procedure: each training batch x becomes x + σ·ε, ε ~ N(0, I)."""':
        "the fixture; a row of the Ray run; and tests/plugins/test_plugin_procedure.py (a --plugin file)",
    '"""My method (Author et al., VENUE YEAR), docs/methods.md §X."""': "the fixture; a row of the Ray run",
    "from calib.trial import run_trial": "test_each_recipe_of_the_docs_passes_its_own_tests",
    '"""Temperature scaling with T chosen on a grid (write the formula, define every symbol), docs/methods.md §5.x.':
        "the fixture; a row of the Ray run",
    '"""My calibrator (calib/posthoc/my_calibrator.py)."""': "test_each_recipe_of_the_docs_passes_its_own_tests",
    '"""MyNet (Author et al. YEAR), docs/methods.md §7.1: blocks, widths, feature dimension."""':
        "test_the_plugin_and_the_architecture_recipes_build_their_models",
    '"""Does my method beat temperature scaling? Vanilla, CE+TS and my method (one table)."""':
        "test_the_study_ladder_and_space_recipes_pass_every_check",
    "# my_ladder.yaml: a Stage-I ladder": "test_the_study_ladder_and_space_recipes_pass_every_check",
    "# search_spaces/my_method.yaml": "test_the_study_ladder_and_space_recipes_pass_every_check",
}
NOT_RUN = {
    '[project.entry-points."calib.plugins"]': "a package's pyproject.toml: tests/plugins/test_plugins.py installs one",
    'torch.save({"train_features": h_train, "train_labels": y_train,   # h: (N, d) float, y: (N,) int64':
        "a fragment on the reader's tensors; tests/artifacts cover the features file format",
    '"""MyData (Author et al. YEAR): layout, split and transforms, docs/methods.md §8."""':
        "the loader's body is the reader's (their files); tests/datasets cover each shipped dataset",
    'OOD_SETS.register("my-ood")(OODSet(load=_load_my_ood, require=_require_my_ood,':
        "one line in calib/datasets/ood.py around the reader's loaders",
    "@pytest.mark.ray": "a test of the §5 study on the helpers of tests/studies (run_script, TINY); the study script "
                        "itself passes --check-only here",
}


def _blocks() -> list[str]:
    """The first line of each fenced code block of docs/extending.md."""
    text = (REPO / "docs" / "extending.md").read_text()
    return [block.strip().splitlines()[0].strip() for block in re.findall(r"^\s*```\w*\n(.*?)```", text, re.M | re.S)]


def test_every_block_of_the_page_is_run_or_says_why():
    blocks = _blocks()
    assert len(blocks) == len(set(blocks)) and not set(RUN_HERE) & set(NOT_RUN)
    assert sorted(blocks) == sorted({**RUN_HERE, **NOT_RUN})


def _study(script: str, *args: str, env: dict, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """The study script of this checkout, run from ``cwd`` (Ray's local workers put the driver's working directory
    first on their ``sys.path``: run from this checkout, they would import its calib)."""
    return subprocess.run([sys.executable, str(REPO / "studies" / script), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def test_the_copy_is_what_the_scripts_import(extended):
    root, _, env = extended
    out = subprocess.run([sys.executable, str(REPO / "studies" / "report.py"), "--help"], capture_output=True,
                         text=True, env={**env, "PYTHONVERBOSE": "1"}, cwd=REPO)
    # a study script (its folder first on sys.path, then PYTHONPATH) imports the copy, not this checkout's calib
    assert f"{root / 'calib' / '__init__.py'}" in out.stderr and f"{REPO / 'calib' / '__init__.py'}" not in out.stderr


@pytest.mark.parametrize(("script", "labels"), [
    ("posthoc.py", ["HalfTS", "ThirdTS", "MyCal"]),
    ("compare_methods.py", ["CE+HalfTS", "BrierLoss", "RidgeHead", "CE+ThirdTS", "BrierPlugin", "RidgePlugin",
                            "MyLoss", "MyMethod", "CE+MyCal", "InputNoise"]),
    ("calibrate.py", ["HalfTS", "RidgeHead", "ThirdTS", "RidgePlugin", "MyMethod", "MyCal"]),
])
def test_each_is_a_methods_choice(extended, script, labels):
    root, plugin, env = extended
    out = _study(script, "--help", "--plugin", str(plugin), env=env, cwd=root, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    help_text = " ".join(out.stdout.split())
    for label in labels:
        assert f" {label}," in help_text or f" {label} " in help_text or f" {label})" in help_text, label


RECIPE_TESTS = {"tests/losses/test_loss_my_loss.py": 4, "tests/methods/test_method_my_method.py": 1,
                "tests/posthoc/test_posthoc_my_calibrator.py": 2}  # each test file of the page: its tests


def test_each_recipe_of_the_docs_passes_its_own_tests(extended):
    """docs/extending.md's loss, method and calibrator (in the copy since the fixture) and their test files, as the
    page writes them, in one pytest run; the method's uses the ``make_config`` fixture of tests/conftest.py, copied
    beside them."""
    root, _, env = extended
    tests = root / "recipe_tests"
    tests.mkdir()
    for fixtures in ("conftest.py", "trial_fixtures.py"):
        shutil.copy(REPO / "tests" / fixtures, tests)
    for test_file in RECIPE_TESTS:
        (tests / Path(test_file).name).write_text(_recipe(f"`{test_file}`"))
    inner = {k: v for k, v in env.items() if k != "PYTEST_ADDOPTS"}  # the options of the run around it are not its
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tests)],
                         capture_output=True, text=True, env=inner, cwd=root, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    for test_file, count in RECIPE_TESTS.items():
        assert len(re.findall(rf"^PASSED \S*{Path(test_file).name}::", out.stdout, re.M)) == count, test_file


def _python(code: str, *, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_the_plugin_and_the_architecture_recipes_build_their_models(extended, tmp_path):
    """§0's plugin file, named as a ``--plugin`` module, and §4's architecture, a module of the copy's
    ``calib/models`` with the import line the recipe adds: each model is registered, and its logits are its head of
    its features."""
    root, _, env = extended
    plugin = tmp_path / "calib_plugin.py"
    plugin.write_text(_recipe("## 0. A plugin"))
    models = tmp_path / "with_my_net"
    shutil.copytree(root / "calib", models / "calib")
    (models / "calib" / "models" / "my_net.py").write_text(_recipe("## 4. An architecture"))
    with (models / "calib" / "models" / "__init__.py").open("a") as init:
        init.write("from calib.models import my_net  # noqa: E402, F401\n")
    check = ("model = create_model({name!r}, num_classes=10); h = model.features(x); "
             "assert h.shape == (2, {width}) and torch.equal(model(x), model.head(h)); print({name!r}, 'ok'); ")
    out = _python("import torch; from calib.models import create_model; from calib.plugins import use_plugin; "
                  f"use_plugin({str(plugin)!r}); x = torch.randn(2, 3, 32, 32); "
                  + check.format(name="my_plugin_net", width=64) + check.format(name="my_net", width=256),
                  env={**env, "PYTHONPATH": str(models)}, cwd=tmp_path)
    assert out.stdout.split() == ["my_plugin_net", "ok", "my_net", "ok"], out.stderr[-3000:]


@pytest.mark.parametrize(("recipe", "command"), [
    ("studies/my_study.py", ["my_study.py"]),
    ("## 6. An ablation ladder",
     [str(REPO / "studies" / "ablation.py"), "--ladder", "my_ladder.yaml", "--mode", "incremental"]),
    ("## 7. A search space",
     [str(REPO / "studies" / "search.py"), "--space", "my_method.yaml", "--num-trials", "20",
      "--objective", "val_ece"]),
], ids=["study", "ladder", "search_space"])
def test_the_study_ladder_and_space_recipes_pass_every_check(extended, tmp_path, recipe, command):
    """§5's study script (its rows on §2's method), §6's ladder and §7's search space (on §2's method), as the page
    writes them, pass every check a run makes before Ray starts (``--check-only``)."""
    _, _, env = extended
    if recipe.startswith("#"):
        (tmp_path / command[2]).write_text(_recipe(recipe, "yaml"))  # the file --ladder or --space names
    else:
        (tmp_path / "my_study.py").write_text(_recipe(recipe))
    out = subprocess.run([sys.executable, *command, "--store", str(tmp_path / "results"), "--seeds", "1",
                          "--epochs", "2", "--check-only"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "checked: " in out.stdout and "nothing was started (--check-only)" in out.stdout, out.stdout[-2000:]
    assert not (tmp_path / "results").exists()


@pytest.mark.ray
def test_each_runs_and_shows_in_the_tables(extended, tmp_path):
    root, plugin, env = extended
    store = tmp_path / "results"
    rows = ["Vanilla", "CE+HalfTS", "BrierLoss", "RidgeHead", "CE+ThirdTS", "BrierPlugin", "RidgePlugin",
            "MyLoss", "MyMethod", "CE+MyCal", "InputNoise"]  # the last four: docs/extending.md's recipes
    out = _study("compare_methods.py", "--store", str(store), "--plugin", str(plugin), "--methods", *rows,
                 "--seeds", "1", "--epochs", "2", env=env, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    for label in rows:
        assert f"| {label} |" in out.stdout, label
    trials = pd.read_parquet(store / "trials")
    assert (trials["status"] == "ok").all() and sorted(trials["label"]) == sorted(rows)
    by_label = trials.set_index("label")
    assert by_label.loc["CE+HalfTS", "method"] == "half_ts" and by_label.loc["CE+HalfTS", "method_temperature"] == 2
    assert by_label.loc["CE+ThirdTS", "method_temperature"] == 3 and by_label.loc["BrierLoss", "loss"] == "brier_loss"
    assert by_label.loc["RidgePlugin", "method"] == "ridge_plugin" and by_label.loc["BrierPlugin", "loss_weight"] == 1
    assert by_label.loc["CE+ThirdTS", "plugins"].tolist()[0].startswith("my_extensions sha256:")
    assert by_label.loc["MyLoss", "loss"] == "my_loss" and by_label.loc["MyLoss", "loss_penalty_weight"] == 0.5
    assert by_label.loc["MyMethod", "method"] == "my_method" and by_label.loc["MyMethod", "method_lr"] == 0.1
    assert by_label.loc["CE+MyCal", "method_num_temperatures"] == 100
    # §1.1's training procedure: its row trained Stage I with its switch at the row's value, the others without it
    assert by_label.loc["InputNoise", "stage1_input_noise_std"] == 0.1
    assert by_label.drop("InputNoise")["stage1_input_noise_std"].isna().all()
    # a temperature (fixed, or the recipe's from its grid) keeps the argmax: the accuracy of the CE Stage I
    vanilla = by_label.loc["Vanilla", "test_accuracy"]
    assert by_label.loc["CE+HalfTS", "test_accuracy"] == vanilla == by_label.loc["CE+ThirdTS", "test_accuracy"]
    assert by_label.loc["CE+MyCal", "test_accuracy"] == vanilla
