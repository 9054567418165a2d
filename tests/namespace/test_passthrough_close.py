"""What a passthrough writer's close costs the metadata store, in-process over lmdb.

A file created for the kernel to write (``create(kernel_writes=True)``, then
``passthrough_open``) and closed unwritten -- a create burst through the FUSE mount: most of
its files -- commits no new content version and waits for no metadata flush: its ``V``
intention (committed with the create) goes in one write transaction, and that is all
(``NamespaceAPI._external_look``'s empty-file rule, ``FileOps._durable``,
``FileOps._reap_if_orphan``'s read before any write).  A file that is written keeps the
version, the flush and the new size; an orphan is still reaped at its last close."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tierd.acl import Identity
from tierd.meta import MetaStore
from tierd.namespace import ROOT_INO, Namespace

from .test_kernel_intents import in_namespace

ROOT = Identity.ROOT


@contextlib.contextmanager
def metadata_work(meta: MetaStore) -> Iterator[dict[str, int]]:
    """Counts, while the block runs, the write and read transactions begun on ``meta``'s
    engine and the metadata flushes asked for (the real calls run: this only counts them)."""
    seen = {"writes": 0, "reads": 0, "flushes": 0}
    engine = meta.engine
    begin, flush = engine.begin, meta.flush

    def counting_begin(*a: Any, **kw: Any) -> Any:
        seen["writes" if kw.get("write", a[0] if a else False) else "reads"] += 1
        return begin(*a, **kw)

    async def counting_flush(*a: Any, **kw: Any) -> None:
        seen["flushes"] += 1
        await flush(*a, **kw)

    engine.begin = counting_begin  # type: ignore[method-assign]
    meta.flush = counting_flush  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del engine.begin
        del meta.flush


async def _created(ns: Namespace, name: bytes) -> tuple[int, int, int]:
    """(inode, handle, hot fd) of a new file opened for the kernel to write."""
    b = (await ns.lookup(ROOT, ROOT_INO, b"bkt")).ino
    inode, fh = await ns.create(ROOT, b, name, 0o644, os.O_WRONLY | os.O_CREAT,
                                kernel_writes=True)
    fd = await ns.passthrough_open(fh)
    assert fd is not None
    return inode.ino, fh, fd


async def _close(ns: Namespace, fh: int) -> None:
    """What the FUSE door does at a passthrough writer's FLUSH and RELEASE."""
    ns.passthrough_sync(fh)  # flush: counts as a write unless the empty-file rule says not
    ns.passthrough_close(fh)
    await ns.release(fh)


def test_closing_a_passthrough_created_file_never_written_commits_nothing(
        tmp_path: Path) -> None:
    async def body(ns: Namespace) -> None:
        ino, fh, _ = await _created(ns, b"empty")
        with ns.meta.snapshot() as tx:
            before = tx.get_inode(ino)
            assert before is not None and tx.has_intent(ino)
        with metadata_work(ns.meta) as seen:
            await _close(ns, fh)
        with ns.meta.snapshot() as tx:
            after = tx.get_inode(ino)
            assert after is not None and not tx.has_intent(ino)
        assert (after.version, after.size, after.mtime_ns) == (
            before.version, 0, before.mtime_ns)
        assert seen == {"writes": 1, "reads": 0, "flushes": 0}, seen  # the intention's removal only

    in_namespace(tmp_path, body)


def test_a_written_passthrough_file_commits_its_version_at_close(tmp_path: Path) -> None:
    """The other side of the rule: bytes the kernel wrote make a new version, durable."""
    async def body(ns: Namespace) -> None:
        ino, fh, fd = await _created(ns, b"written")
        with ns.meta.snapshot() as tx:
            before = tx.get_inode(ino)
            assert before is not None
        os.pwrite(fd, b"abc", 0)  # as the kernel's write of the backing file
        with metadata_work(ns.meta) as seen:
            await _close(ns, fh)
        with ns.meta.snapshot() as tx:
            after = tx.get_inode(ino)
            assert after is not None and not tx.has_intent(ino)
        assert after.version != before.version and after.size == 3
        assert seen["flushes"] >= 1

    in_namespace(tmp_path, body)


