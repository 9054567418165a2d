"""Several nodes on one PostgreSQL store: the read cache stays exact, inode numbers stay
distinct, and the change feed reports the other nodes' commits in order, across a restart
and a trim.

Each node is a :class:`PgStore` of its own (its own pool, cache and ``node`` name) on one
database, as two daemons would be.  (Writers of two nodes losing no update, with their caches
in use: tests/meta/test_pg_engine.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tierd.meta import MetaStore
from tierd.meta.pg_changes import ChangeFeed
from tierd.meta.pg_engine import _TRACK_MAX, PG_SCHEMA_VERSION, PgStore

from .pg_server import PgServer

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def url(pg_server: PgServer, tmp_path: Path) -> str:
    return pg_server.url(str(tmp_path))


@pytest.fixture
def nodes(url: str) -> Iterator[Callable[..., PgStore]]:
    """``nodes("n1")`` opens a store as node n1; all are closed at the end."""
    opened: list[PgStore] = []

    def open_node(name: str, **kw: int) -> PgStore:
        s = PgStore(url, node=name, **kw)
        opened.append(s)
        return s

    yield open_node
    for s in opened:
        s.close()


def put(store: PgStore, **items: bytes | None) -> None:
    with store.begin(write=True) as tx:
        for k, v in items.items():
            if v is None:
                tx.delete(k.encode())
            else:
                tx.put(k.encode(), v)


def get(store: PgStore, key: str) -> bytes | None:
    tx = store.begin()
    try:
        return tx.get(key.encode())
    finally:
        tx.abort()


def wait_for(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_commit_on_one_node_is_seen_by_the_next_transaction_on_the_other(
        nodes: Callable[..., PgStore]) -> None:
    """b reads (and caches) a key; a changes or deletes it; b's next read or write transaction
    sees a's commit, never b's cached value -- while b's repeated reads do hit its cache."""
    a, b = nodes("n1"), nodes("n2")
    put(a, k=b"0")
    for i in range(1, 40):
        assert get(b, "k") == b"%d" % (i - 1)
        hits = b.cache.hits
        assert get(b, "k") == b"%d" % (i - 1)
        assert b.cache.hits == hits + 1  # a repeated read costs no round trip
        put(a, k=b"%d" % i)
        if i % 2:
            assert get(b, "k") == b"%d" % i
        else:  # b's writer sees it too (its cache is brought up at the lock)
            with b.begin(write=True) as tx:
                assert tx.get(b"k") == b"%d" % i
    put(a, k=None)
    assert get(b, "k") is None
    put(a, k=b"back")
    assert get(b, "k") == b"back"  # the cached "absent" was dropped too


def test_own_commit_fills_the_cache(nodes: Callable[..., PgStore]) -> None:
    a = nodes("n1")
    put(a, x=b"1", y=b"2")
    put(a, y=None)
    hits, misses = a.cache.hits, a.cache.misses
    assert get(a, "x") == b"1" and get(a, "y") is None
    assert (a.cache.hits, a.cache.misses) == (hits + 2, misses)


def test_a_reader_never_sees_a_cached_value_newer_or_older_than_its_snapshot(
        nodes: Callable[..., PgStore]) -> None:
    """A reader on b begun before a's commit keeps its snapshot although b's cache moved on
    to the newer commit, and it does not fill the cache with its older values."""
    a, b = nodes("n1"), nodes("n2")
    put(a, k=b"old", j=b"old")
    assert get(b, "k") == b"old"  # cached at the first commit
    old = b.begin()
    put(a, k=b"new", j=b"new")
    assert get(b, "k") == b"new"  # the cache moved on
    assert get(b, "k") == b"new"
    assert old.get(b"k") == b"old"  # not the cache's newer value
    assert old.get(b"j") == b"old"  # from the server; must not be cached for others
    old.abort()
    assert get(b, "j") == b"new"
    assert get(b, "k") == b"new"


