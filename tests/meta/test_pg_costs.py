"""Round trips the cluster's background and write paths make over PostgreSQL, where each
one cost CPU on every node (bench/cluster_meta.py --cpu --statements, docs/metadata.md
"Measured"):

* the full queue scan's look at other nodes' files (:func:`tierd.placement.homes.sweep`)
  reads their inodes in one query per chunk, not one each (~1,000 queries per node every
  5 s while a burst of creates waited for its persist delay);
* a scan sends a write transaction's buffered writes only when one falls in its range, and
  then as one message (an unlink's xattr scan after its entry writes sent them as a
  statement per key, ~8 an unlink), with the same answers.

Queries are counted by wrapping ``PgTxn._query`` (the engine's way to the server inside a
transaction) and psycopg's ``executemany``, as tests/meta/test_pg_warm.py does."""

from __future__ import annotations

import stat
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tierd.meta import Inode, MetaStore
from tierd.meta.pg_engine import PgTxn
from tierd.placement import homes
from tierd.placement.paths import queue_token

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def metas(pg_nodes: Callable[[str], MetaStore]) -> Callable[[str], MetaStore]:
    return pg_nodes


@pytest.fixture
def queries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every query a transaction made (any thread), by what it did; and each
    ``executemany`` (a statement per row) as "executemany"."""
    seen: list[str] = []
    query = PgTxn._query
    many = psycopg.Cursor.executemany

    def counted(txn: PgTxn, q: bytes, params: tuple[Any, ...], doing: str,
                **kw: Any) -> list[Any]:
        seen.append(doing)
        return query(txn, q, params, doing, **kw)

    def counted_many(cur: Any, *a: Any, **kw: Any) -> None:
        seen.append("executemany")
        many(cur, *a, **kw)
    monkeypatch.setattr(PgTxn, "_query", counted)
    monkeypatch.setattr(psycopg.Cursor, "executemany", counted_many)
    return seen


def _queue_files(meta: MetaStore, inos: range, size: int) -> None:
    """Files of ``meta``'s node (their home), queued for persistence, no cold record."""
    with meta.write() as tx:
        for ino in inos:
            tx.put_inode(Inode(ino=ino, mode=stat.S_IFREG | 0o644, uid=0, gid=0, size=size,
                               version=1))
            tx.enqueue(ino, queue_token(None))


@pytest.mark.parametrize("alive", [True, False])
def test_the_sweep_reads_queued_inodes_in_one_query_per_chunk(
        metas: Callable[[str], MetaStore], queries: list[str], alive: bool) -> None:
    n1, n2 = metas("n1"), metas("n2")
    theirs, mine = range(1000, 1000 + homes.CHUNK + 200), range(5000, 5050)
    _queue_files(n2, theirs, 10)
    _queue_files(n1, mine, 10)
    with n1.snapshot() as tx:
        queue = tx.list_queue()
    assert len(queue) == len(theirs) + len(mine)
    queries.clear()
    taken, stranded = homes.sweep(n1, "n1", queue, lambda node: alive)
    assert taken == []
    if alive:
        assert stranded == {}
    else:  # the dead node's unpersisted bytes: every one of its files listed, none taken
        assert set(stranded) == {"n2"} and stranded["n2"].inos == set(theirs)
    reads = [q for q in queries if q == "reading keys" or q == "reading a key"]
    assert len(reads) <= 2 * 2 + (homes.LISTED + 1 if not alive else 0), queries[:20]


def test_a_scan_sends_buffered_writes_only_in_its_range_and_in_one_message(
        metas: Callable[[str], MetaStore], queries: list[str]) -> None:
    n1, n2 = metas("n1"), metas("n2")
    with n1.write() as tx:
        for i in range(6):
            tx.kv.put(b"xa%d" % i, b"old")
    with n1.write() as tx:
        for i in range(3):
            tx.kv.put(b"ka%d" % i, b"v%d" % i)
        tx.kv.delete(b"xa0")
        tx.kv.delete(b"xa1")
        kv = tx.kv
        assert isinstance(kv, PgTxn)
        queries.clear()
        other = list(kv.scan(b"xb", b"xc"))  # no buffered write in this range
        assert other == [] and len(kv._unsent) == 5, "sent for a scan they cannot change"
        assert list(kv.scan(b"ka", b"kb")) == [(b"ka%d" % i, b"v%d" % i) for i in range(3)]
        assert [k for k, _ in kv.scan(b"xa", b"xb")] == [b"xa%d" % i for i in range(2, 6)]
        assert "executemany" not in queries, queries
    with n2.snapshot() as tx:
        assert [tx.kv.get(b"ka%d" % i) for i in range(3)] == [b"v0", b"v1", b"v2"]
        assert [k for k, _ in tx.kv.scan(b"xa", b"xb")] == [b"xa%d" % i for i in range(2, 6)]


def test_large_buffered_writes_are_still_sent_before_a_scan(
        metas: Callable[[str], MetaStore]) -> None:
    """Over the one-message size the writes go as before (psycopg's executemany)."""
    n1, n2 = metas("n1"), metas("n2")
    big = b"v" * (64 << 10)
    with n1.write() as tx:
        for i in range(6):  # 384 KiB
            tx.kv.put(b"b%d" % i, big)
        assert [k for k, _ in tx.kv.scan(b"b", b"c")] == [b"b%d" % i for i in range(6)]
    with n2.snapshot() as tx:
        assert all(tx.kv.get(b"b%d" % i) == big for i in range(6))
