"""Group commit of a node's async writers over PostgreSQL (tierd/meta/pg_group.py): writers
that wait for their turn while another's body runs share its transaction and its commit.
Each member sees the writes before it, a member that raises loses only its own writes, a
failed commit fails every member, a synchronous begin on the loop between two members
commits the group instead of waiting for it, and a cancelled member still gets its outcome.

The writers are tasks started together: the first takes the turn and begins (a round trip in
a thread) while the others queue behind it, so they form one group."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tierd.errors import FsError
from tierd.meta import MetaStore, MetaTxn, pg_group
from tierd.meta.pg_engine import PgStore

from .pg_server import PgServer

pytestmark = pytest.mark.timeout(120)

Body = Callable[[MetaTxn], None]


@pytest.fixture(autouse=True)
def _no_time_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups here end by their writers, not by the clock: on a loaded machine two bodies
    with round trips can outlast the default cap."""
    monkeypatch.setattr(pg_group, "GROUP_S", 60.0)


@pytest.fixture
def meta(pg_server: PgServer, tmp_path: Path) -> Iterator[MetaStore]:
    store = MetaStore(PgStore(pg_server.url(str(tmp_path))))
    yield store
    store.close()


def _seq(meta: MetaStore) -> int:
    with meta.snapshot() as tx:
        return int(getattr(tx.kv, "seq"))  # noqa: B009 (PgTxn's)


async def _writers(meta: MetaStore, bodies: list[Body]) -> list[BaseException | int]:
    """Run each body as an awrite of its own task, started together; per member the seq its
    transaction began at, or its error."""
    async def one(body: Body) -> int:
        async with meta.awrite() as tx:
            body(tx)
            return int(getattr(tx.kv, "seq"))  # noqa: B009

    tasks = [asyncio.create_task(one(b)) for b in bodies]
    return list(await asyncio.gather(*tasks, return_exceptions=True))


def _get(meta: MetaStore, *keys: bytes) -> list[bytes | None]:
    with meta.snapshot() as tx:
        return [tx.kv.get(k) for k in keys]


def test_members_share_one_commit_and_see_each_others_writes(meta: MetaStore) -> None:
    seen: list[bytes | None] = []

    def member(value: bytes) -> Body:
        def body(tx: MetaTxn) -> None:
            seen.append(tx.kv.get(b"k"))
            tx.kv.put(b"k", value)
            tx.kv.put(b"k" + value, value)
        return body

    before = _seq(meta)
    out = asyncio.run(_writers(meta, [member(b"a"), member(b"b"), member(b"c")]))
    assert seen == [None, b"a", b"b"]
    assert out == [before] * 3, "one transaction for the three bodies"
    assert _seq(meta) == before + 1, "one commit"
    assert _get(meta, b"k", b"ka", b"kb", b"kc") == [b"c", b"a", b"b", b"c"]


def _raises(tx: MetaTxn) -> None:
    raise ValueError("member fails")


@pytest.mark.parametrize("sent", [False, True], ids=["buffered", "sent-by-a-scan"])
def test_a_raising_member_loses_its_own_writes_only(meta: MetaStore, sent: bool) -> None:
    """``sent``: its writes reached the server before it raised (a scan sends them), so a
    savepoint, not the client's buffer, must undo them."""
    with meta.write() as tx:
        tx.kv.put(b"x", b"0")
        tx.kv.put(b"gone", b"0")
    seen: list[list[bytes | None]] = []

    def first(tx: MetaTxn) -> None:
        tx.kv.put(b"x", b"1")
        tx.kv.put(b"a", b"1")

    def failing(tx: MetaTxn) -> None:
        tx.kv.put(b"x", b"2")
        tx.kv.put(b"y", b"2")
        tx.kv.delete(b"gone")
        if sent:
            assert [k for k, _ in tx.kv.scan(b"y", b"z")] == [b"y"]
        raise ValueError("member fails")

    def third(tx: MetaTxn) -> None:
        seen.append([tx.kv.get(k) for k in (b"x", b"y", b"gone", b"a")])
        if sent:
            seen.append([k for k, _ in tx.kv.scan(b"a", b"z")])
        tx.kv.put(b"z", b"3")

    before = _seq(meta)
    out = asyncio.run(_writers(meta, [first, failing, third]))
    assert out[0] == out[2] == before and isinstance(out[1], ValueError), out
    assert seen[0] == [b"1", None, b"0", b"1"]
    if sent:
        assert seen[1] == [b"a", b"gone", b"x"]
    assert _seq(meta) == before + 1
    assert _get(meta, b"x", b"y", b"gone", b"a", b"z") == [b"1", None, b"0", b"1", b"3"]


