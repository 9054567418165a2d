"""Two nodes of a cluster over one metadata store: per-node records and reads of versions
another node holds (tierd.meta.nodes, tierd.placement.peerreads).

Two real namespaces and placements, each with its own hot directory, share one metadata
engine and one ``file://`` cold store, as two daemons share a PostgreSQL database and an
object store.  The peer door between them is a direct call of the other node's
``read_held`` here (the HTTP door is tests/peer's and the full cluster tests/cluster's), so
these tests pin the placement rules alone: which node holds which bytes, which node persists,
and that a reader never gets bytes of another version.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from nsplacement import close_namespace, open_namespace

from tierd.acl import Identity
from tierd.errors import FsError
from tierd.meta import Inode, MetaStore
from tierd.meta.memory_engine import MemoryStore
from tierd.namespace import Namespace
from tierd.placement.peerreads import VersionMoved

T = TypeVar("T")
ROOT = Identity.ROOT


async def body(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 1 << 20):
        yield data[i:i + (1 << 20)]


class Direct:
    """The peer door as a call: node name -> that node's placement."""

    def __init__(self) -> None:
        self.nodes: dict[str, Namespace] = {}
        self.calls = 0

    async def read(self, home: str, ino: int, version: int, offset: int,
                   length: int) -> bytes:
        self.calls += 1
        ns = self.nodes.get(home)
        if ns is None:
            raise FsError(errno.EIO, f"node {home!r} does not answer")
        data = await ns.placement.read_held(ino, version, offset, length)
        if data is None:
            raise FsError(errno.EIO, f"node {home!r} does not hold inode {ino}")
        return data


class Cluster:
    def __init__(self, base: Path, persist_delay: float) -> None:
        self.base = base
        self.engine = MemoryStore()
        self.peer = Direct()
        self.delay = persist_delay
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def start(self, name: str) -> Namespace:
        meta = MetaStore(self.engine, node=name)
        ns = await open_namespace(meta, self.base / name, "hot-only",
                                  persist_delay=self.delay,
                                  cold_url="file://" + str(self.base / "cold"))
        ns.placement.peer = self.peer
        self.peer.nodes[name] = ns
        return ns

    async def stop(self, name: str) -> None:
        ns = self.peer.nodes.pop(name)
        await close_namespace(ns)


def _running(base: Path, persist_delay: float) -> Iterator[Cluster]:
    (base / "cold").mkdir()
    c = Cluster(base, persist_delay)
    yield c
    for name in list(c.peer.nodes):
        c.run(c.stop(name))
    c.loop.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Nothing reaches cold unless drained (persist delay one hour)."""
    yield from _running(tmp_path, 3600.0)


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Cluster]:
    """Write-back at once: every home persists what it holds as soon as it can."""
    yield from _running(tmp_path, 0.0)


async def kick(ns: Namespace) -> None:
    """A pass of the node's cold-delete worker, and a moment for it to run."""
    ns.placement.kick_deletes()
    await asyncio.sleep(0.05)


def stored(ns: Namespace, ino: int) -> Inode:
    with ns.meta.snapshot() as tx:
        got = tx.get_stored_inode(ino)
    assert got is not None
    return got


async def get(ns: Namespace, key: str) -> bytes:
    r = await ns.get_object(ROOT, "bkt", key)
    try:
        return await r.read_all()
    finally:
        await r.close()


