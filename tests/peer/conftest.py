"""Fixtures of the peer door tests: a node's door over a real socket on 127.0.0.1, serving
files held in a dictionary (the daemon's hot tier stands behind the same callback), a real
metadata store for its registry, and a real PostgreSQL server for the shared-store test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from meta.pg_server import PgServer, find_bindir

from tierd.config_parsers import HostPort
from tierd.meta.store import MetaStore
from tierd.peer.door import PeerDoor
from tierd.peer.server import FileSlice, VersionGone

SECRET = "s3cret-of-the-test-cluster"


@dataclass
class Held:
    """What a node holds: inode -> (version, bytes); reads are counted."""

    files: dict[int, tuple[int, bytes]] = field(default_factory=dict)
    reads: int = 0
    #: answer with open descriptors of files in this directory (sendfile), not bytes
    fd_dir: Path | None = None

    async def read(self, ino: int, version: int, offset: int,
                   length: int) -> bytes | FileSlice | None:
        self.reads += 1
        got = self.files.get(ino)
        if got is None:
            return None
        if got[0] != version:
            raise VersionGone(f"it is at version {got[0]}")
        if self.fd_dir is None:
            return got[1][offset:offset + length]
        path = self.fd_dir / f"{ino}.{version}"
        if not path.exists():
            path.write_bytes(got[1])
        size = len(got[1])
        return FileSlice(os.open(path, os.O_RDONLY), offset,
                         max(0, min(length, size - offset)))


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[MetaStore]:
    """The shared store: lmdb behind group commit, as the daemon opens it."""
    store = MetaStore.open_lmdb(tmp_path / "meta")
    try:
        yield store
    finally:
        store.close()


async def start_door(meta: MetaStore, held: Held, node: str = "n1", *,
                     secret: str = SECRET, heartbeat_s: float = 2.0,
                     port: int = 0) -> PeerDoor:
    door = PeerDoor(node=node, secret=secret, listen=HostPort("127.0.0.1", port), meta=meta,
                    reader=held.read, heartbeat_s=heartbeat_s)
    await door.start()
    return door


@asynccontextmanager
async def running_door(meta: MetaStore, held: Held, node: str = "n1", *,
                       secret: str = SECRET, heartbeat_s: float = 2.0,
                       port: int = 0) -> AsyncIterator[PeerDoor]:
    """A started door, stopped at the end (async tests run in a loop of their own, so
    this is a context manager rather than a fixture)."""
    d = await start_door(meta, held, node, secret=secret, heartbeat_s=heartbeat_s, port=port)
    try:
        yield d
    finally:
        await d.stop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    bindir = find_bindir()
    if bindir is None:
        why = "PostgreSQL is not installed (`./dev.sh setup` installs it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    server = PgServer(bindir, fsync=False)
    try:
        yield server
    finally:
        server.stop()
