"""What the namespace tells a door that caches (the FUSE mount) about object-door changes.

A cached entry is only correct while every way a name can change reports to the door:
these check that the directories an object call creates (the implicit prefixes of a key,
a directory marker, a bucket) are reported with the call's own change, that a door which
closes stops hearing, and the other public calls a door uses instead of the namespace's
internals (``sync``, ``advise_read``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from tierd_fuse.invalidate import Invalidator

from tierd.namespace import ROOT_INO, Change

from .conftest import ROOT, NsEnv, chunks


def _watch(env: NsEnv) -> list[Change]:
    seen: list[Change] = []
    env.ns.subscribe(seen.append)
    return seen


def _entries(seen: list[Change]) -> set[tuple[int | None, bytes | None]]:
    return {(c.parent, c.name) for c in seen if c.name is not None}


def test_put_reports_the_directories_it_creates(nsenv: NsEnv) -> None:
    ns = nsenv.ns
    bucket = nsenv.run(ns.create_bucket(ROOT, "bkt"))
    seen = _watch(nsenv)
    nsenv.run(ns.put_object(ROOT, "bkt", "x/y/leaf", chunks(b"data")))
    x = nsenv.run(ns.resolve(ROOT, "bkt/x"))
    y = nsenv.run(ns.resolve(ROOT, "bkt/x/y"))
    assert {(bucket.ino, b"x"), (x.ino, b"y"), (y.ino, b"leaf")} <= _entries(seen), seen
    # an existing prefix is not created again, and not reported again
    seen.clear()
    nsenv.run(ns.put_object(ROOT, "bkt", "x/y/other", chunks(b"more")))
    assert _entries(seen) == {(y.ino, b"other")}, seen


def test_directory_marker_and_bucket_are_reported(nsenv: NsEnv) -> None:
    ns = nsenv.ns
    seen = _watch(nsenv)
    bucket = nsenv.run(ns.create_bucket(ROOT, "bkt"))
    assert (ROOT_INO, b"bkt") in _entries(seen), seen
    seen.clear()
    nsenv.run(ns.put_object(ROOT, "bkt", "m/n/", chunks(b"")))
    m = nsenv.run(ns.resolve(ROOT, "bkt/m"))
    assert _entries(seen) == {(bucket.ino, b"m"), (m.ino, b"n")}, seen


def test_unsubscribe_stops_the_reports(nsenv: NsEnv) -> None:
    ns = nsenv.ns
    nsenv.run(ns.create_bucket(ROOT, "bkt"))
    seen = _watch(nsenv)
    ns.unsubscribe(seen.append)
    ns.unsubscribe(seen.append)  # (twice: a door closing twice is no error)
    nsenv.run(ns.put_object(ROOT, "bkt", "p/q", chunks(b"data")))
    assert seen == []


def test_read_advice_and_sync_through_the_api(nsenv: NsEnv) -> None:
    """``advise_read`` on an open handle reads ahead without changing what a read returns,
    on a closed one it does nothing; ``sync`` is the directory fsync's durability point."""
    ns = nsenv.ns
    nsenv.run(ns.create_bucket(ROOT, "bkt"))
    bucket = nsenv.run(ns.resolve(ROOT, "bkt"))
    inode, fh = nsenv.run(ns.create(ROOT, bucket.ino, b"f", 0o644, os.O_RDWR))
    nsenv.run(ns.write(fh, 0, b"x" * 8192))

    async def advise_then_read() -> bytes | bytearray:
        ns.advise_read(fh, 0, 1 << 20)
        ns.advise_read(fh + 1000, 0, 4096)  # not open: nothing happens
        return await ns.read(fh, 0, 8192)

    assert bytes(nsenv.run(advise_then_read())) == b"x" * 8192
    nsenv.run(ns.release(fh))
    nsenv.run(ns.sync())
    assert nsenv.run(ns.getattr(ROOT, inode.ino)).size == 8192


def test_an_object_call_answers_once_its_subscribers_are_done(nsenv: NsEnv) -> None:
    """A subscriber that answers with an awaitable (the FUSE door: its kernel notifications
    go out from a thread) is waited for: the client gets the PUT's or DELETE's answer only
    once the door is done, so the change shows through the mount when the client looks."""
    ns = nsenv.ns
    nsenv.run(ns.create_bucket(ROOT, "bkt"))
    order: list[str] = []

    def slow(ch: Change) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def done() -> None:
            order.append("notified")
            fut.set_result(None)
        loop.call_later(0.05, done)
        return fut

    async def call(what: str) -> None:
        if what == "put":
            await ns.put_object(ROOT, "bkt", "a/b", chunks(b"x"))
        else:
            await ns.delete_object(ROOT, "bkt", "a/b")
        order.append(what)

    ns.subscribe(slow)
    try:
        for what in ("put", "delete"):
            order.clear()
            nsenv.run(call(what))
            assert order[-1] == what and order.count("notified") >= 1, order
    finally:
        ns.unsubscribe(slow)


def test_the_invalidators_answer_is_done_once_the_kernel_was_told() -> None:
    """The FUSE door's subscriber: the future it returns completes only after its worker
    thread sent the change's notifications (entry first, then the inode's pages)."""
    calls: list[tuple[object, ...]] = []

    class SlowKernel:
        def invalidate_entry(self, parent: int, name: bytes) -> None:
            time.sleep(0.05)
            calls.append(("entry", parent, name, threading.current_thread().name))

        def invalidate_inode(self, ino: int) -> None:
            calls.append(("inode", ino))

    inv = Invalidator()
    inv.notifier = SlowKernel()
    inv.start()
    try:
        async def change() -> list[tuple[object, ...]]:
            fut = inv.on_change(Change(ino=5, parent=1, name=b"x"))
            assert fut is not None
            await fut
            return list(calls)
        assert asyncio.run(change()) == [("entry", 1, b"x", "tierd-fuse-invalidate"),
                                         ("inode", 5)]
    finally:
        inv.stop()
