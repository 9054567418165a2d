"""Every relative link in docs/ and README.md reaches a file (and a heading, for #anchors),
and every source or test path a doc names in backticks exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`((?:tierd|fuse|clients|tests|bench|deploy)/[\w./-]*?)(?:::\w+)?`")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def prose(page: Path) -> str:
    """The page without fenced code blocks (examples may name files that do not exist)."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to missing {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_named_source_paths_exist(page: Path) -> None:
    for path in CODE_PATH.findall(prose(page)):
        if any(c in path for c in "*<>") or path.startswith("bench/results/"):
            continue  # patterns, and benchmark outputs (written by the runs, not committed)
        assert (ROOT / path.rstrip(".")).exists(), f"{page.name}: names missing {path}"


def test_readme_documentation_list_links_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    linked = {m for m in re.findall(r"\]\(docs/([\w.-]+\.md)\)", section)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "README's Documentation list misses these docs/ pages"
