"""Prefetch over PostgreSQL (tierd/meta/pg_warm.py): the reads a body names at its begin
(``keys``, ``warm``) are made in the begin's thread, so the body on the event loop makes no
query, and what it reads is exactly what it would have read without them -- its snapshot,
its own writes, a joined group's writes -- even when another node commits meanwhile.

Queries made on the loop's thread are counted by wrapping ``PgTxn._query`` (the engine's one
way to the server inside a transaction); the bodies without prefetch show the count is not
zero by construction."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tierd.meta import MetaStore, MetaTxn, pg_group
from tierd.meta.pg_engine import PgTxn

from .pg_server import PgServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def url(pg_server: PgServer, tmp_path: Path) -> str:
    return pg_server.url(str(tmp_path))


@pytest.fixture
def metas(pg_nodes: Callable[[str], MetaStore]) -> Callable[[str], MetaStore]:
    return pg_nodes


@pytest.fixture
def on_loop(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queries made on this (the loop's) thread, by what they did."""
    seen: list[str] = []
    query = PgTxn._query
    me = threading.get_ident()

    def counted(txn: PgTxn, q: bytes, params: tuple[Any, ...], doing: str,
                **kw: Any) -> list[Any]:
        if threading.get_ident() == me:
            seen.append(doing)
        return query(txn, q, params, doing, **kw)
    monkeypatch.setattr(PgTxn, "_query", counted)
    return seen


def _put(meta: MetaStore, items: dict[bytes, bytes]) -> None:
    with meta.write() as tx:
        for k, v in items.items():
            tx.kv.put(k, v)


def _group(meta: MetaStore, second: Callable[[], Any], seen: dict[str, Any]) -> None:
    """A writer that puts ``a`` and, while it holds the writers' turn, ``second``: a
    coroutine that joins its group (``seen["first_seq"]`` for the caller to check)."""
    async def first() -> None:
        async with meta.awrite() as tx:
            seen["first_seq"] = getattr(tx.kv, "seq")  # noqa: B009
            tx.kv.put(b"a", b"first")

    async def run() -> None:
        t1 = asyncio.create_task(first())
        await asyncio.sleep(0)  # the first takes the turn; the second waits to join
        t2 = asyncio.create_task(second())
        await asyncio.gather(t1, t2)
    asyncio.run(run())


def test_named_keys_are_read_in_the_begin_thread(
        metas: Callable[[str], MetaStore], on_loop: list[str]) -> None:
    meta = metas("n1")
    other = metas("n2")
    _put(meta, {b"ka": b"1", b"kb": b"2"})
    _put(other, {b"ka": b"3"})  # another node's commit: this node's cache drops "ka"
    keys = [b"ka", b"kb", b"absent"]

    async def run() -> None:
        on_loop.clear()
        async with meta.asnapshot() as tx:  # without: the misses go to the server here
            assert [tx.kv.get(k) for k in keys] == [b"3", b"2", None]
        assert on_loop, "the body without prefetch made no query: the test proves nothing"
        _put(other, {b"kb": b"4"})
        on_loop.clear()
        async with meta.asnapshot(keys=keys) as tx:
            assert [tx.kv.get(k) for k in keys] == [b"3", b"4", None]
        assert on_loop == []
        _put(other, {b"ka": b"5"})
        async with meta.awrite(keys=[*keys, b"new"]) as tx:
            assert [tx.kv.get(k) for k in keys] == [b"5", b"4", None]
            tx.kv.put(b"new", b"6")
            assert tx.kv.get(b"new") == b"6"
            assert tx.kv.delete(b"kb")
        assert on_loop == []
    asyncio.run(run())
    with other.snapshot() as tx:
        assert (tx.kv.get(b"new"), tx.kv.get(b"kb")) == (b"6", None)


