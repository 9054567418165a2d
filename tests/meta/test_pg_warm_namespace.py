"""The namespace's hot transactions over PostgreSQL make their reads off the event loop
(``warm=`` of tierd/meta/reads.py and the bodies' own read code: tierd/meta/pg_warm.py): a
lookup of a new name, a create, a mkdir, an S3 PUT, HEAD and listing (with the import of
what cold holds under its prefix) make no query on the loop's thread (an unlink and a
rename prefetch nothing: docs/metadata.md says why), though every key they read is new to
the node's cache (another node made the objects, or the names do not exist yet).

Queries on the loop's thread are counted by wrapping ``PgTxn._query`` and kept only when the
operation under test is on the stack (the namespace's own background work -- the persister,
the small-write log's trim -- also reads, and is not what is measured here).  Without the
prefetch each of these operations makes two or more such queries."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nsplacement import open_namespace

from tierd.acl import Identity
from tierd.errors import FsError
from tierd.meta import MetaStore
from tierd.meta.pg_engine import PgTxn
from tierd.namespace import ROOT_INO

from .loop_queries import LoopQueries, close_nodes
from .pg_server import PgServer

pytestmark = pytest.mark.timeout(120)

ROOT = Identity.ROOT
OPS = ("lookup", "create", "mkdir", "put_object", "head_object", "list_objects")


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_hot_namespace_transactions_read_off_the_loop(
        pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = pg_server.url(str(tmp_path))
    spy = LoopQueries(OPS, "/tierd/namespace/")

    async def run() -> None:
        other = await open_namespace(MetaStore.open_pg(url, node="n2"), tmp_path / "n2")
        ns = await open_namespace(MetaStore.open_pg(url, node="n1"), tmp_path / "n1")
        try:
            await other.create_bucket(ROOT, "bkt")
            for i in range(3):
                await other.put_object(ROOT, "bkt", f"dir/o{i}", _body(b"x"))
            bucket = (await other.lookup(ROOT, ROOT_INO, b"bkt")).ino
            monkeypatch.setattr(PgTxn, "_query", spy.counted)
            with pytest.raises(FsError):
                await ns.lookup(ROOT, bucket, b"absent")
            _, fh = await ns.create(ROOT, bucket, b"new", 0o644, os.O_CREAT | os.O_WRONLY)
            await ns.release(fh)
            await ns.mkdir(ROOT, bucket, b"sub", 0o755)
            await ns.rename(ROOT, bucket, b"new", bucket, b"renamed")
            await ns.unlink(ROOT, bucket, b"renamed")
            await ns.put_object(ROOT, "bkt", "dir/p", _body(b"y"))
            assert (await ns.head_object(ROOT, "bkt", "dir/o1")).size == 1
            listing = await ns.list_objects(ROOT, "bkt", prefix="dir/")
            assert [c[0] for c in listing.contents] == ["dir/o0", "dir/o1", "dir/o2", "dir/p"]
        finally:
            monkeypatch.undo()
            await close_nodes(ns, other)
    asyncio.run(run())
    # a listing's import of what cold holds (tierd/placement/importer.py) reads off the
    # loop too: test_pg_warm_placement.py
    assert spy.seen == {}, spy.wheres
