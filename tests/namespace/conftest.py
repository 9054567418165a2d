"""Fixtures for the namespace suites.

The namespace API is async; these tests stay synchronous (pytest-asyncio is not used).  The
``nsenv`` fixture owns one event loop and one :class:`~tierd.namespace.Namespace` over a fresh
lmdb store and data directory; ``nsenv.run(coro)`` drives a call to completion on that loop, and
``nsenv.err(errno, coro)`` asserts that the call fails with exactly that errno.

Every test that takes ``nsenv`` or ``nsenv_factory`` runs once per placement of
:data:`nsplacement.PLACEMENTS` (``hot-only`` and ``file-cold``), as the daemon always gives
its namespace one; ``nsenv.placement`` names it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import tempfile
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from nsplacement import PLACEMENTS, abandon_namespace, close_namespace, open_namespace

from tierd.acl import Identity
from tierd.meta import MetaStore
from tierd.namespace import ROOT_INO, FsError, Namespace

T = TypeVar("T")

ROOT = Identity.ROOT
ALICE = Identity(1000, 1000)
BOB = Identity(1001, 1001)
# carol's primary group is her own; she is in alice's group only as a supplementary group
CAROL = Identity(1002, 1002, frozenset({1000}))
# dave shares alice's primary group
DAVE = Identity(1003, 1000)


def errname(code: int | None) -> str:
    return errno.errorcode.get(code or 0, str(code))


async def chunks(data: bytes, size: int = 7) -> AsyncIterator[bytes]:
    """An async body for put_object, in small uneven chunks."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


class NsEnv:
    """A namespace on a fresh data directory, with a private event loop."""

    def __init__(self, base: Path, engine: str = "lmdb", placement: str = "hot-only") -> None:
        self.base = base
        self.engine = engine
        self.placement = placement
        self.loop = asyncio.new_event_loop()
        self.store: MetaStore | None = None
        self._abandoned: list[Namespace] = []  # by crash_reopen: kept from the collector
        self.ns: Namespace = self._open()

    # -- lifecycle -------------------------------------------------------------------------
    def _open(self) -> Namespace:
        if self.engine == "lmdb":
            self.store = MetaStore.open_lmdb(self.base / "meta")
        else:
            self.store = MetaStore.open_memory()
        return self.run(open_namespace(self.store, self.base, self.placement, umask=0o022))

    def reopen(self) -> Namespace:
        """Close the namespace (and its store) and open it again on the same directory."""
        assert self.engine == "lmdb", "only a persistent engine can be reopened"
        self._close_ns()
        self.ns = self._open()
        return self.ns

    def crash_reopen(self) -> Namespace:
        """Open the data directory again as after a crash: the running namespace is abandoned
        without ``close`` (its handles are never released); only the store is closed, which
        keeps every committed transaction, as a killed process would."""
        assert self.engine == "lmdb" and self.store is not None
        self._abandoned.append(self.ns)
        self.run(abandon_namespace(self.ns))
        self.store.close()
        self.store = None
        self.ns = self._open()
        return self.ns

    def _close_ns(self) -> None:
        self.run(close_namespace(self.ns))
        if self.store is not None:
            self.store.close()  # idempotent if Namespace.close already closed it
            self.store = None

    def close(self) -> None:
        try:
            self._close_ns()
        finally:
            self.loop.close()

    # -- helpers ---------------------------------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def err(self, code: int, coro: Coroutine[Any, Any, Any]) -> FsError:
        """Run ``coro`` and assert it raises :class:`FsError` with errno ``code``."""
        try:
            result = self.run(coro)
        except OSError as exc:
            assert exc.errno == code, f"expected {errname(code)}, got {errname(exc.errno)}: {exc!r}"
            assert isinstance(exc, FsError), f"{exc!r} is not an FsError"
            assert str(exc), "an FsError needs a message"
            return exc
        raise AssertionError(f"expected {errname(code)}, the call returned {result!r}")

    def bucket(self, name: str = "bkt", ident: Identity = ROOT, mode: int = 0o777) -> int:
        """Create bucket ``name`` as a directory of the root with ``mode``; its inode number."""
        inode = self.run(self.ns.mkdir(ident, ROOT_INO, name.encode(), mode))
        if stat.S_IMODE(inode.mode) != mode:  # the umask applied: set the bits exactly
            inode = self.run(self.ns.setattr(ident, inode.ino, mode=mode))
        return inode.ino

    def write_file(
        self, ident: Identity, parent: int, name: bytes, data: bytes, mode: int = 0o644
    ) -> int:
        """Create (or truncate) a file holding ``data``; its inode number."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC

        async def go() -> int:
            inode, fh = await self.ns.create(ident, parent, name, stat.S_IFREG | mode, flags)
            try:
                if data:
                    assert await self.ns.write(fh, 0, data) == len(data)
                await self.ns.flush(fh)
            finally:
                await self.ns.release(fh)
            return inode.ino

        return self.run(go())

    def read_file(self, ident: Identity, ino: int) -> bytes:
        async def go() -> bytes:
            fh = await self.ns.open(ident, ino, os.O_RDONLY)
            try:
                out = b""
                while True:
                    chunk = await self.ns.read(fh, len(out), 1 << 16)
                    if not chunk:
                        return out
                    out += chunk
            finally:
                await self.ns.release(fh)

        return self.run(go())

    def put(self, ident: Identity, bucket: str, key: str, data: bytes, **kw: Any) -> Any:
        return self.run(self.ns.put_object(ident, bucket, key, chunks(data), **kw))

    def get(self, ident: Identity, bucket: str, key: str, **kw: Any) -> bytes:
        async def go() -> bytes:
            r = await self.ns.get_object(ident, bucket, key)
            try:
                return b"".join([c async for c in r.iter(**kw)])
            finally:
                await r.close()

        return self.run(go())

    def names(self, ident: Identity, dir_ino: int, **kw: Any) -> list[bytes]:
        return [n for n, _ in self.run(self.ns.listdir(ident, dir_ino, **kw))]


@pytest.fixture(params=list(PLACEMENTS))
def placement(request: pytest.FixtureRequest) -> str:
    """The placement the namespace runs on (a key of :data:`nsplacement.PLACEMENTS`)."""
    return str(request.param)


@pytest.fixture
def nsenv(placement: str) -> Iterator[NsEnv]:
    with tempfile.TemporaryDirectory(prefix="tierd-ns-") as base:
        env = NsEnv(Path(base), placement=placement)
        try:
            yield env
        finally:
            env.close()


@pytest.fixture
def nsenv_factory(placement: str) -> Iterator[Any]:
    """Several independent namespaces in one test (e.g. one per engine)."""
    envs: list[NsEnv] = []
    with tempfile.TemporaryDirectory(prefix="tierd-ns-") as base:

        def make(engine: str = "lmdb") -> NsEnv:
            env = NsEnv(Path(base) / str(len(envs)), engine, placement)
            envs.append(env)
            return env

        try:
            yield make
        finally:
            for env in envs:
                env.close()


def all_errnos(names: Iterable[str]) -> set[int]:
    return {getattr(errno, n) for n in names}
