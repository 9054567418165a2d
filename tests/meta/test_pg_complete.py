"""Complete prefixes in the read cache over PostgreSQL (``tierd.meta.pg_cache``): a directory
this node created has no entries but those the cache holds, so the kernel's LOOKUP of a new
name in it -- one before every create -- is answered absent with no round trip; and the
answer gives way as soon as anything under the prefix may have changed unseen."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tierd.acl import Identity
from tierd.errors import FsError
from tierd.meta import MetaStore
from tierd.meta.pg_cache import ReadCache
from tierd.meta.pg_engine import PgStore, PgTxn
from tierd.meta.pg_quiet import quiet_seq
from tierd.namespace import Namespace

from .conftest import wait_until as _wait
from .pg_server import PgServer
from .test_pg_bounded import e2_seq

ROOT = Identity.ROOT
P = b"D" + (7).to_bytes(8, "big")  # the entries of directory 7


def _cache() -> ReadCache:
    cache = ReadCache()
    cache.advance(None, 10, [])
    cache.committed(10, 11, {b"I7": b"dir", P + b"a": b"A"}, [P])
    return cache


def test_a_complete_prefix_answers_absent_and_what_it_holds() -> None:
    cache = _cache()
    assert cache.lookup(11, P + b"a") == (True, b"A")
    assert cache.lookup(11, P + b"zz") == (True, None)  # absent, no round trip
    assert cache.lookup(11, b"D" + (8).to_bytes(8, "big") + b"x") == (False, None)
    assert cache.lookup(10, P + b"zz") == (False, None)  # only at its own seq
    cache.committed(11, 12, {P + b"b": b"B", P + b"a": None})  # this node's own writes
    assert cache.lookup(12, P + b"b") == (True, b"B")
    assert cache.lookup(12, P + b"a") == (True, None)
    assert cache.lookup(12, P + b"zz") == (True, None)


@pytest.mark.parametrize("how", ["another node's commit", "a transaction's log rows",
                                 "eviction", "a value too big", "everything dropped"])
def test_a_prefix_stops_being_complete_when_its_keys_may_have_changed_unseen(
        how: str) -> None:
    cache = _cache()
    if how == "another node's commit":  # a key the cache never held: it may exist now
        cache.apply(12, [P + b"new"])
    elif how == "a transaction's log rows":
        cache.advance(11, 12, [(12, [P + b"new"])])
    elif how == "eviction":  # the present entry "a" leaves: its absence would be a lie
        cache.max_entries = 2
        cache.committed(11, 12, {b"x1": b"1", b"x2": b"2"})
    elif how == "a value too big":
        cache.committed(11, 12, {P + b"big": b"x" * (70 << 10)})
    else:
        cache.drop_all(12)
    seq = cache.seq
    assert cache.lookup(seq, P + b"zz") == (False, None)
    if how != "a value too big":
        assert cache.lookup(seq, P + b"new") == (False, None)
    else:
        assert cache.lookup(seq, P + b"big") == (False, None)


def test_the_feeds_row_of_this_nodes_commit_waits_for_the_writer() -> None:
    """The feed may hear this node's own commit (from its notification) before the
    writer's reply: the row waits, so the cache stays before the commit, and the writer's
    values -- and the prefix's completeness -- stand once it replies."""
    cache = _cache()
    cache.expect(12)
    cache.apply(12, [P + b"b"])
    assert cache.seq == 11 and cache.lookup(12, P + b"zz") == (False, None)
    cache.committed(11, 12, {P + b"b": b"B"})
    assert cache.lookup(12, P + b"b") == (True, b"B")
    assert cache.lookup(12, P + b"zz") == (True, None)
    cache.apply(13, [P + b"c"])  # another node's: gone for good
    cache.committed(12, 13, {P + b"c": b"C"})  # (a late reply changes nothing)
    assert cache.lookup(13, P + b"zz") == (False, None)


