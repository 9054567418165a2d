"""Another node's changes reach this node's namespace subscribers (the FUSE door's cache
invalidation), on this node's event loop: :mod:`tierd.namespace.remote` over the PostgreSQL
change feed, with two real namespaces on one database as two nodes."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nsplacement import close_namespace, open_namespace

from tierd.acl import Identity
from tierd.meta import MetaStore
from tierd.namespace import ROOT_INO, Change, Namespace
from tierd.namespace.remote import EVERYTHING, changes_of, follow

from .pg_server import PgServer

pytestmark = pytest.mark.timeout(180)

ROOT = Identity.ROOT


def u64(n: int) -> bytes:
    return struct.pack(">Q", n)


def test_changes_of_maps_keys_to_what_a_door_caches() -> None:
    keys = [b"I" + u64(5), b"D" + u64(1) + b"dir/", b"D" + u64(1) + b"file",
            b"X" + u64(7) + b"user.tag", b"I" + u64(5), b"Cnext_ino", b"Q" + u64(5),
            b"L" + u64(5) + u64(1) + b"file", b"R" + u64(9), b"D" + u64(3)]
    assert changes_of(keys) == [Change(ino=5), Change(parent=1, name=b"dir"),
                                Change(parent=1, name=b"file"), Change(ino=7)]


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_another_nodes_changes_reach_the_subscribers_on_the_loop(pg_server: PgServer,
                                                                 tmp_path: Path) -> None:
    url = pg_server.url(str(tmp_path))
    metas = [MetaStore.open_pg(url, node=n) for n in ("n1", "n2")]
    loops = [asyncio.new_event_loop() for _ in metas]
    nss: list[Namespace] = []
    try:
        for i, (meta, loop) in enumerate(zip(metas, loops, strict=True)):
            nss.append(loop.run_until_complete(open_namespace(meta, tmp_path / f"n{i + 1}")))
        seen: list[tuple[Change, int]] = []
        nss[1].subscribe(lambda ch: seen.append((ch, threading.get_ident())))
        stop = follow(nss[1], metas[1].engine, loops[1])
        assert stop is not None
        feeds = metas[1].engine._feeds  # type: ignore[attr-defined]
        deadline = time.monotonic() + 15
        while not feeds[0].ready.is_set():
            assert time.monotonic() < deadline
            time.sleep(0.02)

        def drive(until: set[Change]) -> None:
            deadline = time.monotonic() + 15
            while not until <= {c for c, _ in seen}:
                assert time.monotonic() < deadline, (until, seen)
                loops[1].run_until_complete(asyncio.sleep(0.02))

        # node 1 makes a bucket and an object through its own namespace
        loops[0].run_until_complete(nss[0].create_bucket(ROOT, "bkt"))
        loops[0].run_until_complete(nss[0].put_object(ROOT, "bkt", "a/leaf", _chunks(b"x")))
        bkt = loops[0].run_until_complete(nss[0].resolve(ROOT, "bkt"))
        a = loops[0].run_until_complete(nss[0].resolve(ROOT, "bkt/a"))
        leaf = loops[0].run_until_complete(nss[0].resolve(ROOT, "bkt/a/leaf"))
        drive({Change(parent=ROOT_INO, name=b"bkt"), Change(parent=bkt.ino, name=b"a"),
               Change(parent=a.ino, name=b"leaf"), Change(ino=leaf.ino)})
        assert {t for _, t in seen} == {threading.get_ident()}  # the loop's thread
        # node 2's own changes are reported once, by its own call, not again by the feed
        seen.clear()
        loops[1].run_until_complete(nss[1].delete_object(ROOT, "bkt", "a/leaf"))
        loops[0].run_until_complete(nss[0].put_object(ROOT, "bkt", "mark", _chunks(b"y")))
        drive({Change(parent=bkt.ino, name=b"mark")})  # (the feed is past the delete)
        assert sum(c.parent == a.ino and c.name == b"leaf" for c, _ in seen) == 1, seen
        # a commit too large to list its keys is reported as "everything"
        with metas[0].engine.begin(write=True) as tx:
            for i in range(10_005):
                tx.put(b"Tbulk%06d" % i, b"")
        drive({EVERYTHING})
        stop()
        assert not feeds
    finally:
        for ns, loop in zip(nss, loops, strict=False):
            loop.run_until_complete(close_namespace(ns))
        for loop in loops:
            loop.close()
        for meta in metas:
            meta.close()