def test_a_raising_leader_leaves_the_next_writers_theirs(meta: MetaStore) -> None:
    def leader(tx: MetaTxn) -> None:
        tx.kv.put(b"l", b"1")
        raise ValueError("leader fails")

    def other(tx: MetaTxn) -> None:
        tx.kv.put(b"o", b"1")

    out = asyncio.run(_writers(meta, [leader, other]))
    assert isinstance(out[0], ValueError) and isinstance(out[1], int)
    assert _get(meta, b"l", b"o") == [None, b"1"]


def test_a_failed_group_commit_fails_every_member(meta: MetaStore) -> None:
    """The third member's key is too long for the primary key's index: the server refuses
    the commit, and the members before it (whose bodies were fine) must hear so."""
    def put(key: bytes) -> Body:
        return lambda tx: tx.kv.put(key, b"v")

    out = asyncio.run(_writers(meta, [put(b"p"), put(b"q"), put(os.urandom(20_000))]))
    assert all(isinstance(e, FsError) for e in out), out
    assert _get(meta, b"p", b"q") == [None, None]
    asyncio.run(_writers(meta, [put(b"after")]))  # no lock left behind
    assert _get(meta, b"after") == [b"v"]


@pytest.mark.parametrize("sync_write", [True, False], ids=["writer", "reader"])
def test_a_synchronous_begin_on_the_loop_between_members_commits_the_group(
        meta: MetaStore, sync_write: bool) -> None:
    """The first member's body schedules synchronous code that runs after its end handed
    the group on, before the next member resumes: it must not wait for the group (only the
    loop could finish it), it sees the first member's write, and the next member begins
    anew."""
    engine = meta.engine
    assert isinstance(engine, PgStore)
    seen: list[object] = []

    def sync() -> None:
        ready = engine._writers.ready
        seen.append(ready is not None and ready.finish is not None)  # a group is offered
        if sync_write:
            with meta.write() as tx:
                seen.append(tx.kv.get(b"a"))
                tx.kv.put(b"s", b"sync")
        else:
            with meta.snapshot() as tx:
                seen.append(tx.kv.get(b"a"))

    def first(tx: MetaTxn) -> None:
        tx.kv.put(b"a", b"1")
        asyncio.get_running_loop().call_soon(sync)

    def second(tx: MetaTxn) -> None:
        seen.append(tx.kv.get(b"s"))
        tx.kv.put(b"b", b"2")

    async def main() -> list[BaseException | int]:
        return await asyncio.wait_for(_writers(meta, [first, second]), 30)

    out = asyncio.run(main())
    assert all(isinstance(s, int) for s in out), out
    assert seen == [True, b"1", b"sync" if sync_write else None]
    assert out[1] > out[0], "the second member began a transaction of its own"
    assert _get(meta, b"a", b"b", b"s") == [b"1", b"2", b"sync" if sync_write else None]


def test_a_member_cancelled_while_handed_the_group_passes_it_on(meta: MetaStore) -> None:
    """The second writer is cancelled after the first handed it the group but before it
    resumed: the turn and the group go to the third, and the first gets its commit."""
    tasks: list[asyncio.Task[None]] = []

    async def write(key: bytes, cancel: int | None = None) -> None:
        async with meta.awrite() as tx:
            tx.kv.put(key, b"v")
            if cancel is not None:
                asyncio.get_running_loop().call_soon(tasks[cancel].cancel)

    async def main() -> list[BaseException | None]:
        tasks.extend([asyncio.create_task(write(b"a", cancel=1)),
                      asyncio.create_task(write(b"b")),
                      asyncio.create_task(write(b"c"))])
        return list(await asyncio.wait_for(
            asyncio.gather(*tasks, return_exceptions=True), 30))

    before = _seq(meta)
    out = asyncio.run(main())
    assert out[0] is None and isinstance(out[1], asyncio.CancelledError) and out[2] is None
    assert _get(meta, b"a", b"b", b"c") == [b"v", None, b"v"]
    assert _seq(meta) == before + 1


def test_a_member_cancelled_while_it_waits_for_the_commit_gets_the_outcome(
        meta: MetaStore) -> None:
    seen: list[str] = []
    tasks: list[asyncio.Task[None]] = []

    async def write(key: bytes, cancel: bool) -> None:
        async with meta.awrite() as tx:
            tx.kv.put(key, b"v")
            if cancel:  # runs once the task waits for the group's commit
                asyncio.get_running_loop().call_soon(tasks[1].cancel)
        seen.append(f"after {key.decode()}")
        await asyncio.sleep(0.5)
        seen.append(f"slept {key.decode()}")

    async def main() -> list[BaseException | None]:
        tasks.extend([asyncio.create_task(write(b"a", False)),
                      asyncio.create_task(write(b"b", True))])
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    before = _seq(meta)
    out = asyncio.run(main())
    assert out[0] is None and isinstance(out[1], asyncio.CancelledError)
    assert sorted(seen) == ["after a", "after b", "slept a"]
    assert _get(meta, b"a", b"b") == [b"v", b"v"]
    assert _seq(meta) == before + 1