def test_a_scan_of_a_complete_prefix_lists_what_it_holds() -> None:
    """``ReadCache.under``: a complete prefix's keys with their values, in order, kept by
    this node's commits (also when the feed heard one first: the keys it held before stay
    listed); None at another seq, under a prefix that is not complete, and once another
    node's commit named a key under it."""
    cache = _cache()
    assert cache.under(11, P) == [(P + b"a", b"A")]
    assert cache.under(10, P) is None and cache.under(11, b"D") is None
    cache.committed(11, 12, {P + b"c": b"C"})
    cache.expect(13)
    cache.apply(13, [P + b"b"])
    assert cache.under(13, P) is None  # meanwhile: the cache stands at 12
    cache.committed(12, 13, {P + b"b": b"B"})
    assert cache.under(13, P) == [(P + b"a", b"A"), (P + b"b", b"B"), (P + b"c", b"C")]
    cache.committed(13, 14, {P + b"a": None})
    assert cache.under(14, P) == [(P + b"b", b"B"), (P + b"c", b"C")]
    cache.advance(14, 15, [(15, [P + b"d"])])  # another node's
    assert cache.under(15, P) is None


def test_a_complete_prefix_alone_is_still_brought_up_to_date() -> None:
    """A cache whose entries all went, with a complete prefix left that holds no key (a new
    file's attributes): a transaction still fetches the log rows after it, and a commit the
    cache did not see takes the prefix's completeness (an empty cache once skipped them)."""
    cache = ReadCache()
    cache.advance(None, 10, [])
    x9 = b"X" + (9).to_bytes(8, "big")
    cache.committed(10, 11, {b"I9": b"file"}, [x9])
    cache.apply(12, [b"I9"])  # another node's commit: the only entry goes
    assert len(cache) == 0 and cache.since() == 12
    assert cache.advance(12, 14, [(13, [b"other"]), (14, [x9 + b"user.a"])])
    assert cache.lookup(14, x9 + b"user.a") == (False, None)
    cache2 = ReadCache()
    cache2.advance(None, 10, [])
    cache2.committed(10, 11, {b"I9": b"file"}, [x9])
    cache2.apply(12, [b"I9"])
    cache2.apply(14, [x9 + b"user.a"])  # the feed, a row further on: not applied
    assert cache2.seq == 12 and cache2.lookup(12, x9 + b"user.a") == (True, None)


def test_a_commit_that_moved_on_marks_nothing() -> None:
    cache = ReadCache()
    cache.advance(None, 10, [])
    cache.apply(11, [b"k"])
    cache.apply(12, [b"k"])
    cache.committed(10, 11, {b"I7": b"dir"}, [P])  # the cache is at 12 already
    assert cache.lookup(12, P + b"zz") == (False, None)


def test_a_lookup_of_a_new_name_in_a_new_directory_costs_no_statement(
        two_nodes: tuple[list[MetaStore], list[Namespace], asyncio.AbstractEventLoop],
) -> None:
    metas, (ns1, ns2), loop = two_nodes
    run = loop.run_until_complete
    e1 = metas[0].engine
    assert isinstance(e1, PgStore)
    bkt = run(ns1.create_bucket(ROOT, "bkt"))
    hits = 0
    for i in range(3):  # (a background begin may take the new prefix's completeness)
        d = run(ns1.mkdir(ROOT, bkt.ino, b"d%d" % i, 0o777))
        _wait(lambda: quiet_seq(e1) is not None, "the feed never caught up")
        fetches = e1.bounded_fetches
        for name in (b"a", b"b", b"c"):
            with pytest.raises(FsError) as e:
                run(ns1.lookup(ROOT, d.ino, name, bounded=True))
            assert e.value.errno == errno.ENOENT
        hits += e1.bounded_fetches == fetches
    assert hits >= 1
    # a new file's attributes: the kernel's security.capability look before its first write
    caps = 0
    for i in range(3):
        f, fh = run(ns1.create(ROOT, d.ino, b"x%d" % i, stat.S_IFREG | 0o644,
                               os.O_WRONLY | os.O_CREAT))
        _wait(lambda: quiet_seq(e1) is not None, "the feed never caught up")
        fetches = e1.bounded_fetches
        with pytest.raises(FsError) as e:
            run(ns1.getxattr(ROOT, f.ino, b"security.capability", bounded=True))
        assert e.value.errno == errno.ENODATA
        caps += e1.bounded_fetches == fetches
        run(ns1.release(fh))
    assert caps >= 1
    # this node's creates keep it complete; another node's entry is found once the feed
    # delivered it, never answered absent
    mine = run(_new_file(ns1, d.ino, b"mine"))
    assert run(ns1.lookup(ROOT, d.ino, b"mine", bounded=True)).ino == mine
    theirs = run(_new_file(ns2, d.ino, b"theirs"))
    _wait(lambda: quiet_seq(e1) is not None and e1.cache.seq >= e2_seq(metas[1]),
          "the feed never caught up")
    assert run(ns1.lookup(ROOT, d.ino, b"theirs", bounded=True)).ino == theirs
    # and an exact read agrees
    assert run(ns1.lookup(ROOT, d.ino, b"theirs")).ino == theirs


