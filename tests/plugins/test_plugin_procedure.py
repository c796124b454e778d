"""A Stage-I training procedure as one ``--plugin`` file (docs/extending.md §1.1, its code block as the page writes
it): its row is a ``compare_methods.py --methods`` choice that passes ``--check-only`` (every trial config of the
row parsed and validated), and a bad value of its ``stage1`` key is one ``error:`` line naming key and value."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def plugin(tmp_path) -> Path:
    """docs/extending.md §1.1's procedure, written as a --plugin file."""
    text = (REPO / "docs" / "extending.md").read_text()
    section = text[text.index("### 1.1 A Stage-I training procedure"):]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    path = tmp_path / "input_noise_plugin.py"
    path.write_text(block.group(1))
    return path


def _check_only(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "studies" / script), *args, "--seeds", "1",
                           "--epochs", "2", "--check-only"], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_its_row_is_a_methods_choice_and_its_key_is_checked(plugin, tmp_path):
    store = str(tmp_path / "results")
    out = _check_only("compare_methods.py", "--plugin", str(plugin), "--methods", "Vanilla", "InputNoise",
                      "--store", store, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "nothing was started (--check-only)" in out.stdout
    # the key set on a study whose rows do not vary it (compare_methods refuses a --set of a key its rows vary)
    bad = _check_only("sensitivity_gamma.py", "--plugin", str(plugin), "--set", "stage1.input_noise_std=-1",
                      "--store", store, cwd=tmp_path)
    errors = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and len(errors) == 1, bad.stderr[-3000:]
    assert errors[0].startswith("error: ") and "`stage1.input_noise_std` must be > 0, or null to train without input " \
        "noise, got stage1.input_noise_std=-1.0." in errors[0]
    assert not Path(store).exists()