def test_two_nodes_allocate_distinct_inode_numbers(url: str) -> None:
    """open_pg never puts the per-process group-commit overlay in front of the database:
    with it, both nodes would hand out numbers from their own unflushed counter."""
    metas = [MetaStore.open_pg(url, sync="group", node=n) for n in ("n1", "n2")]
    try:
        assert all(isinstance(m.engine, PgStore) for m in metas)
        got: list[list[int]] = [[], []]

        def alloc(i: int) -> None:
            for _ in range(100):
                with metas[i].write() as tx:
                    got[i].append(tx.next_ino())

        threads = [threading.Thread(target=alloc, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(got[0]) | set(got[1])) == 200
    finally:
        for m in metas:
            m.close()


def test_every_write_commit_is_logged_and_notified(url: str,
                                                   nodes: Callable[..., PgStore]) -> None:
    a = nodes("n1")
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN tierd_changes")
        put(a, p=b"1", q=b"2")
        with a.begin(write=True) as tx:  # a read-only write transaction logs nothing
            tx.get(b"p")
        with a.begin(write=True) as tx:
            tx.delete(b"absent")  # deleting nothing changes nothing
        put(a, p=None)
        rows = listener.execute("SELECT seq, node, keys FROM kv_log ORDER BY seq").fetchall()
        seq = listener.execute("SELECT seq FROM meta_schema").fetchall()[0][0]
        notes = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    assert [(n, [bytes(k) for k in keys]) for _, n, keys in rows][-2:] == [
        ("n1", [b"p", b"q"]), ("n1", [b"p"])]
    assert rows[-1][0] == seq and rows[-2][0] == seq - 1
    # each names its seq, node and keys (hex): a feed at seq - 1 reads no log (pg_changes)
    assert notes == [f"{seq - 1}/n1/{b'p'.hex()},{b'q'.hex()}", f"{seq}/n1/{b'p'.hex()}"]


def _feed(store: PgStore) -> tuple[list[tuple[int, list[bytes] | None]], Callable[[], None]]:
    got: list[tuple[int, list[bytes] | None]] = []
    stop = store.watch(lambda seq, keys: got.append((seq, keys)), poll=0.5)
    wait_for(store._feeds[-1].ready.is_set)
    return got, stop


def _seqs(store: PgStore) -> int:
    return int(store.stat()["seq"])


def test_the_feed_reports_the_other_nodes_commits_in_order_and_not_its_own(
        nodes: Callable[..., PgStore]) -> None:
    a, b = nodes("n1"), nodes("n2")
    got_a, _ = _feed(a)
    got_b, _ = _feed(b)
    put(a, k=b"cached")
    assert get(b, "k") == b"cached"
    mine: list[int] = []
    theirs: list[int] = []
    for i in range(30):
        put(a, **{f"a{i}": b"x", "k": b"%d" % i})
        mine.append(_seqs(a))
        if i % 3 == 0:
            put(b, **{f"b{i}": b"y"})
            theirs.append(_seqs(b))
    wait_for(lambda: len(got_b) >= 31 and len(got_a) >= 10)
    assert [s for s, _ in got_b][1:] == mine  # every commit of a, in order, none of b's own
    assert got_b[0][1] == [b"k"]
    assert all(keys == [f"a{i}".encode(), b"k"] for i, (_, keys) in enumerate(got_b[1:]))
    assert [s for s, _ in got_a] == theirs
    # the feed moved b's cache on without a transaction of b's: the stale entry is gone
    wait_for(lambda: b.cache.seq == mine[-1])
    assert b.cache.lookup(b.cache.seq, b"k") == (False, None)
    assert get(b, "k") == b"29"


def test_feed_and_cache_survive_a_database_restart(pg_server: PgServer,
                                                   nodes: Callable[..., PgStore]) -> None:
    a, b = nodes("n1"), nodes("n2")
    got, _ = _feed(b)
    put(a, k=b"before")
    assert get(b, "k") == b"before"
    wait_for(lambda: len(got) == 1)
    pg_server.restart()
    put(a, k=b"after")  # (a's pool reconnects at begin)
    after = _seqs(a)
    wait_for(lambda: got[-1][0] == after)
    assert [k for _, k in got] == [[b"k"], [b"k"]]
    assert b._feeds[0].connects >= 2
    assert get(b, "k") == b"after"
    # a commit made while the feed is cut off is delivered from the log when it reconnects
    pg_server.restart()
    put(a, k=b"again")
    again = _seqs(a)
    wait_for(lambda: got[-1][0] == again)
    assert [s for s, _ in got] == [after - 1, after, again]
    assert get(b, "k") == b"again"


def test_a_trimmed_log_drops_the_whole_cache(url: str, nodes: Callable[..., PgStore]) -> None:
    """b cached k; a changed k and then made more commits than the log keeps: b's next
    transaction cannot learn which keys changed, so it drops everything (else it would
    serve k's old value), and a feed resuming behind the trim reports "everything"."""
    a, b = nodes("n1", log_keep=3), nodes("n2")
    put(a, k=b"old", other=b"o")
    assert get(b, "k") == b"old" and get(b, "other") == b"o"
    behind = b.cache.seq
    put(a, k=b"new")
    for i in range(10):
        put(a, filler=b"%d" % i)
    with psycopg.connect(url) as conn:
        first = conn.execute("SELECT min(seq) FROM kv_log").fetchall()[0][0]
    assert first > behind + 1  # the commit that changed k is gone from the log
    dropped = b.cache.dropped_all
    assert get(b, "k") == b"new"
    assert b.cache.dropped_all == dropped + 1
    assert get(b, "other") == b"o"

    got: list[tuple[int, list[bytes] | None]] = []
    feed = ChangeFeed(url, "n2", b.cache, lambda s, k: got.append((s, k)), poll=0.2)
    feed.cursor = behind  # resume from where an earlier feed stopped
    feed.start()
    try:
        wait_for(lambda: bool(got) and got[-1][0] == _seqs(a))
    finally:
        feed.close()
    assert got[0] == (first - 1, None)
    assert [s for s, _ in got[1:]] == list(range(first, _seqs(a) + 1))
    assert feed.gaps == 1


def test_a_huge_commit_is_logged_as_everything(nodes: Callable[..., PgStore]) -> None:
    a, b = nodes("n1"), nodes("n2")
    put(a, k=b"old")
    assert get(b, "k") == b"old"
    got, _ = _feed(b)
    with a.begin(write=True) as tx:
        for i in range(_TRACK_MAX + 5):
            tx.put(b"bulk%06d" % i, b"")
        tx.put(b"k", b"new")
        assert tx.get(b"k") == b"new" and tx.get(b"bulk000003") == b""
    wait_for(lambda: len(got) == 1)
    assert got == [(_seqs(a), None)]
    assert get(b, "k") == b"new" and get(a, "k") == b"new"


def test_layout_1_is_migrated(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (k bytea PRIMARY KEY, v bytea NOT NULL)")
        conn.execute("CREATE TABLE meta_schema (version integer NOT NULL)")
        conn.execute("INSERT INTO meta_schema VALUES (1)")
        conn.execute("INSERT INTO kv VALUES ('\\x6b'::bytea, '\\x31'::bytea)")
    store = PgStore(url, node="n1")
    try:
        assert get(store, "k") == b"1"
        put(store, k=b"2")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version, seq FROM meta_schema").fetchall() == [
                (PG_SCHEMA_VERSION, 1)]
            rows = conn.execute("SELECT seq, node, keys FROM kv_log").fetchall()
        assert [(s, n, [bytes(k) for k in keys]) for s, n, keys in rows] == [(1, "n1", [b"k"])]
    finally:
        store.close()
    PgStore(url).close()  # opening a migrated database again changes nothing
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version, seq FROM meta_schema").fetchall() == [
            (PG_SCHEMA_VERSION, 1)]


def test_an_ended_read_transaction_does_not_keep_its_snapshot(
        url: str, nodes: Callable[..., PgStore]) -> None:
    """A read transaction's COMMIT waits for the connection's next begin, but not for long:
    an open snapshot on an idle node would hold back the server's vacuum."""
    a = nodes("n1")
    put(a, k=b"1")
    assert get(a, "k") == b"1"
    with psycopg.connect(url, autocommit=True) as conn:
        def open_elsewhere() -> int:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE state = "
                               "'idle in transaction' AND pid <> pg_backend_pid()").fetchone()
            return int(row[0]) if row else -1

        wait_for(lambda: open_elsewhere() == 0, timeout=2.0)
        assert get(a, "k") == b"1"  # the parked connection is ended for real, and usable


def test_a_node_name_that_could_break_the_commit_query_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="node name"):
        PgStore(url, node="n1'); DROP TABLE kv; --")