def test_a_key_hinted_absent_is_answered_by_the_transaction(pg_server: PgServer,
                                                             tmp_path: Path) -> None:
    """``KVTxn.absent``: a get of the key costs no statement and answers None; a key the
    transaction wrote answers its write, and one it read already keeps the server's
    answer (a hint never hides what the transaction knows)."""
    store = PgStore(pg_server.url(str(tmp_path)))
    try:
        with_ = store.begin(write=True)
        with_.put(b"had", b"1")
        with_.commit()
        txn = store.begin(write=True)
        assert isinstance(txn, PgTxn)
        assert txn.get(b"had") == b"1"
        txn.put(b"mine", b"2")
        for key in (b"new", b"had", b"mine"):
            txn.absent(key)
        sent = _statements(txn)
        assert txn.get(b"new") is None and txn.get(b"had") == b"1"
        assert txn.get(b"mine") == b"2"
        assert sent == []
        txn.abort()
    finally:
        store.close()


@pytest.mark.parametrize("hot", [True, False])
def test_a_writers_begin_fetches_the_hot_keys_another_node_changed(
        pg_server: PgServer, tmp_path: Path, hot: bool) -> None:
    """``PgStore(hot=...)``: the counters every create writes.  Another node changed one
    since this node's cache last saw it: the writer's begin brings its new value in the
    same message as the lock, so the body reads it with no statement under the lock
    (without ``hot`` it costs one, as every create on several nodes did)."""
    url = pg_server.url(str(tmp_path))
    a = PgStore(url, node="a", hot=(b"Chot",) if hot else ())
    b = PgStore(url, node="b", hot=(b"Chot",) if hot else ())
    try:
        for store, value in ((a, b"1"), (b, None), (a, b"2")):
            txn = store.begin(write=True)
            if value is None:  # b reads it: its cache holds the value at its seq
                assert txn.get(b"Chot") == b"1"
                txn.abort()
                continue
            txn.put(b"Chot", value)
            txn.put(b"Cold", value)  # not a hot key: fetched when read, as before
            txn.commit()
        txn = b.begin(write=True)
        assert isinstance(txn, PgTxn)
        sent = _statements(txn)
        assert txn.get(b"Chot") == b"2"
        assert len(sent) == (0 if hot else 1)
        assert txn.get(b"Cold") == b"2"
        txn.abort()
        # unchanged since: nothing is fetched again (and nothing goes stale)
        txn = b.begin(write=True)
        assert isinstance(txn, PgTxn)
        sent = _statements(txn)
        assert txn.get(b"Chot") == b"2"
        assert sent == []
        txn.abort()
    finally:
        a.close()
        b.close()


