"""The documentation: a short README over a site of one-subject pages in docs/, every page reachable from the README
or the docs index, the site's navigation complete, and every script the pages name present."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README_MAX_LINES = 250
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _links(path: Path) -> set[str]:
    """The relative link targets of a Markdown file (no web addresses), as paths relative to the repository."""
    targets = set()
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if "://" not in target:
            targets.add((path.parent / target).resolve().relative_to(REPO).as_posix())
    return targets


def _pages() -> set[str]:
    return {p.relative_to(REPO).as_posix() for p in DOCS.glob("*.md")}


def test_the_readme_is_at_most_250_lines():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


def test_every_docs_page_is_reachable_from_the_readme_or_the_docs_index():
    reachable = _links(REPO / "README.md") | _links(DOCS / "index.md")
    assert "docs/index.md" in _links(REPO / "README.md")
    assert _pages() - {"docs/index.md"} <= reachable, sorted(_pages() - reachable)


def test_every_link_of_the_readme_and_the_index_names_a_file_that_exists():
    for source in (REPO / "README.md", DOCS / "index.md"):
        missing = sorted(t for t in _links(source) if not (REPO / t).exists())
        assert not missing, (source.name, missing)


def _nav_pages(node) -> set[str]:
    if isinstance(node, str):
        return {node}
    if isinstance(node, dict):
        return set().union(*(_nav_pages(v) for v in node.values()))
    return set().union(*(_nav_pages(v) for v in node))


def test_the_site_navigation_lists_every_page():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs" and config["strict"] is True
    assert {f"docs/{p}" for p in _nav_pages(config["nav"])} == _pages()


def test_every_script_the_readme_and_the_pages_name_exists():
    """bench/ and studies/ scripts named in the README and the pages (not the decision log, which records history)."""
    script = re.compile(r"(?<![\w/.-])((?:bench|studies)/\w+\.(?:py|sh))\b")
    sources = [REPO / "README.md", *(p for p in DOCS.glob("*.md") if p.name != "decision_log.md")]
    named = {(s.name, m) for s in sources for m in script.findall(s.read_text(encoding="utf-8"))}
    assert named, "no script named at all: the pattern no longer matches the pages"
    missing = sorted((name, m) for name, m in named if not (REPO / m).is_file())
    assert not missing, missing


def test_the_site_builds_strictly(tmp_path):
    """What CI runs: a broken link, a missing anchor or a page left out of the navigation fails the build."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
