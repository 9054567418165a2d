"""The namespace over PostgreSQL, where its transactions begin and commit off the event loop
(tierd/meta/pg_async.py): other calls run while a transaction's begin or commit is in a
thread, and must still see the namespace as if each call had run whole.

An open races an unlink of the same file: whichever way the two interleave, the open either
fails with ENOENT (the unlink came first) or holds the file (then the unlink made it an
orphan); it never holds a handle on an inode whose deletion it did not see.  The races are
made certain by slowing the engine's own steps down (a begin that returns late, a commit
that lands late), never by replacing them.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from nsplacement import close_namespace, open_namespace

from tierd.acl import Identity
from tierd.errors import FsError
from tierd.meta import MetaStore
from tierd.meta.pg_engine import PgStore, PgTxn
from tierd.namespace import ROOT_INO, Namespace

from .pg_server import PgServer

pytestmark = pytest.mark.timeout(120)

ROOT = Identity.ROOT
SLOW_S = 0.5


@pytest.fixture
def url(pg_server: PgServer, tmp_path: Path) -> str:
    return pg_server.url(str(tmp_path))


@contextmanager
def _slow_write_commits() -> Iterator[None]:
    """Every write commit lands SLOW_S after it is sent: a commit stays in flight (in its
    thread) long enough for the test to act meanwhile."""
    commit = PgTxn.commit

    def late_commit(txn: PgTxn) -> None:
        if txn.write:
            time.sleep(SLOW_S)
        commit(txn)

    PgTxn.commit = late_commit  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        PgTxn.commit = commit  # type: ignore[method-assign]


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _with_file(url: str, base: Path,
                     test: Callable[[Namespace, PgStore, int, int], Any]) -> None:
    """A namespace over ``url`` with bucket ``bkt`` holding file ``f``; ``test(ns, engine,
    bucket_ino, ino)``."""
    meta = MetaStore.open_pg(url)
    ns = await open_namespace(meta, base)
    try:
        await ns.create_bucket(ROOT, "bkt")
        await ns.put_object(ROOT, "bkt", "f", _body(b"x" * 100))
        bucket_ino = (await ns.lookup(ROOT, ROOT_INO, b"bkt")).ino
        ino = (await ns.lookup(ROOT, bucket_ino, b"f")).ino
        engine = meta.engine
        assert isinstance(engine, PgStore)
        await test(ns, engine, bucket_ino, ino)
    finally:
        await close_namespace(ns)
        meta.close()


def test_an_open_whose_snapshot_predates_an_unlink_sees_the_unlink(
        url: str, tmp_path: Path) -> None:
    """The open's snapshot is taken, then its coroutine resumes late (its begin returns
    SLOW_S later); meanwhile the unlink runs whole (it sees no handle and deletes the inode).
    The open must not attach to the deleted inode from its old snapshot."""
    async def test(ns: Namespace, engine: PgStore, bucket_ino: int, ino: int) -> None:
        slow = threading.Event()
        begin_read = engine.begin_read

        def late_begin_read() -> PgTxn:
            txn = begin_read()
            if slow.is_set():
                time.sleep(SLOW_S)  # the snapshot is taken: the coroutine resumes late
            return txn

        engine.begin_read = late_begin_read  # type: ignore[method-assign]
        slow.set()
        opening = asyncio.create_task(ns.open_file(ROOT, ino, os.O_RDONLY))
        await asyncio.sleep(SLOW_S / 5)  # its snapshot is taken; it waits in the thread
        slow.clear()
        await ns.unlink(ROOT, bucket_ino, b"f")
        with pytest.raises(FsError) as e:
            fh, _ = await opening
            await ns.release(fh)  # (before the fix: a handle on the deleted inode)
        assert e.value.errno == errno.ENOENT

    asyncio.run(_with_file(url, tmp_path, test))


def test_an_open_during_the_unlinks_commit_sees_the_unlink(url: str, tmp_path: Path) -> None:
    """The unlink's body ran (it saw no handle); its commit is in flight (it lands SLOW_S
    later).  An open begun now must read the unlink's commit, not the state before it."""
    async def test(ns: Namespace, engine: PgStore, bucket_ino: int, ino: int) -> None:
        with _slow_write_commits():
            unlinking = asyncio.create_task(ns.unlink(ROOT, bucket_ino, b"f"))
            while engine.committing is None or engine.committing.done():
                await asyncio.sleep(0.001)  # until the unlink's commit is in its thread
            with pytest.raises(FsError) as e:
                fh, _ = await ns.open_file(ROOT, ino, os.O_RDONLY)
                await ns.release(fh)
            assert e.value.errno == errno.ENOENT
            await unlinking

    asyncio.run(_with_file(url, tmp_path, test))


