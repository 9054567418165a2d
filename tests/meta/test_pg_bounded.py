"""What a FUSE create costs over PostgreSQL beyond its own write, against a real server
(bench/cluster_meta.py --statements; docs/cluster.md, "Measured"):

* the change feed delivers a commit from its notification's payload (seq, node, keys), not
  with a read of ``kv_log`` per commit (~1.2 statements per create over three nodes);
* the parent's GETATTR and the RELEASE's look for an orphan are answered from the node's
  read cache while the feed is current (:mod:`tierd.meta.pg_quiet`): no transaction at all
  (each was a read transaction, 2 of the ~3.6 per create); and the cache still gives way to
  the server as soon as another node's change is announced, the feed stops, or this node's
  own unlink made the file an orphan (the release still reaps it).

Begins are counted by wrapping ``PgStore._begin`` (every read and write transaction's round
trip), log reads by wrapping psycopg's ``Connection.execute``, as tests/meta/test_pg_costs.py
counts queries."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import pytest

from tierd.acl import Identity
from tierd.errors import FsError
from tierd.meta import MetaStore, pg_changes
from tierd.meta.pg_async import AsyncGate
from tierd.meta.pg_engine import PgStore, PgTxn
from tierd.meta.pg_quiet import quiet_seq
from tierd.namespace import Namespace

from .conftest import wait_until as _wait

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")

ROOT = Identity.ROOT


@pytest.fixture
def log_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per read of ``kv_log`` by a change feed (any thread)."""
    seen: list[int] = []
    execute = psycopg.Connection.execute

    def counted(conn: Any, query: Any, *a: Any, **kw: Any) -> Any:
        if query == pg_changes._ROWS:
            seen.append(1)
        return execute(conn, query, *a, **kw)
    monkeypatch.setattr(psycopg.Connection, "execute", counted)
    return seen


