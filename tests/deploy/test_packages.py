"""Every package of the source tree is in pyproject.toml's package list.

The list is explicit (the fuse/ and clients/ directories install under other names), so a
new subpackage that is not added installs nowhere in a wheel or the Docker image, while an
editable install of a working tree still finds it: only a check of the list catches it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_subpackage_is_listed() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    found = {"tierd"} | {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "tierd").rglob("__init__.py") if "__pycache__" not in p.parts}
    assert found - listed == set(), f"pyproject.toml does not list {sorted(found - listed)}"
    for name, where in (("tierd_fuse", "fuse"), ("tierd_client", "clients")):
        assert name in listed and (ROOT / where / "__init__.py").exists()
        subs = [p for p in (ROOT / where).glob("*/__init__.py")]
        assert subs == [], f"{where}/ has subpackages the package list does not name: {subs}"
