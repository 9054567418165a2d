"""Engine fixtures for the metadata suite.

Every test that takes ``engine`` (a fresh, empty :class:`~tierd.meta.kv.KVStore`), ``store`` (a
:class:`~tierd.meta.store.MetaStore` over it) or ``engines`` (a factory, for tests that need
several fresh engines or must reopen one) runs once per entry of :data:`ENGINES`.

To run the whole suite against a new engine, add one entry to :data:`ENGINES`: a function that
opens the engine at a location (a fresh temporary directory it may use or ignore) and whether
the data survives a close and reopen at that location.

The ``pg`` engines run against a real PostgreSQL server the session starts once
(:mod:`tests.meta.pg_server`), each engine in a fresh schema of its own.  Without PostgreSQL
installed they are skipped, except under ``CI`` (dev.sh installs it), where they fail.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nsplacement import close_namespace, open_namespace

from tierd.meta.group_engine import GroupCommitStore
from tierd.meta.kv import KVStore
from tierd.meta.lmdb_engine import LmdbStore
from tierd.meta.memory_engine import MemoryStore
from tierd.meta.pg_engine import PgStore
from tierd.meta.store import MetaStore
from tierd.namespace import Namespace
from tierd.namespace.remote import follow

from .pg_server import PgServer, find_bindir


@dataclass(frozen=True)
class EngineSpec:
    open: Callable[[Path], KVStore]
    # True: closing and opening again at the same location finds the data (a disk engine).
    # False: the data lives in the engine object; "reopening" hands back the same object.
    persistent: bool
    # True: needs the session's PostgreSQL server (the pg_server fixture)
    pg: bool = False


#: the session's PostgreSQL server, once the pg_server fixture started it
_PG: list[PgServer] = []


def _pg_url(path: Path) -> str:
    return _PG[0].url(str(path))


ENGINES: dict[str, EngineSpec] = {
    "lmdb": EngineSpec(open=lambda path: LmdbStore(path), persistent=True),
    "memory": EngineSpec(open=lambda path: MemoryStore(), persistent=False),
    # the daemon's default: lmdb behind group commit
    "group-lmdb": EngineSpec(
        open=lambda path: GroupCommitStore(LmdbStore(path, metasync=True)), persistent=True
    ),
    "pg": EngineSpec(open=lambda path: PgStore(_pg_url(path)), persistent=True, pg=True),
    "group-pg": EngineSpec(
        open=lambda path: GroupCommitStore(PgStore(_pg_url(path))), persistent=True, pg=True
    ),
}


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server for the whole session (fsync off: the tests kill clients, never
    the machine, and a commit still waits for the server's write)."""
    bindir = find_bindir()
    if bindir is None:
        why = ("PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin):"
               " `./dev.sh setup` installs Debian's postgresql package")
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    server = PgServer(bindir, fsync=False)
    _PG.append(server)
    try:
        yield server
    finally:
        _PG.remove(server)
        server.stop()


@dataclass
class EngineFactory:
    """Opens fresh engines of one kind; closes whatever is still open at teardown."""

    name: str
    spec: EngineSpec
    base: Path
    _open: list[KVStore] = field(default_factory=list)
    _paths: dict[int, Path] = field(default_factory=dict)
    _count: int = 0

    @property
    def persistent(self) -> bool:
        return self.spec.persistent

    def new(self) -> KVStore:
        """A new, empty engine."""
        self._count += 1
        path = self.base / f"{self.name}-{self._count}"
        engine = self.spec.open(path)
        self._open.append(engine)
        self._paths[id(engine)] = path
        return engine

    def reopen(self, engine: KVStore) -> KVStore:
        """The same data through a new handle: close and open again for a persistent engine,
        the very same object otherwise."""
        if not self.persistent:
            return engine
        path = self._paths.pop(id(engine))
        self.close(engine)
        again = self.spec.open(path)
        self._open.append(again)
        self._paths[id(again)] = path
        return again

    def close(self, engine: KVStore) -> None:
        if engine in self._open:
            self._open.remove(engine)
            engine.close()

    @contextmanager
    def fresh(self) -> Iterator[KVStore]:
        """A new empty engine for one block (one hypothesis example), closed afterwards."""
        engine = self.new()
        try:
            yield engine
        finally:
            self.close(engine)

    @contextmanager
    def fresh_store(self) -> Iterator[MetaStore]:
        with self.fresh() as engine:
            yield MetaStore(engine)

    def close_all(self) -> None:
        for engine in list(self._open):
            self.close(engine)


@pytest.fixture(params=sorted(ENGINES))
def engines(request: pytest.FixtureRequest) -> Iterator[EngineFactory]:
    name: str = request.param
    if ENGINES[name].pg:
        request.getfixturevalue("pg_server")
    # Not tmp_path: hypothesis tests open many engines per test function, and a directory of
    # our own is cleaned up at once rather than kept for pytest's last three runs.
    with tempfile.TemporaryDirectory(prefix=f"tierd-meta-{name}-") as base:
        factory = EngineFactory(name, ENGINES[name], Path(base))
        try:
            yield factory
        finally:
            factory.close_all()


@pytest.fixture
def engine(engines: EngineFactory) -> KVStore:
    return engines.new()


@pytest.fixture
def store(engine: KVStore) -> MetaStore:
    return MetaStore(engine)


@pytest.fixture
def pg_nodes(pg_server: PgServer, tmp_path: Path) -> Iterator[Callable[[str], MetaStore]]:
    """Open a :class:`MetaStore` of node ``name`` on one fresh PostgreSQL namespace (each
    call another node of the same cluster, with its own cache); all closed at the end."""
    url = pg_server.url(str(tmp_path))
    opened: list[MetaStore] = []

    def open_node(node: str) -> MetaStore:
        m = MetaStore(PgStore(url, node=node), node)
        opened.append(m)
        return m
    yield open_node
    for m in opened:
        m.close()


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Poll ``cond`` until it is true; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.fixture
def two_nodes(pg_server: PgServer, tmp_path: Path
              ) -> Iterator[tuple[list[MetaStore], list[Namespace], asyncio.AbstractEventLoop]]:
    """Two namespaces on one database, as two nodes on one loop; n1 follows the feed."""
    url = pg_server.url(str(tmp_path))
    metas = [MetaStore.open_pg(url, node=n) for n in ("n1", "n2")]
    loop = asyncio.new_event_loop()
    nss: list[Namespace] = []
    stop: Callable[[], None] | None = None
    try:
        for i, meta in enumerate(metas):
            nss.append(loop.run_until_complete(open_namespace(meta, tmp_path / f"n{i + 1}")))
        stop = follow(nss[0], metas[0].engine, loop)
        feed = metas[0].engine._feeds[0]  # type: ignore[attr-defined]
        wait_until(feed.ready.is_set, "the feed never listened")
        yield metas, nss, loop
    finally:
        if stop is not None:
            stop()
        for ns in nss:
            loop.run_until_complete(close_namespace(ns))
        loop.close()
        for meta in metas:
            meta.close()
