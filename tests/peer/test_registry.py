"""The node registry in a real metadata store (lmdb, and a real PostgreSQL shared by two
"nodes"), its heartbeat, and a peer read whose URL comes from PostgreSQL."""

from __future__ import annotations

import asyncio
import time

import pytest
from meta.pg_server import PgServer

from tierd.meta.pg_engine import PgStore
from tierd.meta.store import MetaStore
from tierd.peer import registry
from tierd.peer.client import PeerClient
from tierd.peer.registry import Heartbeat, NodeInfo

from .conftest import SECRET, Held, running_door


def test_register_lookup_list_and_alive(meta: MetaStore) -> None:
    assert registry.lookup(meta, "n1") is None
    assert registry.list_nodes(meta) == []
    a = registry.register(meta, "n1", "http://10.0.0.1:9100", now_ns=1_000)
    b = registry.register(meta, "n2", "http://10.0.0.2:9100", now_ns=2_000)
    assert registry.lookup(meta, "n1") == a == NodeInfo("n1", "http://10.0.0.1:9100",
                                                        1_000, 1_000)
    assert registry.list_nodes(meta) == [a, b]
    assert registry.alive(a, now_ns=1_000 + int(10e9), lease_s=10)
    assert not registry.alive(a, now_ns=1_001 + int(10e9), lease_s=10)
    # a beat keeps the start and moves the heartbeat; a restart replaces both
    assert registry.beat(meta, a, now_ns=5_000)
    assert registry.lookup(meta, "n1") == NodeInfo("n1", a.url, 5_000, 1_000)
    again = registry.register(meta, "n1", "http://10.0.0.1:9200", now_ns=9_000)
    assert registry.lookup(meta, "n1") == again
    assert registry.unregister(meta, "n2") and not registry.unregister(meta, "n2")
    assert registry.list_nodes(meta) == [again]


def test_registry_keys_do_not_mix_with_versioning_records(meta: MetaStore) -> None:
    """Bucket versioning records are ``H<bucket>\\0...``: a registry under ``H`` would list
    them as nodes (and a node named like a bucket would shadow its records)."""
    with meta.write() as tx:
        tx.kv.put(b"Hn1\x00key\x00" + bytes(8), b"\x95\xa3key\x00\xc2\x00\x00")
    registry.register(meta, "n1", "http://10.0.0.1:9100")
    assert [i.node for i in registry.list_nodes(meta)] == ["n1"]


def test_a_second_daemon_with_the_same_name_is_seen(meta: MetaStore) -> None:
    first = registry.register(meta, "n1", "http://a:1", now_ns=1)
    assert registry.beat(meta, first, now_ns=2)
    registry.register(meta, "n1", "http://b:1", now_ns=3)  # another process, same name
    assert not registry.beat(meta, first, now_ns=4)


async def test_the_heartbeat_moves_while_the_door_runs(meta: MetaStore) -> None:
    held = Held()
    async with running_door(meta, held, heartbeat_s=0.05) as door:
        info = door.info
        assert info is not None and registry.lookup(meta, "n1") == info
        await asyncio.sleep(0.5)
        hb = door.heartbeat
        assert hb is not None and hb.beats >= 3
        now = registry.lookup(meta, "n1")
        assert now is not None and now.started_ns == info.started_ns
        assert now.heartbeat_ns > info.heartbeat_ns and now.url == door.url
    # stopped: the beats stop, the entry stays (dead once the lease runs out)
    last = registry.lookup(meta, "n1")
    await asyncio.sleep(0.2)
    assert registry.lookup(meta, "n1") == last


async def test_the_heartbeat_outlives_a_database_restart(pg_server: PgServer) -> None:
    """PostgreSQL restarted under a beating node (every pooled connection cut): the beats
    that fail are logged and the next ones succeed; the node never stops."""
    meta = MetaStore(PgStore(pg_server.url("peer-restart"), node="n1", timeout=3.0))
    try:
        mine = await asyncio.to_thread(registry.register, meta, "n1", "http://x:1")
        hb = Heartbeat(meta, mine, interval_s=0.02)
        hb.start()
        await asyncio.sleep(0.2)
        before = hb.beats
        assert before >= 2
        await asyncio.to_thread(pg_server.restart)
        deadline = time.monotonic() + 20
        while hb.beats < before + 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await hb.stop()
        assert hb.beats >= before + 3
        seen = await asyncio.to_thread(registry.lookup, meta, "n1")
        assert seen is not None and seen.heartbeat_ns > mine.heartbeat_ns
    finally:
        meta.close()


def test_registry_over_postgresql_is_shared(pg_server: PgServer) -> None:
    url = pg_server.url("peer-registry")
    a, b = MetaStore(PgStore(url, node="n1")), MetaStore(PgStore(url, node="n2"))
    try:
        mine = registry.register(a, "n1", "http://10.0.0.1:9100")
        assert registry.lookup(b, "n1") == mine
        assert registry.beat(a, mine, now_ns=mine.heartbeat_ns + 7)
        seen = registry.lookup(b, "n1")  # b's read cache must not keep the old beat
        assert seen is not None and seen.heartbeat_ns == mine.heartbeat_ns + 7
        registry.register(b, "n2", "http://10.0.0.2:9100")
        assert [i.node for i in registry.list_nodes(a)] == ["n1", "n2"]
    finally:
        a.close()
        b.close()


async def test_a_peer_read_through_a_postgresql_registry(pg_server: PgServer) -> None:
    url = pg_server.url("peer-read")
    a, b = MetaStore(PgStore(url, node="n1")), MetaStore(PgStore(url, node="n2"))
    data = bytes(range(256)) * 1000
    client = PeerClient("n2", SECRET, b)
    try:
        async with running_door(a, Held({5: (2, data)}), heartbeat_s=0.05):
            t0 = time.monotonic()
            assert await client.read("n1", 5, 2, 1000, 70_000) == data[1000:71_000]
            assert time.monotonic() - t0 < 5
    finally:
        await client.close()
        a.close()
        b.close()


@pytest.mark.parametrize("lease_s", [0.0, 1.0])
def test_alive_at_the_edge(lease_s: float) -> None:
    info = NodeInfo("n1", "http://x:1", 10**18, 10**18)
    assert registry.alive(info, now_ns=10**18 + int(lease_s * 1e9), lease_s=lease_s)
    assert not registry.alive(info, now_ns=10**18 + int(lease_s * 1e9) + 1, lease_s=lease_s)