def _statements(txn: PgTxn) -> list[bytes]:
    """Record every statement ``txn`` sends from now on (it still sends them)."""
    sent: list[bytes] = []
    real = txn._query

    def query(q: bytes, params: tuple[object, ...], doing: str, *,
              send_writes: bool = False) -> list[object]:
        sent.append(q)
        return real(q, params, doing, send_writes=send_writes)

    txn._query = query  # type: ignore[method-assign]
    return sent


def test_a_create_and_a_put_read_nothing_of_the_inode_they_number(
        two_nodes: tuple[list[MetaStore], list[Namespace], asyncio.AbstractEventLoop],
        monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keys of an inode a create or a PUT numbers cannot exist (the number was never
    used): its transaction knows them absent (``MetaTxn.new_inode``) instead of reading
    them, in its prefetch or its body; and the inode counter, which counts a record as new
    only when its key was absent, stays exact."""
    metas, (ns1, _ns2), loop = two_nodes
    run = loop.run_until_complete
    bkt = run(ns1.create_bucket(ROOT, "bkt"))
    asked = _keys_asked(monkeypatch)
    made = []
    for i in range(4):
        made.append(run(_new_file(ns1, bkt.ino, b"c%d" % i)))
        made.append(run(ns1.put_object(ROOT, "bkt", f"p{i}", _body(b"x" * 10))).ino)
    monkeypatch.undo()
    own = {kind + ino.to_bytes(8, "big") for ino in made for kind in (b"I", b"Q")}
    assert not own & set(map(bytes, asked)), "read a key of a new inode"
    with metas[0].snapshot() as tx:
        inodes = sum(1 for _ in tx.iter_inodes())
        assert tx.counter("inodes") == inodes


def test_a_rename_and_an_unlink_of_a_new_file_read_nothing_of_it(
        two_nodes: tuple[list[MetaStore], list[Namespace], asyncio.AbstractEventLoop],
        monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A file this node created has no cold record, intention, open mark or attributes
    but those its node wrote (``MetaTxn.new_inode``): its rename (the cold record) and
    its unlink (all four, the attributes by a scan) read none of them from the server.
    Another node's change under one of those keys ends that: its unlink reads again and
    sees the attribute."""
    metas, (ns1, ns2), loop = two_nodes
    run = loop.run_until_complete
    bkt = run(ns1.create_bucket(ROOT, "bkt"))
    made = [run(_new_file(ns1, bkt.ino, b"f%d" % i)) for i in range(4)]
    e1 = metas[0].engine
    _wait(lambda: quiet_seq(e1) is not None, "the feed never caught up")
    asked = _keys_asked(monkeypatch)
    for i in range(3):
        run(ns1.rename(ROOT, bkt.ino, b"f%d" % i, bkt.ino, b"g%d" % i))
    for i in range(2):
        run(ns1.unlink(ROOT, bkt.ino, b"g%d" % i))
    mine = {bytes([kind]) + ino.to_bytes(8, "big") for ino in made for kind in b"RVOX"}
    assert not mine & {bytes(k)[:1] + bytes(k)[-8:] for k in asked}, "read a key of it"
    # another node sets an attribute of f3: node 1's unlink must see it go
    run(ns2.setxattr(ROOT, made[3], b"user.k", b"v"))
    _wait(lambda: e1.cache.seq >= e2_seq(metas[1]), "the feed never caught up")
    asked.clear()
    run(ns1.unlink(ROOT, bkt.ino, b"f3"))
    assert b"X" + made[3].to_bytes(8, "big") in {bytes(k)[:9] for k in asked}
    monkeypatch.undo()
    with metas[0].snapshot() as tx:
        assert not list(tx.list_xattrs(made[3]))


def _keys_asked(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The keys every transaction's statements name from now on (they are still sent)."""
    asked: list[bytes] = []
    real = PgTxn._query

    def query(self: PgTxn, q: bytes, params: tuple[object, ...], doing: str, *,
              send_writes: bool = False) -> list[object]:
        for p in params:
            asked.extend(p if isinstance(p, list) else [p] if isinstance(p, bytes) else [])
        return real(self, q, params, doing, send_writes=send_writes)

    monkeypatch.setattr(PgTxn, "_query", query)
    return asked


async def _new_file(ns: Namespace, parent: int, name: bytes) -> int:
    """Create ``name`` in ``parent`` and close it; its inode number."""
    f, fh = await ns.create(ROOT, parent, name, stat.S_IFREG | 0o644, os.O_WRONLY | os.O_CREAT)
    await ns.release(fh)
    return f.ino


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _body(data: bytes) -> AsyncIterator[bytes]:
    return _chunks(data)


def test_a_reader_between_a_commit_and_its_reply_leaves_the_writer_its_values() -> None:
    """The writer announces its commit (``expect``) before it sends it.  A transaction
    whose snapshot includes the commit begins before the writer's reply: it reads the
    server instead of moving the cache past the commit, and the change feed's rows wait;
    then the writer's values and the prefix it made complete stand, and the feed's rows
    after the commit are applied.  Without ``expect`` the reader moved the cache on and
    the writer's values were lost, and the prefixes with them (the last lines)."""
    cache = _cache()
    q = b"D" + (9).to_bytes(8, "big")  # a directory the commit makes
    cache.expect(12)
    assert not cache.advance(11, 13, [(12, [P + b"b", b"I9"]), (13, [b"other"])])
    assert cache.seq == 11
    cache.apply(12, [P + b"b", b"I9"])  # the feed: held
    cache.apply(13, [b"other"])
    assert cache.seq == 11
    cache.committed(11, 12, {P + b"b": b"B", b"I9": b"dir"}, [q])
    assert cache.seq == 13  # the held row after it
    assert cache.lookup(13, P + b"b") == (True, b"B")
    assert cache.lookup(13, q + b"new") == (True, None)
    assert cache.lookup(13, P + b"zz") == (True, None)  # (no drop took it: still complete)
    assert cache.advance(13, 14, [(14, [b"more"])])  # and it moves on as before
    old = _cache()  # no expect: the reader moves the cache on, the writer's reply is late
    assert old.advance(11, 13, [(12, [P + b"b", b"I9"]), (13, [b"other"])])
    old.committed(11, 12, {P + b"b": b"B", b"I9": b"dir"}, [q])
    assert old.lookup(13, q + b"new") == (False, None)
    assert old.lookup(13, P + b"zz") == (False, None)


def test_a_failed_commit_lets_the_cache_move_on_without_it() -> None:
    cache = _cache()
    cache.expect(12)
    assert not cache.advance(11, 12, [(12, [P + b"x"])])
    cache.apply(12, [P + b"x"])
    cache.abandon(12)  # (seq 12 is another node's commit after all)
    assert cache.seq == 11
    assert cache.advance(11, 12, [(12, [P + b"x"])])
    assert cache.lookup(12, P + b"zz") == (False, None)
    assert cache.lookup(12, P + b"a") == (True, b"A")


def test_the_feed_rows_held_back_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the bound the feed's rows are left to the next transaction's log rows: the
    cache stays behind meanwhile, and then catches up exactly."""
    from tierd.meta import pg_cache
    monkeypatch.setattr(pg_cache, "_HELD_MAX", 3)
    cache = _cache()
    cache.expect(12)
    for seq in range(12, 18):
        cache.apply(seq, [P + b"own"] if seq == 12 else [b"k%d" % seq])
    cache.committed(11, 12, {P + b"own": b"O"})
    assert cache.seq == 14  # 12 (its own), 13 and 14 held; 15-17 not
    assert cache.lookup(14, P + b"own") == (True, b"O")
    assert cache.advance(14, 17, [(15, [P + b"x"]), (16, [b"k16"]), (17, [b"k17"])])
    assert cache.lookup(17, P + b"own") == (True, b"O")
    assert cache.lookup(17, P + b"zz") == (False, None)  # 15 named a key under P
