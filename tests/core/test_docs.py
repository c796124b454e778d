"""The docs a user gets with the repository: every reference to them resolves, nothing points outside it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ["README.md", "docs", "calib", "studies", "benchmarks", "search_spaces", "cluster.yaml", "tests"]


def shipped_files():
    for name in SHIPPED:
        path = ROOT / name
        for file in [path] if path.is_file() else sorted(path.rglob("*")):
            if file.suffix in {".py", ".md", ".yaml", ".yml", ".toml"} and "__pycache__" not in file.parts:
                yield file


def headings(doc: str) -> set[str]:
    """Section numbers of ``docs/<doc>``: "1", "1.3", "6.6", ..."""
    text = (ROOT / "docs" / doc).read_text()
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, flags=re.M))


def test_nothing_shipped_refers_to_files_a_clone_does_not_have():
    offenders = [f"{file.relative_to(ROOT)}:{n}" for file in shipped_files() if file.name != "test_docs.py"
                 for n, line in enumerate(file.read_text().splitlines(), 1)
                 if "../shared" in line or re.search(r"(?<!docs/)\b(METHODS|DESIGN)\.md", line)]
    assert offenders == []


def test_every_cited_section_of_the_methods_doc_exists():
    sections = headings("methods.md")
    assert {"1.3", "1.6", "5.1", "6.6", "7.2", "9"} <= sections
    cited = {}
    for file in shipped_files():
        for match in re.finditer(r"docs/methods\.md §\s?(\d+(?:\.\d+)?)(?:\s?[-–]\s?(\d+(?:\.\d+)?))?",
                                 file.read_text()):
            for section in filter(None, match.groups()):
                cited.setdefault(section, file.relative_to(ROOT))
    assert cited, "code cites the methods doc"
    missing = {section: str(where) for section, where in cited.items() if section not in sections}
    assert missing == {}


def test_the_readme_links_the_docs_and_the_docs_link_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    for doc in ("docs/methods.md", "docs/architecture.md", "docs/extending.md"):
        assert doc in readme and (ROOT / doc).is_file()
    for doc in (ROOT / "docs").rglob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} links {target}, which does not exist"