def test_a_warm_pass_follows_chains_and_a_write_ends_it(
        metas: Callable[[str], MetaStore], on_loop: list[str]) -> None:
    meta = metas("n1")
    _put(meta, {b"p": b"q", b"q": b"r"})
    metas("n2")  # (the same database: a second node)
    _put(metas("n3"), {b"p": b"q2", b"q2": b"s"})  # drops this node's "p"

    def chain(tx: MetaTxn) -> None:  # the body's own reads; a write ends the pass
        nxt = tx.kv.get(b"p")
        assert nxt is not None
        tx.kv.get(nxt)
        tx.kv.put(b"w", b"")
        tx.kv.get(b"never-read")

    async def run() -> None:
        on_loop.clear()
        async with meta.awrite(warm=chain) as tx:
            nxt = tx.kv.get(b"p")
            assert nxt == b"q2" and tx.kv.get(nxt) == b"s"
            assert on_loop == []
            assert tx.kv.get(b"never-read") is None
        assert on_loop == ["reading a key"]  # the pass stopped at the write

        def broken(tx: MetaTxn) -> None:
            raise RuntimeError("a pass that fails only loses its prefetch")
        async with meta.asnapshot(warm=broken) as tx:
            assert tx.kv.get(b"q2") == b"s"
    asyncio.run(run())


def test_prefetched_answers_keep_the_snapshot_after_the_cache_moves_on(
        metas: Callable[[str], MetaStore], on_loop: list[str]) -> None:
    """A reader's prefetched value stays its snapshot's even when another node commits
    and a later transaction of this node brings the shared cache past it."""
    meta = metas("n1")
    other = metas("n2")
    _put(meta, {b"k": b"old"})
    _put(other, {b"k": b"older-than-nothing"})
    _put(other, {b"k": b"v1"})

    async def run() -> None:
        async with meta.asnapshot(keys=[b"k"]) as tx:
            _put(other, {b"k": b"v2"})
            with meta.snapshot() as now:  # moves this node's cache past tx's snapshot
                assert now.kv.get(b"k") == b"v2"
            on_loop.clear()
            assert tx.kv.get(b"k") == b"v1"
            assert on_loop == []
    asyncio.run(run())


def test_a_member_joining_a_group_prefetches_and_sees_the_group(
        metas: Callable[[str], MetaStore], on_loop: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_group, "GROUP_S", 60.0)
    meta = metas("n1")
    other = metas("n2")
    _put(meta, {b"a": b"0", b"b": b"0"})
    _put(other, {b"b": b"1"})  # this node's cached "b" is dropped
    seen: dict[str, Any] = {}

    async def second() -> None:
        def warm(tx: MetaTxn) -> None:
            tx.kv.get(b"a")
            tx.kv.get(b"b")
            tx.kv.get(b"gone")
        async with meta.awrite(keys=[b"c"], warm=warm) as tx:
            seen["second_seq"] = getattr(tx.kv, "seq")  # noqa: B009
            before = len(on_loop)
            seen["values"] = [tx.kv.get(k) for k in (b"a", b"b", b"gone", b"c")]
            seen["queries"] = on_loop[before:]
            tx.kv.put(b"c", b"second")
    _group(meta, second, seen)
    assert seen["first_seq"] == seen["second_seq"], "not one group: the test proves nothing"
    assert seen["values"] == [b"first", b"1", None, None]
    assert seen["queries"] == []
    with other.snapshot() as tx:
        assert (tx.kv.get(b"a"), tx.kv.get(b"c")) == (b"first", b"second")


def test_scan_pages_of_the_warm_pass_serve_the_body_until_it_writes_in_their_range(
        metas: Callable[[str], MetaStore], on_loop: list[str]) -> None:
    meta = metas("n1")
    _put(meta, {b"r1": b"a", b"r2": b"b", b"s": b"c"})

    def listing(tx: MetaTxn) -> list[bytes]:
        return [k for k, _ in tx.kv.scan(b"r", b"s")]

    async def run() -> None:
        on_loop.clear()
        async with meta.asnapshot() as tx:  # without: the scan is a query on the loop
            assert listing(tx) == [b"r1", b"r2"]
        assert on_loop == ["scanning keys"]
        on_loop.clear()
        async with meta.asnapshot(warm=listing) as tx:
            assert listing(tx) == [b"r1", b"r2"]
        assert on_loop == []
        async with meta.awrite(warm=listing) as tx:
            assert listing(tx) == [b"r1", b"r2"]
            tx.kv.put(b"s", b"e")  # a write outside the range: the page still holds
            assert listing(tx) == [b"r1", b"r2"]
            assert on_loop == []
            tx.kv.put(b"r3", b"d")  # a write inside it: the page is read anew
            assert listing(tx) == [b"r1", b"r2", b"r3"]
        assert on_loop == ["scanning keys"]
    asyncio.run(run())