def test_an_orphan_is_reaped_at_its_last_close(tmp_path: Path) -> None:
    async def body(ns: Namespace) -> None:
        ino, fh, _ = await _created(ns, b"orphan")
        b = (await ns.lookup(ROOT, ROOT_INO, b"bkt")).ino
        await ns.unlink(ROOT, b, b"orphan")
        with ns.meta.snapshot() as tx:
            assert tx.get_inode(ino) is not None and ino in tx.list_orphans()
        await _close(ns, fh)
        with ns.meta.snapshot() as tx:
            assert tx.get_inode(ino) is None and ino not in tx.list_orphans()

    in_namespace(tmp_path, body)


def test_an_orphan_with_two_handles_goes_at_the_last_and_named_files_read_nothing(
        tmp_path: Path) -> None:
    """A last release reads the inode only when the file lost its last name while open
    (``OpenFile.unnamed``): a file named still is closed without a read, one unlinked
    while two handles held it goes at the second release, not the first."""
    async def body(ns: Namespace) -> None:
        ino, fh, _ = await _created(ns, b"twice")
        again = await ns.open(ROOT, ino, os.O_RDONLY)
        b = (await ns.lookup(ROOT, ROOT_INO, b"bkt")).ino
        await ns.unlink(ROOT, b, b"twice")
        await _close(ns, fh)
        with ns.meta.snapshot() as tx:
            assert tx.get_inode(ino) is not None and ino in tx.list_orphans()
        await ns.release(again)
        with ns.meta.snapshot() as tx:
            assert tx.get_inode(ino) is None and ino not in tx.list_orphans()
        kept, fh2, _ = await _created(ns, b"kept")
        await _close(ns, fh2)
        reader = await ns.open(ROOT, kept, os.O_RDONLY)
        with metadata_work(ns.meta) as seen:
            await ns.release(reader)  # the last handle of a file named still
        assert seen == {"writes": 0, "reads": 0, "flushes": 0}, seen
        with ns.meta.snapshot() as tx:
            assert tx.get_inode(kept) is not None

    in_namespace(tmp_path, body)


@contextlib.contextmanager
def snapshots(meta: MetaStore) -> Iterator[list[int]]:
    """Counts the async snapshots the current task begins on ``meta`` while the block runs
    (real ones; the persister's own, in its task, are not counted)."""
    seen: list[int] = []
    real = meta.asnapshot
    me = asyncio.current_task()

    def counting(*a: Any, **kw: Any) -> Any:
        if asyncio.current_task() is me:
            seen.append(1)
        return real(*a, **kw)

    meta.asnapshot = counting  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del meta.asnapshot


def test_a_passthrough_open_takes_no_snapshot_while_no_bucket_was_ever_versioned(
        tmp_path: Path) -> None:
    """The versioning check of a passthrough open (``_pt_refused``) reads nothing while no
    bucket's versioning was ever set and none was set since it last looked; once a
    bucket's is, the next open looks again and refuses that bucket's files."""
    async def body(ns: Namespace) -> None:
        await _created(ns, b"first")  # looks once: no bucket versioned
        b = (await ns.lookup(ROOT, ROOT_INO, b"bkt")).ino
        _, fh = await ns.create(ROOT, b, b"second", 0o644, os.O_WRONLY | os.O_CREAT,
                                kernel_writes=True)
        with snapshots(ns.meta) as seen:
            assert await ns.passthrough_open(fh) is not None
        assert seen == [], "a snapshot per passthrough open"
        await _close(ns, fh)
        await ns.set_versioning("bkt", "Suspended")
        _, fh = await ns.create(ROOT, b, b"third", 0o644, os.O_WRONLY | os.O_CREAT,
                                    kernel_writes=True)
        assert await ns.passthrough_open(fh) is None  # the bucket's files keep the daemon
        await ns.release(fh)

    in_namespace(tmp_path, body)
