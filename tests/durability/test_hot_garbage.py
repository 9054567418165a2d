"""The pieces of the hot-data crash model, one at a time, on a namespace in this process.

``test_hot_crash.py`` kills the real daemon at every step; these check each rule's
mechanism directly and fast: the garbage list (a dropped inode's data file outlives the
commit until a flush covers it, and a ``G`` key left by a crash is reclaimed at start),
leftover data files of numbers no inode names, the version bump of a file whose in-place
change a crash cut short, and that bytes past the recorded size are never read, hashed or
shown by an extension.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from nsplacement import abandon_namespace, close_namespace, open_namespace

from tierd.acl import Identity
from tierd.meta import STATE_DIRTY, MetaStore
from tierd.meta.group_engine import GroupCommitStore
from tierd.meta.lmdb_engine import LmdbStore
from tierd.namespace import Namespace, garbage

T = TypeVar("T")
ROOT = Identity.ROOT


class Env:
    """A namespace over lmdb in ``base`` with its own event loop; ``crash()`` abandons it
    (store closed without the namespace's shutdown, as a killed daemon leaves it)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.loop = asyncio.new_event_loop()
        self.abandoned: list[Namespace] = []
        self.ns = self.open()

    def open(self) -> Namespace:
        store = MetaStore.open_lmdb(self.base / "meta")
        return self.run(open_namespace(store, self.base))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def crash(self) -> None:
        self.abandoned.append(self.ns)
        self.run(abandon_namespace(self.ns))
        self.ns.meta.close()
        self.ns = self.open()

    def close(self) -> None:
        self.run(close_namespace(self.ns))
        self.ns.meta.close()
        self.loop.close()

    # -- helpers ---------------------------------------------------------------------------
    def file(self, name: bytes, data: bytes) -> int:
        async def go() -> int:
            b = await self.ns.resolve(ROOT, "bkt")
            inode, fh = await self.ns.create(ROOT, b.ino, name, 0o644, os.O_WRONLY)
            await self.ns.write(fh, 0, data)
            await self.ns.release(fh)
            return inode.ino
        return self.run(go())

    def read(self, name: str) -> bytes:
        async def go() -> bytes:
            inode = await self.ns.resolve(ROOT, f"bkt/{name}")
            fh = await self.ns.open(ROOT, inode.ino, os.O_RDONLY)
            try:
                return bytes(await self.ns.read(fh, 0, 1 << 30))
            finally:
                await self.ns.release(fh)
        return self.run(go())

    def garbage(self) -> list[int]:
        with self.ns.meta.snapshot() as tx:
            return tx.list_garbage()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    e.run(e.ns.create_bucket(ROOT, "bkt"))
    try:
        yield e
    finally:
        e.close()


async def body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_a_dropped_data_file_goes_only_after_the_drop_is_durable(env: Env) -> None:
    ino = env.file(b"f", b"old bytes")
    path = Path(env.ns.hot.path(ino))
    flushes: list[int] = []
    urgent: list[bool] = []
    real_flush = env.ns.meta.flush

    async def counting_flush(upto: int | None = None, **kw: bool) -> None:
        flushes.append(len(env.garbage()))
        urgent.append(kw.get("urgent", True))
        await real_flush(upto, **kw)

    env.ns.meta.flush = counting_flush  # type: ignore[method-assign]

    async def unlink() -> tuple[bool, list[int]]:
        b = await env.ns.resolve(ROOT, "bkt")
        await env.ns.unlink(ROOT, b.ino, b"f")
        return path.exists(), env.garbage()

    still_there, keys = env.run(unlink())
    assert still_there and keys == [ino], "the file must outlive the commit that dropped it"
    env.run(env.ns.garbage.drain())
    assert flushes and flushes[0] == 1, "reclaimed without a flush after the drop"
    # background work: it waits for the group's own flush, never cuts a group short
    assert urgent == [False] * len(flushes), "the reclaimer asked for a flush of its own"
    assert not path.exists()
    assert env.garbage() == []


@pytest.mark.parametrize("how", ["unlink", "put over", "delete", "rename over"])
def test_a_garbage_key_left_by_a_crash_is_reclaimed_at_start(env: Env, how: str) -> None:
    ino = env.file(b"f", b"old bytes")
    path = Path(env.ns.hot.path(ino))

    async def never(inos: list[int]) -> None:  # the crash comes before any reclaim
        await asyncio.Event().wait()

    env.ns.garbage._reclaim = never  # type: ignore[method-assign]

    async def drop() -> None:
        b = await env.ns.resolve(ROOT, "bkt")
        if how == "unlink":
            await env.ns.unlink(ROOT, b.ino, b"f")
        elif how == "put over":
            await env.ns.put_object(ROOT, "bkt", "f", body(b"new"))
        elif how == "delete":
            await env.ns.delete_object(ROOT, "bkt", "f")
        else:
            _, fh = await env.ns.create(ROOT, b.ino, b"g", 0o644, os.O_WRONLY)
            await env.ns.write(fh, 0, b"new")
            await env.ns.release(fh)
            await env.ns.rename(ROOT, b.ino, b"g", b.ino, b"f")
        await env.ns.sync()  # the drop is durable

    env.run(drop())
    assert path.exists() and env.garbage() == [ino]
    env.crash()
    assert not path.exists()
    assert env.garbage() == []
    if how in ("put over", "rename over"):
        assert env.read("f") == b"new"


def test_an_open_unlinked_file_is_reclaimed_at_its_release(env: Env) -> None:
    ino = env.file(b"f", b"still readable")
    path = Path(env.ns.hot.path(ino))

    async def go() -> bytes:
        b = await env.ns.resolve(ROOT, "bkt")
        fh = await env.ns.open(ROOT, ino, os.O_RDONLY)
        await env.ns.unlink(ROOT, b.ino, b"f")
        await env.ns.garbage.drain()
        assert path.exists() and env.garbage() == []  # an orphan, not garbage yet
        data = bytes(await env.ns.read(fh, 0, 100))
        await env.ns.release(fh)
        assert env.garbage() == [ino]
        await env.ns.garbage.drain()
        return data

    assert env.run(go()) == b"still readable"
    assert not path.exists() and env.garbage() == []


def test_data_files_no_inode_names_are_removed_after_a_crash(env: Env) -> None:
    keep = env.file(b"f", b"named")
    with env.ns.meta.write() as tx:
        lost = tx.next_ino()  # a number handed out, its commit never made durable
    Path(env.ns.hot.path(lost)).parent.mkdir(parents=True, exist_ok=True)
    Path(env.ns.hot.path(lost)).write_bytes(b"installed, never committed")
    env.crash()
    assert not Path(env.ns.hot.path(lost)).exists()
    assert Path(env.ns.hot.path(keep)).exists()
    assert env.read("f") == b"named"


def test_an_interrupted_in_place_change_gets_a_new_version(env: Env) -> None:
    ino = env.file(b"f", b"A" * 1000)
    # written through a handle: the ETag is unknown until asked for, then recorded
    assert env.run(env.ns.etag(ino)) == hashlib.md5(b"A" * 1000).hexdigest()
    with env.ns.meta.snapshot() as tx:
        before = tx.get_inode(ino)
    assert before is not None and before.etag == hashlib.md5(b"A" * 1000).hexdigest()

    async def overwrite() -> None:
        fh = await env.ns.open(ROOT, ino, os.O_WRONLY)
        await env.ns.write(fh, 0, b"B" * 10)  # the intention is durable before this byte
        # the crash comes before the close: the namespace is abandoned with the handle

    env.run(overwrite())
    with env.ns.meta.snapshot() as tx:
        assert tx.list_intents() == [ino]
    env.crash()
    with env.ns.meta.snapshot() as tx:
        after = tx.get_inode(ino)
        assert tx.list_intents() == []
    assert after is not None
    assert after.version > before.version and after.state == STATE_DIRTY
    content = b"B" * 10 + b"A" * 990
    assert env.read("f") == content
    assert env.run(env.ns.etag(ino)) == hashlib.md5(content).hexdigest()


def test_appends_need_no_intention_and_a_close_removes_it(env: Env) -> None:
    ino = env.file(b"f", b"x" * 100)

    async def go() -> list[list[int]]:
        seen = []
        fh = await env.ns.open(ROOT, ino, os.O_WRONLY)
        await env.ns.write(fh, 100, b"appended")
        with env.ns.meta.snapshot() as tx:
            seen.append(tx.list_intents())
        await env.ns.write(fh, 0, b"y")
        with env.ns.meta.snapshot() as tx:
            seen.append(tx.list_intents())
        await env.ns.release(fh)
        with env.ns.meta.snapshot() as tx:
            seen.append(tx.list_intents())
        return seen

    assert env.run(go()) == [[], [ino], []]
    assert env.read("f") == b"y" + b"x" * 99 + b"appended"


def test_bytes_past_the_size_are_never_read_hashed_or_shown(env: Env) -> None:
    """What a crash may leave past the recorded size (a shrink's tail, uncommitted
    appends) is invisible, left out of the ETag, and cut before the file grows."""
    ino = env.file(b"f", b"0123456789")
    with open(env.ns.hot.path(ino), "ab") as f:
        f.write(b"STALE TAIL")
    with env.ns.meta.write() as tx:
        inode = tx.get_inode(ino)
        assert inode is not None
        inode.etag = ""
        tx.put_inode(inode)
    assert env.read("f") == b"0123456789"
    assert env.run(env.ns.etag(ino)) == hashlib.md5(b"0123456789").hexdigest()

    async def grow() -> None:
        await env.ns.setattr(ROOT, ino, size=30)
        fh = await env.ns.open(ROOT, ino, os.O_WRONLY)
        await env.ns.write(fh, 40, b"end")  # a gap past the size
        await env.ns.release(fh)

    os.truncate(env.ns.hot.path(ino), 10)
    with open(env.ns.hot.path(ino), "ab") as tail:
        tail.write(b"STALE TAIL AGAIN, LONGER THAN THIRTY BYTES, LONGER")
    env.run(grow())
    assert env.read("f") == b"0123456789" + bytes(30) + b"end"


def test_a_shrink_cuts_the_data_file_only_once_durable(env: Env) -> None:
    ino = env.file(b"f", b"z" * 5000)
    path = Path(env.ns.hot.path(ino))
    sizes: list[int] = []
    real_flush = env.ns.meta.flush

    async def watching_flush(upto: int | None = None, **kw: bool) -> None:
        sizes.append(path.stat().st_size)
        await real_flush(upto, **kw)

    env.ns.meta.flush = watching_flush  # type: ignore[method-assign]
    env.run(env.ns.setattr(ROOT, ino, size=100))
    assert sizes and sizes[0] == 5000, "the data file was cut before the flush"
    assert path.stat().st_size == 100
    assert env.read("f") == b"z" * 100


def test_a_failing_flush_keeps_the_file_and_retries(env: Env,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush that fails (a full disk) leaves the data file and its key; the reclaim is
    retried, and a shutdown meanwhile leaves it to the next start instead of waiting."""
    monkeypatch.setattr(garbage, "RETRY_DELAY", 0.01)
    ino = env.file(b"f", b"bytes")
    path = Path(env.ns.hot.path(ino))
    real_flush = env.ns.meta.flush
    failures = [2]

    async def failing_flush(upto: int | None = None, **kw: bool) -> None:
        if failures[0] > 0:
            failures[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        await real_flush(upto, **kw)

    env.ns.meta.flush = failing_flush  # type: ignore[method-assign]

    async def unlink(name: bytes) -> None:
        b = await env.ns.resolve(ROOT, "bkt")
        await env.ns.unlink(ROOT, b.ino, name)
        await env.ns.garbage.drain()

    env.run(unlink(b"f"))
    assert failures == [0] and not path.exists() and env.garbage() == []

    ino = env.file(b"g", b"bytes")
    path = Path(env.ns.hot.path(ino))
    failures[0] = 1 << 30  # from now on every flush fails

    async def unlink_then_close() -> None:
        b = await env.ns.resolve(ROOT, "bkt")
        await env.ns.unlink(ROOT, b.ino, b"g")
        await asyncio.sleep(0.1)
        await asyncio.wait_for(env.ns.garbage.drain(closing=True), 5)

    env.run(unlink_then_close())
    assert path.exists() and env.garbage() == [ino]
    env.ns.meta.flush = real_flush  # type: ignore[method-assign]
    env.crash()
    assert not path.exists() and env.garbage() == []


def test_flush_upto_a_mark_waits_for_that_commit_only(tmp_path: Path) -> None:
    """The reclaimer's wait (``MetaStore.flush(upto=...)``): once the marked commit is
    durable it adds no flush, though later commits are still queued."""
    # a long interval: no timed flush may come between the commits and the checks
    store = MetaStore(GroupCommitStore(LmdbStore(tmp_path / "meta", metasync=True),
                                       interval=60.0))
    loop = asyncio.new_event_loop()
    try:
        with store.write() as tx:
            tx.add_garbage(7)
        mark = store.last_commit()
        assert mark is not None
        loop.run_until_complete(store.flush())
        engine: Any = store.engine
        flushes = engine._gen
        with store.write() as tx:
            tx.add_garbage(8)  # a later commit, not durable yet
        loop.run_until_complete(store.flush(upto=mark))
        assert engine._gen == flushes, "flushed for a commit it did not wait for"
        loop.run_until_complete(store.flush(upto=store.last_commit()))
        assert engine._gen == flushes + 1
    finally:
        loop.close()
        store.close()
