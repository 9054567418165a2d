"""The placement engine's transactions over PostgreSQL make their reads off the event loop:
the put-intention and record transactions (``TxnBatch``, each body's ``warm``), a
recursive listing's import and its judging walk (``Importer.import_prefix``,
``_judge_missing``), one directory's refresh before a delimited listing or a look-up
(``refresh_dir``), and the pending deletes' passes.  Every query on the loop's thread is a
round trip during which the daemon serves nothing else -- and, inside a write transaction,
one made with the cluster's writer lock held.  Counted as in test_pg_warm_namespace.py: the
calls of ``PgTxn._query`` made on the loop's thread with one of these on the stack.  Before,
this test counted about 3,000 such queries (the import's walk alone ~2,300: a query per
file, per listing).  A reconcile's first look stays a synchronous snapshot on the loop
(about 4 queries a file here): as an asnapshot it cost more than it saved (upload.py)."""

from __future__ import annotations

import asyncio
import contextlib
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

pytestmark = pytest.mark.timeout(180)

ROOT = Identity.ROOT
#: the placement code under test (the namespace's own bodies: test_pg_warm_namespace.py)
WHERE = {"_commit", "import_prefix", "_judge_missing", "refresh_dir", "_nothing_unlisted",
         "_delete_pass", "_delete_batch"}


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_placement_transactions_read_off_the_loop(
        pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = pg_server.url(str(tmp_path))
    cold = tmp_path / "cold"
    shared = {"cold_dir": cold, "cold_url": f"file://{cold}"}  # one cold store, two nodes
    spy = LoopQueries(WHERE, "/tierd/placement/")

    async def run() -> None:
        other = await open_namespace(MetaStore.open_pg(url, node="n2"), tmp_path / "n2",
                                     "file-cold", **shared)
        ns = await open_namespace(MetaStore.open_pg(url, node="n1"), tmp_path / "n1",
                                  "file-cold", **shared)
        try:
            await other.create_bucket(ROOT, "bkt")
            for i in range(10):
                await other.put_object(ROOT, "bkt", f"dir/sub/o{i}", _body(b"x" * 100))
            assert await other.placement.drain("bkt/", timeout=60)
            monkeypatch.setattr(PgTxn, "_query", spy.counted)
            for i in range(10):  # uploaded by n1's persister: reconcile, intention, record
                await ns.put_object(ROOT, "bkt", f"dir/p{i}", _body(b"y" * 100))
            assert await ns.placement.drain("bkt/", timeout=60)
            for _ in range(3):  # a recursive listing imports the prefix and walks it
                listing = await ns.list_objects(ROOT, "bkt", prefix="dir/")
                assert len(listing.contents) == 20
            # a directory's listing and a look-up of a missing name refresh one level
            # (import_ttl 0 here: each of them lists cold)
            listing = await ns.list_objects(ROOT, "bkt", prefix="dir/", delimiter="/")
            assert listing.prefixes == ["dir/sub/"] and len(listing.contents) == 10
            bucket = (await ns.lookup(ROOT, ROOT_INO, b"bkt")).ino
            d = (await ns.lookup(ROOT, bucket, b"dir")).ino
            for name in (b"absent", b"sub"):
                with contextlib.suppress(FsError):
                    await ns.lookup(ROOT, d, name)
            for i in range(10):  # the delete worker's passes and batches
                await ns.unlink(ROOT, d, f"p{i}".encode())
            for _ in range(200):
                if not any((cold / "bkt" / "dir").glob("p*")):
                    break
                await asyncio.sleep(0.05)
            assert not any((cold / "bkt" / "dir").glob("p*"))
        finally:
            monkeypatch.undo()
            await close_nodes(ns, other)
    asyncio.run(run())
    assert spy.seen == {}, spy.wheres