def test_a_group_a_fresh_read_waits_for_takes_no_further_member(meta: MetaStore) -> None:
    """A fresh read (an open after a writer's body) waits for the group's commit: the group
    then ends at the next member instead of growing to its caps while the read waits."""
    seen: list[bytes | None] = []

    async def fresh_read() -> None:
        async with meta.asnapshot(fresh=True) as tx:
            seen.append(tx.kv.get(b"a"))

    reads: list[asyncio.Task[None]] = []

    def first(tx: MetaTxn) -> None:
        tx.kv.put(b"a", b"1")
        reads.append(asyncio.create_task(fresh_read()))  # runs before the next member

    def put(key: bytes) -> Body:
        return lambda tx: tx.kv.put(key, b"v")

    async def main() -> list[BaseException | int]:
        out = await _writers(meta, [first, put(b"b"), put(b"c"), put(b"d")])
        await asyncio.gather(*reads)
        return out

    out = asyncio.run(main())
    assert seen == [b"1"]
    assert out[0] == out[1] and out[2] > out[1], out


@pytest.mark.parametrize("cap", ["members", "time"])
def test_a_group_ends_at_its_caps(meta: MetaStore, monkeypatch: pytest.MonkeyPatch,
                                  cap: str) -> None:
    """Latency stays bounded: at most GROUP_MAX members, and none joins after GROUP_S."""
    if cap == "members":
        monkeypatch.setattr(pg_group, "GROUP_MAX", 2)
    else:
        monkeypatch.setattr(pg_group, "GROUP_S", 0.0)

    def put(key: bytes) -> Body:
        return lambda tx: tx.kv.put(key, b"v")

    before = _seq(meta)
    out = asyncio.run(_writers(meta, [put(b"a"), put(b"b"), put(b"c"), put(b"d")]))
    if cap == "members":
        assert out[0] == out[1] and out[2] == out[3] and out[2] > out[1], out
        assert _seq(meta) == before + 2
    else:
        assert len(set(out)) == 4, out
        assert _seq(meta) == before + 4


def test_a_group_commit_reaches_the_server_before_the_commit_thread_runs(
        pg_server: PgServer, meta: MetaStore) -> None:
    """The loop sends a group's commit as the group closes; the commit thread only waits
    for its outcome. With that thread held busy, the write is already committed on the
    server (another connection reads it), and the members get the outcome once it runs."""
    import threading

    import psycopg

    engine = meta.engine
    assert isinstance(engine, PgStore)
    busy, seen = threading.Event(), threading.Event()
    engine._async._commits.submit(busy.wait, 30)  # the commit thread: held

    def look() -> None:  # the server's view, from a connection of its own, for 10 s
        with psycopg.connect(engine.url, autocommit=True) as conn:
            for _ in range(1000):
                if conn.execute("SELECT 1 FROM kv WHERE k = %s", (b"sent",)).fetchone():
                    seen.set()
                    break
                busy.wait(0.01)
        busy.set()  # (the commit thread goes on either way)

    async def run() -> list[BaseException | int]:
        threading.Thread(target=look, daemon=True).start()
        return await _writers(meta, [lambda tx: tx.kv.put(b"sent", b"v")])

    out = asyncio.run(run())
    assert seen.is_set(), "the commit waited for the commit thread"
    assert isinstance(out[0], int) and _get(meta, b"sent") == [b"v"]


def test_a_read_begun_before_the_commits_reply_leaves_the_cache_to_the_writer(
        meta: MetaStore) -> None:
    """A read transaction of the same node begins after the server committed a group but
    before the commit thread took the reply: its snapshot includes the commit, so it reads
    the written key from the server, and the node's cache then holds the writer's value
    at the commit's seq (the reader did not move the cache past it)."""
    import threading

    import psycopg

    engine = meta.engine
    assert isinstance(engine, PgStore)
    _get(meta, b"warm")  # (the cache knows something: a reader would advance it)
    busy = threading.Event()
    engine._async._commits.submit(busy.wait, 30)  # the commit thread: held
    seen: dict[str, object] = {}

    async def run() -> None:
        writer = asyncio.create_task(_writers(meta, [lambda tx: tx.kv.put(b"w", b"v")]))
        with psycopg.connect(engine.url, autocommit=True) as conn:  # the server's view
            for _ in range(1000):
                if conn.execute("SELECT 1 FROM kv WHERE k = %s", (b"w",)).fetchone():
                    break
                await asyncio.sleep(0.01)
        async with meta.asnapshot() as tx:  # (not fresh: it does not wait for the commit)
            seen["read"] = tx.kv.get(b"w")
            seen["cached"] = getattr(tx.kv, "_cached")  # noqa: B009
        busy.set()
        seen["out"] = await writer

    asyncio.run(run())
    assert seen["read"] == b"v" and seen["cached"] is False
    out = seen["out"]
    assert isinstance(out, list) and isinstance(out[0], int)
    cache = engine.cache
    assert cache.lookup(cache.seq, b"w") == (True, b"v")