def test_a_version_written_on_one_node_is_read_on_another_from_its_hot_tier(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    a = cluster.run(cluster.start("a"))
    b = cluster.run(cluster.start("b"))
    # b starting while a runs is not a restart after a crash (each node has its own mark)
    assert "not closed cleanly" not in caplog.text
    cluster.run(a.create_bucket(ROOT, "bkt"))
    data = os.urandom(5 << 20)
    ino = cluster.run(a.put_object(ROOT, "bkt", "ckpt.bin", body(data))).ino
    rec = stored(a, ino)
    assert rec.home == "a" and rec.blocks == {}  # whole on a's hot, nothing elsewhere
    with b.meta.snapshot() as tx:
        seen = tx.get_inode(ino)
    assert seen is not None and seen.blocks == {"hot": b""}  # b holds none of it
    assert cluster.run(get(b, "ckpt.bin")) == data
    assert cluster.peer.calls >= 1
    assert b.placement.stats.peer_read_bytes == len(data)
    assert b.placement.stats.fetched_bytes == 0  # none of it came from cold
    assert b.placement.stats.filled[("hot", "peer")] == len(data)
    assert a.placement.stats.peer_served_bytes == len(data)
    # b now holds the blocks in its own hot file, recorded under its own name
    rec = stored(a, ino)
    assert rec.home == "a" and set(rec.blocks) == {"hot@b"}
    calls = cluster.peer.calls
    assert cluster.run(get(b, "ckpt.bin")) == data
    assert cluster.peer.calls == calls  # served from b's own copy now


def test_a_new_version_drops_the_other_nodes_copies(cluster: Cluster) -> None:
    a = cluster.run(cluster.start("a"))
    b = cluster.run(cluster.start("b"))
    cluster.run(a.create_bucket(ROOT, "bkt"))
    old, new = os.urandom(3 << 20), os.urandom(3 << 20)
    ino = cluster.run(a.put_object(ROOT, "bkt", "k", body(old))).ino
    assert cluster.run(get(b, "k")) == old
    # a PUT on b over the same key: a new inode, now homed on b; a reads it through b
    ino2 = cluster.run(b.put_object(ROOT, "bkt", "k", body(new))).ino
    assert ino2 != ino and stored(b, ino2).home == "b"
    assert cluster.run(get(a, "k")) == new
    # and a write in place through a handle on a gives the same inode a new version, homed
    # on a, with b's copy of the old bytes forgotten
    fh, _ = cluster.run(a.open_file(ROOT, ino2, os.O_RDWR))
    cluster.run(a.write(fh, 0, b"X" * 4096))
    cluster.run(a.release(fh))
    rec = stored(a, ino2)
    assert rec.home == "a" and "hot@b" not in rec.blocks
    assert cluster.run(get(b, "k")) == b"X" * 4096 + new[4096:]


def test_a_reader_never_gets_bytes_of_another_version(cluster: Cluster) -> None:
    a = cluster.run(cluster.start("a"))
    cluster.run(cluster.start("b"))
    cluster.run(a.create_bucket(ROOT, "bkt"))
    inode = cluster.run(a.put_object(ROOT, "bkt", "k", body(b"v1" * 1000)))
    with pytest.raises(VersionMoved):
        cluster.run(a.placement.read_held(inode.ino, inode.version - 1, 0, 10))
    assert cluster.run(a.placement.read_held(inode.ino, inode.version, 0, 4)) == b"v1v1"
    assert cluster.run(a.placement.read_held(inode.ino + 1000, 1, 0, 4)) is None


def test_only_the_home_persists_and_a_dead_home_is_an_error_not_stale_bytes(
        c: Cluster, tmp_path: Path) -> None:
    a = c.run(c.start("a"))
    b = c.run(c.start("b"))
    c.run(a.create_bucket(ROOT, "bkt"))
    data = os.urandom(1 << 20)
    ino = c.run(a.put_object(ROOT, "bkt", "k", body(data))).ino
    assert c.run(a.placement.drain(timeout=30))
    assert b.placement.stats.uploaded_bytes == 0  # b never touched a's file
    assert a.placement.stats.uploaded_bytes == len(data)
    assert c.run(get(b, "k")) == data  # clean now: from cold, no peer call
    assert c.peer.calls == 0
    # a new version on a, and a gone before it persisted it: b reports the error
    c.run(a.placement.shutdown())  # a's persister stops (a dies)
    fh, _ = c.run(a.open_file(ROOT, ino, os.O_RDWR))
    c.run(a.write(fh, 0, b"new"))
    c.run(a.release(fh))
    c.peer.nodes.pop("a")
    with pytest.raises(FsError) as e:
        c.run(get(b, "k"))
    assert e.value.errno == errno.EIO and "'a'" in str(e.value)


def test_node_records_are_the_nodes_own(tmp_path: Path) -> None:
    engine = MemoryStore()
    a, b = MetaStore(engine, node="a"), MetaStore(engine, node="b")
    with a.write() as tx:
        tx.add_orphan(7)
        tx.add_intent(8)
        tx.add_garbage(9)
        tx.put_logged(10, 3, b"xy")
    with b.snapshot() as tx:
        assert (tx.list_orphans(), tx.list_intents(), tx.list_garbage()) == ([], [], [])
        assert list(tx.list_logged()) == [] and not tx.has_intent(8)
    with a.snapshot() as tx:
        assert (tx.list_orphans(), tx.list_intents(), tx.list_garbage()) == ([7], [8], [9])
        assert list(tx.list_logged()) == [(10, 3, b"xy")] and tx.has_intent(8)
    # an inode b cached and a deletes: b gets a garbage key for its copy
    with a.write() as tx:
        tx.put_inode(Inode(ino=20, mode=0o100644, uid=0, gid=0, size=10, version=1))
    with b.write() as tx:
        got = tx.get_inode(20)
        assert got is not None and got.blocks == {"hot": b""}
        got.blocks["hot"] = b"\x01"
        tx.put_inode(got)
    with a.write() as tx:
        tx.delete_inode(20)
    with b.snapshot() as tx:
        assert tx.list_garbage() == [20]
    # a single node (the name "") keeps the old keys, so existing stores need nothing
    one = MetaStore(MemoryStore())
    with one.write() as tx:
        tx.add_orphan(5)
        assert tx.kv.get(b"O" + (5).to_bytes(8, "big")) == b""


def test_a_dead_homes_files_are_taken_over_when_cold_has_them_else_listed(
        c: Cluster, tmp_path: Path) -> None:
    a = c.run(c.start("a"))
    b = c.run(c.start("b"))
    c.run(a.create_bucket(ROOT, "bkt"))
    clean = os.urandom(1 << 16)
    c.run(a.put_object(ROOT, "bkt", "clean", body(clean)))
    assert c.run(a.placement.drain(timeout=30))
    c.run(a.placement.close())  # a stops persisting (it dies) ...
    dirty = c.run(a.put_object(ROOT, "bkt", "dirty", body(b"only on a"))).ino
    bucket = c.run(b.get_bucket("bkt")).ino
    # ... and b renames a's clean file: a names-only change a's persister would do
    c.run(b.rename(ROOT, bucket, b"clean", bucket, b"moved"))
    with b.meta.snapshot() as tx:
        queue = tx.list_queue()
    b.placement.home_alive = lambda node: node != "a"
    c.run(b.placement._sweep_homes(queue))
    # the clean file is b's now; the dirty one is listed by name, not taken
    with b.meta.snapshot() as tx:
        homes = {k: tx.get_stored_inode(v.ino).home  # type: ignore[union-attr]
                 for k, v in (("moved", tx.lookup(bucket, b"moved")),
                              ("dirty", tx.lookup(bucket, b"dirty"))) if v is not None}
    assert homes == {"moved": "b", "dirty": "a"}
    doc = b.placement.queue_summary()
    assert doc["stranded"] == [{"node": "a", "files": 1, "first": ["bkt/dirty"]}]
    assert dirty in b.placement.stranded["a"].inos
    b.placement.wake()
    assert c.run(b.placement.drain("bkt/moved", timeout=30))
    assert (tmp_path / "cold" / "bkt" / "moved").read_bytes() == clean
    for _ in range(200):  # the old key's delete runs behind the copy
        if not (tmp_path / "cold" / "bkt" / "clean").exists():
            break
        c.run(kick(b))
    assert not (tmp_path / "cold" / "bkt" / "clean").exists()
    assert c.run(get(b, "moved")) == clean
    # a live home keeps its files: nothing is taken from it
    b.placement.home_alive = lambda node: True
    c.run(b.placement._sweep_homes(queue))
    assert b.placement.stranded == {}


def test_cold_deletes_leave_tombstones_and_wait_for_the_keys_home(
        c: Cluster, tmp_path: Path) -> None:
    """On a cluster a carried-out delete stays a tombstone for a while (another node's
    listing read before it must not import the object back), and a pending delete of a key
    that now names a file another node persists is left to that node (only it knows
    whether its upload to the key is in flight)."""
    from tierd.placement import intents

    a = c.run(c.start("a"))
    b = c.run(c.start("b"))
    c.run(a.create_bucket(ROOT, "bkt"))
    c.run(a.put_object(ROOT, "bkt", "gone", body(b"x" * 1000)))
    assert c.run(a.placement.drain(timeout=30))
    assert (tmp_path / "cold" / "bkt" / "gone").exists()
    c.run(a.delete_object(ROOT, "bkt", "gone"))
    for _ in range(200):
        c.run(kick(a))
        with a.meta.snapshot() as tx:
            it = intents.get(tx, "bkt/gone")
        if it is not None and it.ino == intents.TOMB:
            break
    assert not (tmp_path / "cold" / "bkt" / "gone").exists()
    assert it is not None and it.ino == intents.TOMB and it.done_ns > 0
    with a.meta.snapshot() as tx:
        assert intents.pending(tx, "bkt/gone")  # imports keep away from it
        assert intents.count(tx) == (0, False)  # not a pending delete any more
    # and persist --wait has nothing left to wait for (it waited out the tombstone)
    t0 = time.monotonic()
    assert c.run(a.placement.drain("bkt/", timeout=5))
    assert time.monotonic() - t0 < 4
    # a key n b's file holds: a's delete worker leaves an intention on it to b
    ino = c.run(b.put_object(ROOT, "bkt", "bs", body(b"y" * 10))).ino
    with a.meta.write() as tx:
        intents.intend(tx, "bkt/bs", 0)
        assert not a.placement.theirs_to_delete(tx, intents.get(tx, "bkt/bs"))  # type: ignore[arg-type]
    with b.meta.snapshot() as tx:
        assert b.placement.theirs_to_delete(tx, intents.get(tx, "bkt/bs"))  # type: ignore[arg-type]
        assert tx.get_inode(ino) is not None
    # an old tombstone goes at the next pass
    intents_ttl = intents.TOMB_TTL
    intents.TOMB_TTL = 0.0
    try:
        for _ in range(100):
            c.run(kick(a))
            with a.meta.snapshot() as tx:
                if intents.get(tx, "bkt/gone") is None:
                    break
        with a.meta.snapshot() as tx:
            assert intents.get(tx, "bkt/gone") is None
    finally:
        intents.TOMB_TTL = intents_ttl


def test_an_upload_waits_for_another_nodes_upload_to_the_same_key(cluster: Cluster) -> None:
    """Uploads to one cold key are ordered across nodes (tierd.placement.putting): while
    a live node's mark says its upload to the key may be in flight, another node's upload
    waits (its file stays queued), so the newest version lands last; a dead node's mark,
    or one past STALE_S, does not hold anything up; an upload removes its own mark."""
    from tierd.placement import putting

    a = cluster.run(cluster.start("a"))
    b = cluster.run(cluster.start("b"))
    cluster.run(a.create_bucket(ROOT, "bkt"))
    ino = cluster.run(a.put_object(ROOT, "bkt", "k", body(b"new" * 100))).ino
    cold = cluster.base / "cold" / "bkt" / "k"
    alive = {"a": True, "b": True}
    a.placement.home_alive = lambda node: alive[node]
    with b.meta.write() as tx:
        putting.mark(tx, "bkt/k", "b", 999)
    assert cluster.run(a.placement.reconcile(ino)) is False  # b may be uploading: later
    assert not cold.exists()
    with a.meta.snapshot() as tx:
        assert tx.queued(ino) is not None
    alive["b"] = False  # b died with its mark left
    assert cluster.run(a.placement.reconcile(ino)) is True
    assert cold.read_bytes() == b"new" * 100
    with a.meta.snapshot() as tx:  # a's upload replaced the dead mark, then removed it
        assert putting.held_by(tx, "bkt/k", "b", None) == ""
        assert tx.kv.get(b"T" + b"bkt/k") is None
    # a node drops its own leftover marks when it starts, and only its own
    with a.meta.write() as tx:
        putting.mark(tx, "bkt/x", "b", 1)
        putting.mark(tx, "bkt/y", "a", 2)
        assert putting.drop_own(tx, "b") == 1
        assert putting.held_by(tx, "bkt/y", "b", None) == "a"
