"""The persister's work per new file and per file deleted before it was sent.

* A create queues the file with a token whose stamp the engine keeps from that enqueue, so
  the persister's wake for it (one per create in a burst) reads nothing: its delay is
  known without a snapshot.
* On a single node, a file unlinked while it waits out its persist delay, with no
  reconcile of it running and no put of it in flight, leaves the queue in the unlink's own
  transaction: no reconcile, no transaction of the persister's for it later.  A file cold
  holds loses its record in its unlink's transaction too (its objects are pending deletes
  by then, which the delete worker carries out), unless a handle holds it open.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tierd.acl import Identity
from tierd.placement import Placement, upload

from .conftest import Env, until, write_file

ROOT = Identity.ROOT


def _queued(p: Placement, ino: int) -> bool:
    with p.meta.snapshot() as tx:
        return tx.queued(ino) is not None


def _waiting_at(p: Placement, key: str) -> bool:
    """Whether a round waits at ``key``'s gate (the test holds it: two users)."""
    return p.gates._locks.get(key, (None, 0))[1] == 2


@contextlib.contextmanager
def _persister_reads(p: Placement) -> Iterator[list[str]]:
    """The snapshots (sync and async) begun in the persister's own task while in use."""
    seen: list[str] = []
    meta: Any = p.meta
    snap, asnap = meta.snapshot, meta.asnapshot

    def mine(kind: str) -> None:
        with contextlib.suppress(RuntimeError):
            if asyncio.current_task() is p._task:
                seen.append(kind)

    def snapshot(*a: Any, **kw: Any) -> Any:
        mine("snapshot")
        return snap(*a, **kw)

    def asnapshot(*a: Any, **kw: Any) -> Any:
        mine("asnapshot")
        return asnap(*a, **kw)

    meta.snapshot, meta.asnapshot = snapshot, asnapshot
    try:
        yield seen
    finally:
        meta.snapshot, meta.asnapshot = snap, asnap


async def test_a_create_burst_costs_the_persister_no_read_per_file(file_env: Env) -> None:
    ns, p = await file_env.open(persist_delay=3600)
    try:
        b = await ns.create_bucket(ROOT, "burst")
        await write_file(ns, b.ino, b"first", b"x")
        await asyncio.sleep(0.2)  # the loop's first full scan of the queue is behind it
        with _persister_reads(p) as reads:
            inos = []
            for i in range(40):
                inos.append(await write_file(ns, b.ino, b"f%d" % i, b"y" * i))
                await asyncio.sleep(0)  # (it used to wake for each: nudge)
            await asyncio.sleep(0.2)
            p.wake()  # it looks at the hints now, not at its next timeout
            await asyncio.sleep(0.2)
        # every file waits out its delay, its stamp known from its enqueue
        assert all(p._later.get(ino) > 0 for ino in inos)
        # one full scan of the queue may fall inside (every 5 s); before: a read per wake
        assert len(reads) <= 1, reads
        assert await p.drain(timeout=30)  # the delay is lifted and they all persist
        for i in range(40):
            assert file_env.raw_get(f"burst/f{i}") == b"y" * i
    finally:
        await file_env.close()


async def test_an_unlink_before_the_upload_dequeues_in_its_transaction(
    file_env: Env,
) -> None:
    ns, p = await file_env.open(persist_delay=3600)
    try:
        b = await ns.create_bucket(ROOT, "tmp")
        data = os.urandom(3000)
        kept = await write_file(ns, b.ino, b"kept", data)
        await until(lambda: p._later.get(kept) > 0)
        assert await p.drain(timeout=30)  # "kept" is in cold now
        ino = await write_file(ns, b.ino, b"scratch", os.urandom(5000))
        await until(lambda: p._later.get(ino) > 0)
        assert _queued(p, ino) and p.dirty.get(ino) == 5000
        transactions = p.txns.transactions
        await ns.unlink(ROOT, b.ino, b"scratch")
        # gone from the queue with the unlink (before: queued until its delay, an hour)
        assert not _queued(p, ino)
        assert ino not in p.dirty and p.dirty_bytes == 0
        assert p._later.get(ino) == 0 and ino not in p._queued_at
        await ns.unlink(ROOT, b.ino, b"kept")  # in cold: its record goes, its object too
        assert not _queued(p, kept)
        with p.meta.snapshot() as tx:
            assert tx.get_cold(kept) is None
        assert await p.drain(timeout=30)
        await until(lambda: not file_env.raw_exists("tmp/kept"))  # the delete worker's
        assert not file_env.raw_exists("tmp/scratch")
        # no persister transaction for either: the unlinks did it all
        assert p.txns.transactions == transactions
        assert p.stats.uploaded_bytes == len(data)
    finally:
        await file_env.close()


