"""The docs stand on the repository alone: every relative link in docs/ and README.md
reaches a file inside it (and a heading, for #anchors), every path into the repository a
doc names -- in backticks or in prose -- is a file or folder that is committed (not an
output the runs write, such as bench/results/, nor a file outside the repository, such as
a design document only the developers have), and no doc cites an issue or pull-request
number (a reader has no access to the tracker: the docs say what they mean instead)."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`((?:tierd|fuse|clients|tests|bench|deploy)/[\w./-]*?)(?:::\w+)?`")
#: a path into the repository anywhere in the prose (``../`` included): top-level folders
#: of the repository, and ``shared/``, where developers' notes outside it used to be cited
REPO_PATH = re.compile(
    r"(?<![\w./~$@:-])((?:\.\./)*(?:tierd|fuse|clients|tests|bench|deploy|docs|shared|\.ci)"
    r"/[\w./-]*)")
#: a Markdown file named without a folder (``DESIGN.md``, ``placement.md``)
MD_NAME = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")
#: ``#12``, ``issue 7``, ``issues #3 and #4``, ``PR 12``
ISSUE = re.compile(r"(?<![\w&/#`(\[])#\d+\b|\b(?:issues?|PRs?|pull requests?)\s+#?\d+",
                   re.IGNORECASE)


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


@cache
def ignored(path: Path) -> bool:
    """Whether git ignores ``path`` (an output such as bench/results/ or .venv/: present
    here, absent from a fresh clone).  Outside a git checkout nothing is."""
    done = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT,
                          capture_output=True)
    return done.returncode == 0


def in_repository(path: Path) -> str | None:
    """Why ``path`` is not a committed part of the repository, or None."""
    path = path.resolve()
    if not path.is_relative_to(ROOT):
        return "outside the repository"
    if not path.exists():
        return "missing"
    if ignored(path):
        return "not committed (ignored by git: an output of a run)"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        why = in_repository(dest)
        assert why is None, f"{page.name}: link to {target}: {why}"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_named_source_paths_exist(page: Path) -> None:
    for path in CODE_PATH.findall(prose(page)):
        if any(c in path for c in "*<>{"):
            continue  # patterns
        why = in_repository(ROOT / path.rstrip("."))
        assert why is None, f"{page.name}: names {path}: {why}"


def repo_paths(text: str) -> list[str]:
    """The paths into the repository ``text`` names (patterns such as ``test_*.py`` and
    ``<run>`` left out)."""
    out = []
    for m in REPO_PATH.finditer(text):
        path = m.group(1).rstrip(".,;:")
        if text[m.end():m.end() + 1] in ("*", "<", "{"):
            continue
        # one bare word after the folder is prose ("the ratio tierd/baseline"), not a path:
        # a path ends in "/", names a file with a suffix, or goes two folders deep
        if not (path.endswith("/") or "." in path.rsplit("/", 1)[-1]
                or path.lstrip("./").count("/") >= 2):
            continue
        out.append(path)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_in_the_prose_is_in_the_repository(page: Path) -> None:
    text = prose(page)
    for path in repo_paths(text):
        base = ROOT if not path.startswith("../") else page.parent
        why = in_repository(base / path)
        assert why is None, f"{page.name}: names {path}: {why}"
    for name in MD_NAME.findall(text):
        found = [d / name for d in (page.parent, ROOT, ROOT / "docs") if (d / name).exists()]
        assert found, f"{page.name}: names {name}, which is not in the repository"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_issue_numbers(page: Path) -> None:
    found = ISSUE.findall(page.read_text())
    assert not found, f"{page.name} cites issue numbers {found}: say what they stood for"


def test_the_checks_catch_what_they_should() -> None:
    assert repo_paths("method in `../shared/BENCHMARKING.md`, JSON in bench/results/x.json, "
                      "see docs/fuse.md. tests/fuse/test_*.py, /etc/tierd/tierd.env, "
                      "the ratio tierd/baseline, deploy/monitoring/ and tierd/admin/x") == [
        "../shared/BENCHMARKING.md", "bench/results/x.json", "docs/fuse.md",
        "deploy/monitoring/", "tierd/admin/x"]
    assert in_repository(ROOT / "docs" / "../../shared/DESIGN.md") == "outside the repository"
    assert in_repository(ROOT / "DESIGN.md") == "missing"
    assert in_repository(ROOT / ".venv") in ("missing", "not committed (ignored by git: an "
                                                         "output of a run)")
    assert ISSUE.findall("(issue #4) for #12, issue 7, Issues 3; not x.md#a-2, &#160;, [#x]") \
        == ["issue #4", "#12", "issue 7", "Issues 3"]
    assert MD_NAME.findall("DESIGN.md's limit, see placement.md, not docs/fuse.md") == [
        "DESIGN.md", "placement.md"]


def test_readme_documentation_list_links_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    linked = {m for m in re.findall(r"\]\(docs/([\w.-]+\.md)\)", section)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "README's Documentation list misses these docs/ pages"