def test_a_handle_opened_before_the_unlink_keeps_the_file(url: str, tmp_path: Path) -> None:
    """The other order: the open came first, so the unlink leaves an orphan and the handle
    reads the whole file until it is released."""
    async def test(ns: Namespace, engine: PgStore, bucket_ino: int, ino: int) -> None:
        fh, _ = await ns.open_file(ROOT, ino, os.O_RDONLY)
        await ns.unlink(ROOT, bucket_ino, b"f")
        assert bytes(await ns.read(fh, 0, 1000)) == b"x" * 100
        await ns.release(fh)
        with pytest.raises(FsError):
            await ns.getattr(ROOT, ino)

    asyncio.run(_with_file(url, tmp_path, test))


def test_a_write_during_the_commit_that_drops_the_intention_takes_a_new_one(
        url: str, tmp_path: Path) -> None:
    """A file whose committed bytes are being changed in place holds a durable intention
    (its ``V`` key); the fsync that records the new version removes it in its commit.  A
    write below the committed size that comes while that commit is in flight changes bytes
    the new version names: it must take an intention of its own first, so that after both
    the ``V`` key is there (a crash then gives the file a new version at start instead of
    the recorded version's ETag over other bytes)."""
    async def test(ns: Namespace, engine: PgStore, bucket_ino: int, ino: int) -> None:
        _, fh = await ns.create(ROOT, bucket_ino, b"g", 0o644, os.O_RDWR)
        await ns.write(fh, 0, b"a" * 100)
        await ns.fsync(fh)  # 100 committed bytes
        await ns.write(fh, 0, b"b" * 10)  # in place: the intention is made durable first
        g = (await ns.lookup(ROOT, bucket_ino, b"g")).ino
        with ns.meta.snapshot() as tx:
            assert tx.has_intent(g)
        with _slow_write_commits():
            syncing = asyncio.create_task(ns.fsync(fh))  # records b*10, drops the intention
            while engine.committing is None or engine.committing.done():
                await asyncio.sleep(0.001)  # its commit is in its thread
            await ns.write(fh, 50, b"c" * 10)  # bytes the version being committed names
            await syncing
        with ns.meta.snapshot() as tx:
            assert tx.has_intent(g), "bytes changed in place with no intention on record"
        await ns.release(fh)

    asyncio.run(_with_file(url, tmp_path, test))


def test_a_non_root_write_to_a_setid_file_during_a_settling_fsync_keeps_an_intention(
        url: str, tmp_path: Path) -> None:
    async def test(ns: Namespace, engine: PgStore, bucket_ino: int, ino: int) -> None:
        inode, fh = await ns.create(ROOT, bucket_ino, b"g", 0o4777, os.O_RDWR)
        await ns.write(fh, 0, b"a" * 100)
        await ns.fsync(fh)  # 100 committed bytes
        await ns.write(fh, 0, b"b" * 10)  # in place: V key durable, of.intent True
        fh2 = await ns.open(Identity(uid=1000, gid=1000), inode.ino, os.O_RDWR)
        begun, slow = threading.Event(), threading.Event()
        slow.set()
        begin_offered = engine.begin_offered

        def late() -> PgTxn:
            txn = begin_offered()
            if slow.is_set():
                slow.clear()
                begun.set()
                time.sleep(SLOW_S)
            return txn

        engine.begin_offered = late  # type: ignore[method-assign]
        try:
            syncing = asyncio.create_task(ns.fsync(fh))  # settles: drops the V key
            while not begun.is_set():
                await asyncio.sleep(0.001)
            await ns.write(fh2, 50, b"c" * 10)  # below the committed size, by non-root
            await syncing
        finally:
            engine.begin_offered = begin_offered  # type: ignore[method-assign]
        with ns.meta.snapshot() as tx:
            assert tx.has_intent(inode.ino), "bytes changed in place with no intention"
        await ns.release(fh2)
        await ns.release(fh)

    asyncio.run(_with_file(url, tmp_path, test))


def test_a_put_whose_commit_broke_after_it_was_applied_keeps_its_bytes(
        url: str, tmp_path: Path) -> None:
    """A COMMIT whose connection breaks may have been applied: the engine raises EIO
    (pg_engine) and the put must not remove the data file of the inode its commit named
    (before, the key then named an inode whose bytes were gone)."""
    async def test(ns: Namespace, engine: PgStore, bucket_ino: int, ino: int) -> None:
        commit_put = ns._commit_put

        async def applied_then_broke(*args: Any) -> Any:
            await commit_put(*args)
            raise FsError(errno.EIO, "committing (if the connection broke during COMMIT "
                                     "it may have been applied)")

        data = os.urandom(300_000)
        ns._commit_put = applied_then_broke  # type: ignore[method-assign,assignment]
        try:
            with pytest.raises(FsError):
                await ns.put_object(ROOT, "bkt", "g", _body(data))
        finally:
            del ns._commit_put
        r = await ns.get_object(ROOT, "bkt", "g")
        try:
            assert await r.read_all() == data
        finally:
            await r.close()

    asyncio.run(_with_file(url, tmp_path, test))