async def test_unlinks_of_persisted_files_cost_the_persister_nothing(file_env: Env) -> None:
    """Unlinking persisted files (a dataset or checkpoint directory removed): each record
    goes with its unlink, the delete worker removes the objects in batches, and the
    persister runs no reconcile and no transaction for them (before: one of each per file,
    29% of the loop while a process unlinked them through the mount).  A file open at its
    unlink keeps the persister's path: its record stays until its reconcile."""
    ns, p = await file_env.open(persist_delay=0)
    try:
        b = await ns.create_bucket(ROOT, "gone")
        inos = [await write_file(ns, b.ino, b"f%d" % i, b"z" * (i + 1)) for i in range(30)]
        assert await p.drain(timeout=30)
        assert all(file_env.raw_exists(f"gone/f{i}") for i in range(30))
        fh = await ns.open(ROOT, inos[0], os.O_RDONLY)
        transactions, reconciles = p.txns.transactions, Counter[int]()
        real = p.reconcile

        async def counted(ino: int) -> bool:
            reconciles[ino] += 1
            return await real(ino)
        p.reconcile = counted  # type: ignore[method-assign]
        for i in range(30):
            await ns.unlink(ROOT, b.ino, b"f%d" % i)
        with p.meta.snapshot() as tx:
            assert tx.get_cold(inos[0]) is not None  # held open: left to its reconcile
            assert all(tx.get_cold(ino) is None for ino in inos[1:])
            assert all(tx.queued(ino) is None for ino in inos[1:])
        await until(lambda: not any(file_env.raw_exists(f"gone/f{i}") for i in range(1, 30)))
        assert set(reconciles) <= {inos[0]}, reconciles
        assert await ns.read(fh, 0, 10) == b"z"  # the open file still reads
        await ns.release(fh)
        assert await p.drain(timeout=30)
        await until(lambda: not file_env.raw_exists("gone/f0"))
        assert p.txns.transactions <= transactions + 1  # the held file's record only
    finally:
        await file_env.close()


async def test_an_unlink_during_its_reconcile_leaves_the_file_queued(
    file_env: Env,
) -> None:
    """A file whose reconcile is running (its put may be in flight) stays queued at its
    unlink: the reconcile's record transaction and the next round decide what cold keeps.
    The reconcile is held at its key's gate, where a put waits for a delete of the key."""
    ns, p = await file_env.open(persist_delay=0)
    try:
        b = await ns.create_bucket(ROOT, "busy")
        async with p.gates.hold("busy/f"):
            ino = await write_file(ns, b.ino, b"f", os.urandom(4000))
            await until(lambda: _waiting_at(p, "busy/f"), timeout=10)
            await ns.unlink(ROOT, b.ino, b"f")
            assert _queued(p, ino)  # left to the reconcile in flight
        assert await p.drain(timeout=30)
        assert not _queued(p, ino) and ino not in p.dirty
        assert not file_env.raw_exists("busy/f")
    finally:
        await file_env.close()


async def test_a_persisted_file_walks_its_path_once(
    file_env: Env, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new file's round finds its keys once (its first snapshot); the put's two checks
    and the record take them from the round while its queue token is unchanged (before:
    the key resolved twice and the names walked again for the record)."""
    walks: Counter[str] = Counter()

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **kw: Any) -> Any:
            walks[name] += 1
            return fn(*a, **kw)
        return call

    monkeypatch.setattr(upload, "resolve", counted("resolve", upload.resolve))
    monkeypatch.setattr(upload, "file_keys", counted("file_keys", upload.file_keys))
    ns, p = await file_env.open(persist_delay=3600)
    try:
        b = await ns.create_bucket(ROOT, "walk")
        d = await ns.mkdir(ROOT, b.ino, b"sub", 0o755)
        for i in range(20):
            await write_file(ns, d.ino, b"f%d" % i, b"z" * i)
        assert await p.drain(timeout=30)
        assert walks == {"file_keys": 20}, walks
        assert all(file_env.raw_get(f"walk/sub/f{i}") == b"z" * i for i in range(20))
    finally:
        await file_env.close()


async def test_a_rename_during_the_round_is_seen(file_env: Env) -> None:
    """A file renamed after its round read its keys (the round waits at the key's gate)
    changed its queue token: the put looks the key up, finds it no longer names the
    file, and the next round puts it under its new name only."""
    ns, p = await file_env.open(persist_delay=0)
    try:
        b = await ns.create_bucket(ROOT, "mvd")
        async with p.gates.hold("mvd/a"):
            await write_file(ns, b.ino, b"a", b"content")
            await until(lambda: _waiting_at(p, "mvd/a"), timeout=10)
            await ns.rename(ROOT, b.ino, b"a", b.ino, b"b")
        assert await p.drain(timeout=30)
        assert file_env.raw_get("mvd/b") == b"content"
        assert not file_env.raw_exists("mvd/a")
        assert p.stats.uploaded_bytes == len(b"content")  # no upload under the old name
    finally:
        await file_env.close()
