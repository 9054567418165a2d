"""The layers hold: doors call the namespace only through its declared API.

Read from the sources (``ast``), not by importing them, so a violation in a module no test
imports is caught too:

* a door (the FUSE mount, the S3 gateway, the admin API, the checkpoint service, the memory
  pool and the client tools) imports from the namespace only ``tierd.namespace``,
  ``tierd.namespace.api`` and the name rules of ``tierd.namespace.names`` -- never another
  namespace module, and never a metadata engine;
* no module outside ``tierd/namespace`` touches a namespace's private state
  (``ns._anything``) or the store, hot files and placement engine behind it
  (``ns.meta``, ``ns.hot``, ``ns.placement``);
* what a door calls on a namespace is declared in
  :class:`tierd.namespace.api.NamespaceAPI`;
* the memory pool does not import the checkpoint service built on it.

Each check is also run on a small planted violation, so a checker that finds nothing
because it looks at nothing fails here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierd.namespace.api import iter_api_methods

ROOT = Path(__file__).resolve().parents[1]
DOORS = ("fuse", "tierd/s3", "tierd/admin", "tierd/checkpoint", "tierd/mempool", "clients")
#: what outside tierd/namespace is checked for reaching behind a namespace
SOURCES = ("tierd", "fuse", "clients")
PUBLIC = frozenset({"tierd.namespace", "tierd.namespace.api", "tierd.namespace.names"})
#: the metadata engines (every ``tierd/meta/*_engine.py``: a new one is covered too) and
#: the key-value layer under them
ENGINES = frozenset({f"tierd.meta.{p.stem}" for p in (ROOT / "tierd/meta").glob("*_engine.py")}
                    | {"tierd.meta.kv"})
#: attributes of a namespace that are the namespace's own business
BEHIND = frozenset({"meta", "hot", "placement"})
#: names a namespace is held under: ``ns``, ``namespace``, and ``<anything>.ns``
HOLDERS = frozenset({"ns", "namespace"})
API = frozenset(iter_api_methods())


def _files(*dirs: str) -> Iterator[Path]:
    for d in dirs:
        yield from sorted((ROOT / d).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _imported(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Absolute module names a module imports (``from tierd.namespace import versions``
    counts as importing the submodule ``tierd.namespace.versions``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            base = ROOT.joinpath(*node.module.split("."))
            for alias in node.names:
                sub = base / alias.name
                if sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file():
                    yield node.lineno, f"{node.module}.{alias.name}"


def import_violations(source: str, where: str) -> list[str]:
    """A door's imports that reach behind the namespace API or into a metadata engine."""
    found = []
    for line, mod in _imported(ast.parse(source)):
        if mod.startswith("tierd.namespace") and mod not in PUBLIC:
            found.append(f"{where}:{line} imports {mod} (use tierd.namespace.api)")
        if mod in ENGINES or mod.startswith("lmdb"):
            found.append(f"{where}:{line} imports the metadata engine {mod}")
    return found


def _holds_namespace(node: ast.expr) -> bool:
    return ((isinstance(node, ast.Name) and node.id in HOLDERS)
            or (isinstance(node, ast.Attribute) and node.attr in HOLDERS))


def reach_violations(source: str, where: str, *, door: bool) -> list[str]:
    """Uses of a namespace's private state or of what stands behind it; in a door, also
    any call the API does not declare."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
                and _holds_namespace(node.args[0]) and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            name = node.args[1].value  # getattr(ns, "_handles"): the same reach, spelled out
            if name.startswith("_") or name in BEHIND:
                found.append(f"{where}:{node.lineno} touches {ast.unparse(node)}")
            continue
        if not isinstance(node, ast.Attribute) or not _holds_namespace(node.value):
            continue
        name = node.attr
        if name.startswith("_") or name in BEHIND:
            found.append(f"{where}:{node.lineno} touches {ast.unparse(node)}")
        elif door and name not in API:
            found.append(f"{where}:{node.lineno} calls {ast.unparse(node)}, which "
                         "NamespaceAPI does not declare")
    return found


def _door(rel: str) -> bool:
    return any(rel == d or rel.startswith(d + "/") for d in DOORS)


def test_doors_import_only_the_namespace_api() -> None:
    found = []
    for path in _files(*DOORS):
        found += import_violations(path.read_text(), _rel(path))
    assert not found, "\n".join(found)


def test_nothing_outside_the_namespace_reaches_behind_it() -> None:
    found = []
    for path in _files(*SOURCES):
        rel = _rel(path)
        if rel.startswith("tierd/namespace/"):
            continue
        found += reach_violations(path.read_text(), rel, door=_door(rel))
    assert not found, "\n".join(found)


def test_the_pool_does_not_import_checkpoints() -> None:
    """The checkpoint service is built on the pool (regions, the socket server); the pool
    knows nothing of it (the memory door that starts both is ``tierd/checkpoint/door.py``)."""
    found = [f"{_rel(path)}:{line} imports {mod}"
             for path in _files("tierd/mempool")
             for line, mod in _imported(ast.parse(path.read_text()))
             if mod.startswith("tierd.checkpoint")]
    assert not found, "\n".join(found)


def test_the_api_declares_what_doors_call() -> None:
    """The list the door check compares against is the Protocol's, and not empty."""
    assert {"sync", "open", "read", "put_object", "advise_read", "unsubscribe",
            "open_held", "import_prefix"} <= API
    assert not any(n.startswith("_") for n in API)


@pytest.mark.parametrize(("source", "what"), [
    ("from tierd.namespace.objects import ObjectOps\n", "imports tierd.namespace.objects"),
    ("from tierd.namespace import versions\n", "imports tierd.namespace.versions"),
    ("import tierd.namespace.base\n", "imports tierd.namespace.base"),
    ("from tierd.meta.lmdb_engine import LmdbKV\n", "metadata engine"),
    ("from tierd.meta.pg_engine import PgStore\n", "metadata engine"),
])
def test_import_check_finds_a_planted_violation(source: str, what: str) -> None:
    found = import_violations(source, "planted.py")
    assert found and what in found[0], found


@pytest.mark.parametrize(("source", "what"), [
    ("ns._handles[3].ofile.fd\n", "touches ns._handles"),
    ("await self.ns._sync_meta()\n", "touches self.ns._sync_meta"),
    ("with svc.ns.meta.snapshot() as tx: pass\n", "touches svc.ns.meta"),
    ("path = d.ckpt.ns.hot.path(3)\n", "touches d.ckpt.ns.hot"),
    ("p = self.namespace.placement\n", "touches self.namespace.placement"),
    ("h = getattr(self.ns, '_handles', {})\n", "touches getattr(self.ns, '_handles', {})"),
    ("p = getattr(self.ops.ns, 'placement', None)\n", "touches getattr(self.ops.ns"),
    ("ns.min_part_size = 5\n", "does not declare"),
])
def test_reach_check_finds_a_planted_violation(source: str, what: str) -> None:
    found = reach_violations(source, "planted.py", door=True)
    assert found and what in found[0], found


def test_the_api_calls_pass() -> None:
    source = "await ctx.ns.get_bucket('b')\nns.advise_read(3, 0, 4096)\n"
    assert reach_violations(source, "door.py", door=True) == []