def test_an_answer_the_cache_gave_the_warm_pass_outlives_the_cache(
        metas: Callable[[str], MetaStore], on_loop: list[str]) -> None:
    """The warm pass found the key in the node's cache; another node's commit then moves the
    cache past the body's snapshot: the body still answers without a query."""
    meta = metas("n1")
    other = metas("n2")
    _put(meta, {b"k": b"v1", b"j": b"w"})
    with meta.snapshot() as tx:
        assert tx.kv.get(b"k") == b"v1"  # cached now

    async def run() -> None:
        async with meta.asnapshot(warm=lambda tx: tx.kv.get(b"k")) as tx:
            _put(other, {b"j": b"w2"})
            with meta.snapshot() as now:  # moves this node's cache on
                assert now.kv.get(b"j") == b"w2"
            on_loop.clear()
            assert tx.kv.get(b"k") == b"v1"
            assert on_loop == []
    asyncio.run(run())


def test_a_member_the_group_and_the_cache_answer_joins_without_a_hop(
        metas: Callable[[str], MetaStore], on_loop: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key of a joining member's pass is the group's write or in the node's cache at
    the group's seq: the member reads them on the loop, with no thread and no statement
    while the group holds the writer lock, and sees exactly what a fetch would have."""
    monkeypatch.setattr(pg_group, "GROUP_S", 60.0)
    meta = metas("n1")
    _put(meta, {b"a": b"0", b"b": b"0"})
    with meta.snapshot() as tx:
        assert (tx.kv.get(b"a"), tx.kv.get(b"b"), tx.kv.get(b"gone")) == (b"0", b"0", None)
    gate = getattr(meta.engine, "_async")  # noqa: B009
    before = gate.stat()["write_members_cached"]
    seen: dict[str, Any] = {}

    async def second() -> None:
        def warm(tx: MetaTxn) -> None:
            for k in (b"a", b"b", b"gone"):
                tx.kv.get(k)
        async with meta.awrite(warm=warm) as tx:
            seen["second_seq"] = getattr(tx.kv, "seq")  # noqa: B009
            on_loop.clear()
            seen["values"] = [tx.kv.get(k) for k in (b"a", b"b", b"gone")]
            seen["queries"] = list(on_loop)
            tx.kv.put(b"b", b"second")
    _group(meta, second, seen)
    assert seen["first_seq"] == seen["second_seq"], "not one group: the test proves nothing"
    assert seen["values"] == [b"first", b"0", None]
    assert seen["queries"] == []
    assert gate.stat()["write_members_cached"] == before + 1
    with metas("n2").snapshot() as tx:
        assert (tx.kv.get(b"a"), tx.kv.get(b"b")) == (b"first", b"second")


def test_a_member_whose_pass_the_cache_lacks_still_fetches_it(
        metas: Callable[[str], MetaStore], on_loop: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side: a key another node changed is not in this node's cache, so the
    joining member's pass is read in a thread, not answered on the loop."""
    monkeypatch.setattr(pg_group, "GROUP_S", 60.0)
    meta = metas("n1")
    other = metas("n2")
    _put(meta, {b"a": b"0", b"b": b"0"})
    with meta.snapshot() as tx:
        assert tx.kv.get(b"b") == b"0"
    _put(other, {b"b": b"1"})  # this node's cached "b" is dropped at its next begin
    gate = getattr(meta.engine, "_async")  # noqa: B009
    before = gate.stat()["write_members_cached"]
    seen: dict[str, Any] = {}

    async def second() -> None:
        async with meta.awrite(warm=lambda tx: tx.kv.get(b"b")) as tx:
            seen["second_seq"] = getattr(tx.kv, "seq")  # noqa: B009
            on_loop.clear()
            seen["b"] = tx.kv.get(b"b")
            seen["queries"] = list(on_loop)
    _group(meta, second, seen)
    assert seen["first_seq"] == seen["second_seq"], "not one group: the test proves nothing"
    assert (seen["b"], seen["queries"]) == (b"1", [])
    assert gate.stat()["write_members_cached"] == before