@pytest.fixture
def begins(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The node of every read transaction begun, by any store (writes are the
    operations' own, and the garbage reclaimer's in the background)."""
    seen: list[str] = []
    begin = PgStore._begin

    def counted(store: PgStore, write: bool) -> Any:
        if not write:
            seen.append(store.node)
        return begin(store, write)
    monkeypatch.setattr(PgStore, "_begin", counted)
    return seen


def e2_seq(meta: MetaStore) -> int:
    """The seq of ``meta``'s node's last commit."""
    engine = meta.engine
    assert isinstance(engine, PgStore)
    return engine.local_seq


def _on_reads(monkeypatch: pytest.MonkeyPatch,
              record: Callable[[AsyncGate, set[str]], None]) -> None:
    """Call ``record(gate, names)`` for every read transaction an async read begins on the
    loop, with the names of the functions on its stack (coroutines awaiting included)."""
    begun = AsyncGate._begun

    async def counted(gate: AsyncGate, loop: Any, write: bool, warm: Any) -> Any:
        if not write:
            frame = sys._getframe(1)
            names = set()
            while frame is not None:
                names.add(frame.f_code.co_name)
                frame = frame.f_back  # type: ignore[assignment]
            record(gate, names)
        return await begun(gate, loop, write, warm)
    monkeypatch.setattr(AsyncGate, "_begun", counted)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The node of every read transaction an async read of the namespace's lookup, getattr
    or release began (the placement's own background reads are not counted: they would
    make the counts depend on timing)."""
    seen: list[str] = []
    mine = {"lookup", "getattr", "_reap_if_orphan"}

    def record(gate: AsyncGate, names: set[str]) -> None:
        if names & mine:
            seen.append(gate.store.node)
    _on_reads(monkeypatch, record)
    return seen


def test_the_feed_delivers_commits_from_their_notifications(
        pg_nodes: Callable[[str], MetaStore], log_reads: list[int]) -> None:
    n1, n2 = pg_nodes("n1"), pg_nodes("n2")
    e1 = n1.engine
    assert isinstance(e1, PgStore)
    got: list[tuple[int, list[bytes] | None]] = []
    stop = e1.watch(lambda seq, keys: got.append((seq, keys)))
    try:
        feed = e1._feeds[0]
        _wait(feed.ready.is_set, "the feed never listened")
        with n1.engine.begin(write=False) as tx:  # n1 caches the keys n2 will change
            assert tx.get(b"k0") is None
        log_reads.clear()
        for i in range(30):
            with n2.engine.begin(write=True) as tx:
                tx.put(b"k%d" % (i % 3), b"v%d" % i)
            time.sleep(0.005)
        _wait(lambda: len(got) == 30, f"delivered {len(got)} of 30")
        assert [keys for _, keys in got] == [[b"k%d" % (i % 3)] for i in range(30)]
        seqs = [s for s, _ in got]
        assert seqs == list(range(seqs[0], seqs[0] + 30))
        # the polls' reads only (one a second), not one per commit as before
        assert len(log_reads) <= 4, len(log_reads)
        assert feed.from_payload >= 26
        assert feed.current() and e1.cache.seq >= seqs[-1]
        with n1.engine.begin(write=False) as tx:  # the cache dropped n2's keys
            assert tx.get(b"k0") == b"v27"
    finally:
        stop()
    assert not feed.current()


def test_a_creates_parent_getattr_and_release_begin_no_transaction(
        two_nodes: tuple[list[MetaStore], list[Namespace], asyncio.AbstractEventLoop],
        asked: list[str]) -> None:
    begins = asked
    metas, (ns1, ns2), loop = two_nodes
    run = loop.run_until_complete
    e1 = metas[0].engine
    assert isinstance(e1, PgStore)
    feed = e1._feeds[0]
    bkt = run(ns1.create_bucket(ROOT, "bkt"))
    d = run(ns1.mkdir(ROOT, bkt.ino, b"d", 0o777))
    for i in range(10):  # create + close, then the kernel's GETATTR of the parent
        f, fh = run(ns1.create(ROOT, d.ino, b"f%d" % i, stat.S_IFREG | 0o644,
                               os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        _wait(lambda: quiet_seq(e1) is not None, "the feed never caught up")
        begins.clear()
        run(ns1.release(fh))
        assert run(ns1.getattr(ROOT, d.ino, bounded=True)).mtime_ns >= f.mtime_ns
        assert begins == [], (i, begins)  # (before: a read for each)
    assert run(ns1.lookup(ROOT, d.ino, b"f3", bounded=True)).ino > 0
    assert begins == []
    # a name the cache does not know (in a directory another node made: the cache cannot
    # know it complete, test_pg_complete.py): a statement per link of the chain it lacks
    # (dirent, inode), no transaction
    other = run(ns2.mkdir(ROOT, bkt.ino, b"other", 0o777))
    _wait(lambda: quiet_seq(e1) is not None and e1.cache.seq >= e2_seq(metas[1]),
          "the feed never caught up")
    fetches = e1.bounded_fetches
    with pytest.raises(FsError) as e:
        run(ns1.lookup(ROOT, other.ino, b"new", bounded=True))
    assert e.value.errno == errno.ENOENT
    assert e1.bounded_fetches > fetches  # (the placement's refresh reads on its own)
    theirs, fh2 = run(ns2.create(ROOT, d.ino, b"theirs", stat.S_IFREG | 0o600,
                                 os.O_WRONLY | os.O_CREAT))
    run(ns2.release(fh2))
    _wait(lambda: quiet_seq(e1) is not None and e1.cache.seq >= e2_seq(metas[1]),
          "the feed never caught up")
    begins.clear()
    fetches = e1.bounded_fetches
    got = run(ns1.lookup(ROOT, d.ino, b"theirs", bounded=True))
    assert (got.ino, got.mode & 0o777) == (theirs.ino, 0o600)
    assert begins == [] and e1.bounded_fetches == fetches + 1, begins
    assert e1.cache_only_reads >= 21
    # exact reads (an open's, S3's) still begin a transaction
    run(ns1.getattr(ROOT, d.ino))
    assert begins == ["n1"]

    # another node's change: seen by the next bounded read once the feed announced it,
    # never an answer older than the feed's (n1's kernel would be told at the same time)
    run(ns2.setattr(ROOT, d.ino, mode=0o700))
    _wait(lambda: run(ns1.getattr(ROOT, d.ino, bounded=True)).mode & 0o777 == 0o700,
          "n2's chmod never reached n1")
    _wait(lambda: quiet_seq(e1) is not None, "the feed never caught up")
    begins.clear()
    assert run(ns1.getattr(ROOT, d.ino, bounded=True)).mode & 0o777 == 0o700
    assert begins == []

    # an unlink while open on n1: the cache says nlink 0, so the release reaps it
    f, fh = run(ns1.create(ROOT, d.ino, b"gone", stat.S_IFREG | 0o644,
                           os.O_WRONLY | os.O_CREAT))
    run(ns1.write(fh, 0, b"data"))
    run(ns1.unlink(ROOT, d.ino, b"gone"))
    run(ns1.release(fh))
    with metas[1].snapshot() as tx:
        assert tx.get_inode(f.ino) is None

    # the feed stopped: nothing vouches for the cache, every read goes to the server
    feed.close()
    _wait(lambda: not feed.current(), "a closed feed still current", timeout=5)
    begins.clear()
    run(ns1.getattr(ROOT, d.ino, bounded=True))
    assert begins == ["n1"]


def test_a_read_waits_for_announced_commits(
        pg_nodes: Callable[[str], MetaStore]) -> None:
    """Announced but not yet applied (the feed's cursor behind what it heard): the cache
    answers nothing, whatever it holds."""
    n1, n2 = pg_nodes("n1"), pg_nodes("n2")
    e1 = n1.engine
    assert isinstance(e1, PgStore)
    stop = e1.watch(lambda seq, keys: None)
    try:
        feed = e1._feeds[0]
        _wait(feed.ready.is_set, "the feed never listened")
        with n2.engine.begin(write=True) as tx:
            tx.put(b"a", b"1")
        _wait(lambda: quiet_seq(e1) is not None, "the feed never caught up")
        feed.heard += 1  # (as between a notification's arrival and its delivery)
        assert quiet_seq(e1) is None
    finally:
        stop()


def test_a_writers_commit_fills_the_cache_after_the_feed_applied_it() -> None:
    """The feed may deliver this node's own commit (from its notification) before the
    commit's reply reaches the writer: the written keys are still put in the cache, so the
    create's parent and new inode are there for the GETATTR and RELEASE that follow."""
    from tierd.meta.pg_cache import ReadCache

    cache = ReadCache()
    cache.advance(None, 7, [])
    cache.fill(7, b"old", b"x")
    cache.apply(8, [b"I1", b"D1f"])  # the feed, first
    cache.committed(7, 8, {b"I1": b"inode", b"D1f": b"dirent"})
    assert cache.lookup(8, b"I1") == (True, b"inode")
    assert cache.lookup(8, b"D1f") == (True, b"dirent")
    cache.committed(6, 7, {b"I1": b"older"})  # a writer far behind: nothing
    assert cache.lookup(8, b"I1") == (True, b"inode")


@pytest.mark.parametrize("changed_elsewhere", [False, True])
def test_a_writer_joining_a_group_prefetches_without_a_transaction(
        pg_nodes: Callable[[str], MetaStore], begins: list[str],
        monkeypatch: pytest.MonkeyPatch, changed_elsewhere: bool) -> None:
    """A member's prefetch: the group's writes, the cache at the group's seq, one statement
    for the rest (the group holds the writer lock: nothing else commits meanwhile); before,
    a read transaction of its own -- over three nodes about half the creates join a group."""
    from tierd.meta import MetaTxn, pg_group

    monkeypatch.setattr(pg_group, "GROUP_S", 60.0)
    meta, other = pg_nodes("n1"), pg_nodes("n2")
    with meta.write() as tx:
        tx.kv.put(b"a", b"0")
        tx.kv.put(b"b", b"0")
    if changed_elsewhere:  # this node's cached "b" is dropped: the statement reads it
        with other.write() as tx:
            tx.kv.put(b"b", b"1")
    seqs: list[int] = []

    def leader(tx: MetaTxn) -> None:
        tx.kv.put(b"a", b"first")

    def member(tx: MetaTxn) -> tuple[list[bool], list[bytes | None]]:
        kv = tx.kv
        assert isinstance(kv, PgTxn)
        local = [kv.local(k)[0] for k in (b"b", b"gone", b"c")]
        values = [kv.get(k) for k in (b"a", b"b", b"gone", b"c")]
        kv.put(b"c", b"second")
        return local, values

    async def write(body: Callable[[MetaTxn], T], keys: tuple[bytes, ...] = (),
                    warm: Callable[[MetaTxn], object] | None = None) -> T:
        async with meta.awrite(keys=keys, warm=warm) as tx:
            seqs.append(getattr(tx.kv, "seq"))  # noqa: B009
            return body(tx)

    async def both() -> tuple[list[bool], list[bytes | None]]:
        lead = asyncio.create_task(write(leader))
        await asyncio.sleep(0)  # the leader takes the turn; the member waits to join
        got = await write(member, (b"c",), lambda tx: [tx.kv.get(k) for k in (b"a", b"b", b"gone")])
        await lead
        return got
    begins.clear()
    local, values = asyncio.run(both())
    assert seqs[0] == seqs[1], "not one group: the test proves nothing"
    assert local == [True, True, True], "not prefetched"
    assert values == [b"first", b"1" if changed_elsewhere else b"0", None, None]
    assert begins == [], begins
    with other.snapshot() as tx:
        assert (tx.kv.get(b"a"), tx.kv.get(b"c")) == (b"first", b"second")


def test_a_writing_commit_is_three_statements(
        pg_nodes: Callable[[str], MetaStore], monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes, seq bump, log row and trim as one statement (data-modifying ``WITH``), then
    the NOTIFY and COMMIT: up to six statements before; what they did is unchanged."""
    n1, n2 = pg_nodes("n1"), pg_nodes("n2")
    e1 = n1.engine
    assert isinstance(e1, PgStore)
    e1.log_keep, e1.trim_every = 3, 1  # (every commit trims the log)
    sent: list[bytes] = []
    execute = psycopg.Connection.execute

    def seen(conn: Any, query: Any, *a: Any, **kw: Any) -> Any:
        if isinstance(query, bytes) and query.endswith(b"COMMIT"):
            sent.append(query)
        return execute(conn, query, *a, **kw)
    monkeypatch.setattr(psycopg.Connection, "execute", seen)
    with n1.engine.begin(write=True) as tx:
        tx.put(b"x", b"1")
        tx.put(b"y", b"2")
    for i in range(4):
        with n1.engine.begin(write=True) as tx:
            tx.put(b"x", b"%d" % i)
            tx.delete(b"y")
    assert len(sent) == 5 and all(q.count(b"; ") == 2 for q in sent), sent[-1][:300]
    with n2.engine.begin(write=False) as tx:
        assert (tx.get(b"x"), tx.get(b"y")) == (b"3", None)
    with psycopg.connect(e1.url, autocommit=True) as conn:
        seqs = [r[0] for r in conn.execute("SELECT seq FROM kv_log ORDER BY seq")]
        top = conn.execute("SELECT seq FROM meta_schema").fetchall()[0][0]
    assert seqs == list(range(top - 2, top + 1))  # the last three: trimmed below


@pytest.fixture
def call_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """For every read transaction begun on the loop: which of ``flush``, ``release`` and
    ``getxattr`` it was begun under -- leaving out the release's look for an orphan (a
    bounded read, which begins one while the feed has not yet delivered the release's own
    commit: a matter of timing, not of what the close reads)."""
    seen: list[str] = []
    mine = ("flush", "release", "getxattr")

    def record(gate: AsyncGate, names: set[str]) -> None:
        if "_reap_if_orphan" not in names:
            seen.extend(n for n in mine if n in names)
    _on_reads(monkeypatch, record)
    return seen


def test_a_close_and_the_kernels_capability_look_begin_no_read(
        two_nodes: tuple[list[MetaStore], list[Namespace], asyncio.AbstractEventLoop],
        call_reads: list[str]) -> None:
    """A written file's close reports the version its own commit wrote (the FUSE door's
    page cache records it) instead of reading the inode again after the commit; and the
    kernel's ``security.capability`` look before a new file's first write is a bounded
    read: the cache, and a statement for the key it lacks, no read transaction."""
    reads = call_reads
    metas, (ns1, ns2), loop = two_nodes
    run = loop.run_until_complete
    e1 = metas[0].engine
    assert isinstance(e1, PgStore)
    caps = b"security.capability"
    bkt = run(ns1.create_bucket(ROOT, "bkt"))
    f, fh = run(ns1.create(ROOT, bkt.ino, b"f", stat.S_IFREG | 0o644,
                           os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    _wait(lambda: quiet_seq(e1) is not None, "the feed never caught up")
    fetches = e1.bounded_fetches
    # a new inode's attributes are a complete prefix of the cache (test_pg_complete.py):
    # then not even a statement
    known = e1.cache.lookup(e1.cache.seq, b"X" + f.ino.to_bytes(8, "big") + caps)[0]
    with pytest.raises(FsError) as e:
        run(ns1.getxattr(ROOT, f.ino, caps, bounded=True))
    assert e.value.errno == errno.ENODATA
    assert reads == [] and e1.bounded_fetches == fetches + (0 if known else 1), reads
    run(ns1.write(fh, 0, b"one"))
    v1 = run(ns1.flush(fh))
    assert reads == [], reads  # (before: one read transaction after the commit)
    with metas[0].snapshot() as tx:
        inode = tx.get_inode(f.ino)
        assert inode is not None and v1 == inode.version and inode.size == 3
    run(ns1.write(fh, 3, b"two"))
    v2 = run(ns1.release(fh))
    assert reads == [] and v2 is not None and v2 > v1, (reads, v1, v2)
    # a capability set on the other node is what the next bounded look answers, once the
    # feed delivered it (as the kernel's caches would be told); an exact look reads
    run(ns2.setxattr(ROOT, f.ino, caps, b"\x01\x00\x00\x02" + bytes(16)))
    _wait(lambda: quiet_seq(e1) is not None and e1.cache.seq >= e2_seq(metas[1]),
          "the feed never caught up")
    assert run(ns1.getxattr(ROOT, f.ino, caps, bounded=True))[:4] == b"\x01\x00\x00\x02"
    reads.clear()
    assert run(ns1.getxattr(ROOT, f.ino, caps))[:4] == b"\x01\x00\x00\x02"
    assert reads == ["getxattr"]
