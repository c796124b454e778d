"""The code docs/architecture.md and docs/extending.md name exists: every repository path (```calib/store/scan.py```,
```tests/losses/```) and every dotted name of calib (``calib.store.scan.winners``). The files and modules the
recipes of extending.md create (``my_*``) are the exception: tests/plugins/test_one_file_extensions.py runs those."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["docs/architecture.md", "docs/extending.md"]
FOLDERS = ("calib", "studies", "tests", "benchmarks", "search_spaces", "tables", "docs")


def recipes_own(name: str) -> bool:
    """A file or module an extending.md recipe creates: its last part starts with ``my_`` or ``test_..._my_``."""
    last = re.split(r"[./]", name.rstrip("/").removesuffix(".py"))[-1]
    return last.startswith("my_") or (last.startswith("test_") and "_my_" in last)


def paths_named(text: str) -> set[str]:
    return set(re.findall(rf"`((?:{'|'.join(FOLDERS)})/[\w./-]*)(?:::\w+)?`", text))


def dotted_names(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w/])(calib(?:\.\w+)+)", text))


def resolves(name: str) -> bool:
    """Whether ``name`` is a module of calib or an attribute of one (``calib.store.scan.winners``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[end:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


@pytest.mark.parametrize("page", PAGES)
def test_every_path_a_page_names_exists(page):
    paths = paths_named((ROOT / page).read_text())
    assert len(paths) > 10
    assert sorted(p for p in paths if not recipes_own(p) and not (ROOT / p.rstrip("/")).exists()) == []


@pytest.mark.parametrize("page", PAGES)
def test_every_dotted_name_a_page_uses_resolves(page):
    names = dotted_names((ROOT / page).read_text())
    assert len(names) > 10
    assert sorted(n for n in names if not recipes_own(n) and not resolves(n)) == []


def test_the_checks_catch_what_is_gone():
    text = "`calib/store/scan.py`, `calib/store/gone.py`, `tests/losses/`, calib.store.scan.winners, calib.store.gone"
    assert sorted(p for p in paths_named(text) if not (ROOT / p.rstrip("/")).exists()) == ["calib/store/gone.py"]
    assert [n for n in sorted(dotted_names(text)) if not resolves(n)] == ["calib.store.gone"]
    assert resolves("calib.store.scan") and not resolves("calib.store.scan.no_such_function")
    assert recipes_own("calib/losses/my_loss.py") and recipes_own("tests/posthoc/test_posthoc_my_calibrator.py")
    assert not recipes_own("calib/losses/focal.py")
