"""The warm tier: demotion from hot, reads from warm before cold, promotion on a second
reference, dropping from warm, pins, the policy's target tier, warmup and du per tier."""

from __future__ import annotations

import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tierd.metrics import Metrics
from tierd.placement import HOT, Placement
from tierd.placement.engine import WARM
from tierd.placement.ops import PlacementOps
from tierd.tiers import BLOCK_SIZE

from .conftest import ROOT, Env, read_file, until, write_file


def _on(inode_blocks: dict[str, bytes], tier: str, nblocks: int = 1) -> bool:
    bm = inode_blocks.get(tier)
    if bm is None:
        return tier == HOT
    return all(bm[b // 8] >> (b % 8) & 1 if b // 8 < len(bm) else False
               for b in range(nblocks))


async def _exposed(p: Placement, name: str, **labels: str) -> float:
    """A sample of ``/metrics`` as the daemon renders it for ``p`` (0 when absent)."""
    m = Metrics()
    m.attach(placement=p)
    for family in text_string_to_metric_families((await m.render()).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


async def _blocks(env: Env, key: str) -> dict[str, bytes]:
    assert env.ns is not None
    return (await env.ns.resolve(ROOT, key)).blocks


async def test_hot_eviction_demotes_and_reads_come_from_warm(env: Env) -> None:
    data = {f"wmx/d/{i}": os.urandom(BLOCK_SIZE) for i in range(10)}
    for k, v in data.items():
        env.raw_put(k, v)
    ns, p = await env.open(capacity=4 * BLOCK_SIZE, warm=32 * BLOCK_SIZE, hot_high=0.9,
                           hot_low=0.5)
    try:
        await ns.list_objects(ROOT, "wmx")
        for k, v in data.items():  # a pass over 10 blocks through a 4-block hot tier
            assert await read_file(ns, (await ns.resolve(ROOT, k)).ino) == v
        assert p.stats.demoted_bytes >= 6 * BLOCK_SIZE
        assert p.hotc.used <= 4 * BLOCK_SIZE
        demoted = [k for k in data if _on(await _blocks(env, k), WARM)]
        assert len(demoted) >= 6
        assert p.warmc is not None and p.warmc.used == len(demoted) * BLOCK_SIZE
        fetched = p.stats.fetched_bytes
        for k in demoted:  # back from warm: cold is not asked again
            assert await read_file(ns, (await ns.resolve(ROOT, k)).ino) == data[k]
        assert p.stats.fetched_bytes == fetched
        du = PlacementOps(p).du("wmx/")
        assert du["tiers"]["warm"] >= 6 * BLOCK_SIZE and du["tiers"]["cold"] == 10 * BLOCK_SIZE
        assert du["totals"]["warm"]["used"] == p.warmc.used
    finally:
        await env.close()


async def test_second_reference_promotes_a_warm_block(file_env: Env) -> None:
    payload = os.urandom(2 * BLOCK_SIZE)
    file_env.raw_put("prx/a", payload)
    ns, p = await file_env.open(capacity=64 * BLOCK_SIZE, warm=64 * BLOCK_SIZE)
    ops = PlacementOps(p)
    try:
        await ns.list_objects(ROOT, "prx")
        ino = (await ns.resolve(ROOT, "prx/a")).ino
        assert await read_file(ns, ino) == payload
        assert (await ops.evict("prx/", tier="hot"))["tiers"]["hot"] == 2 * BLOCK_SIZE
        blocks = await _blocks(file_env, "prx/a")
        assert _on(blocks, WARM, 2) and not _on(blocks, HOT)
        p.hotc.order.a1out.clear()  # no ghost history: the first reference stays on warm
        assert await read_file(ns, ino) == payload
        assert not _on(await _blocks(file_env, "prx/a"), HOT)
        assert p.stats.warm_read_bytes == 2 * BLOCK_SIZE
        assert await read_file(ns, ino) == payload  # the second reference promotes
        blocks = await _blocks(file_env, "prx/a")
        assert _on(blocks, HOT, 2) and _on(blocks, WARM, 2)  # warm keeps its copy
        assert p.stats.promoted_blocks == 2
        assert p.stats.filled[("hot", "warm")] == 2 * BLOCK_SIZE
        assert await _exposed(p, "tierd_tier_filled_bytes_total", tier="hot",
                              source="warm") == 2 * BLOCK_SIZE
        assert await _exposed(p, "tierd_tier_promoted_blocks_total") == 2
        # a block that left hot's FIFO recently (a 2Q ghost) is promoted on its first read
        await ops.evict("prx/", tier="hot")
        assert await read_file(ns, ino) == payload
        assert p.stats.fetched_bytes == 2 * BLOCK_SIZE  # cold was read once, at first
    finally:
        await file_env.close()


async def test_warm_drops_when_full_and_pins_stay(file_env: Env) -> None:
    for i in range(3):
        file_env.raw_put(f"pwx/keep/{i}", os.urandom(BLOCK_SIZE))
    scan = {f"pwx/scan/{i:02d}": os.urandom(BLOCK_SIZE) for i in range(16)}
    for k, v in scan.items():
        file_env.raw_put(k, v)
    ns, p = await file_env.open(capacity=4 * BLOCK_SIZE, warm=8 * BLOCK_SIZE, hot_high=0.9,
                                hot_low=0.5, warm_high=0.9, warm_low=0.5)
    ops = PlacementOps(p)
    try:
        await ns.list_objects(ROOT, "pwx")
        await ops.set_policy("pwx/keep/", pin=True, tier="warm")
        progress = [doc async for doc in ops.warmup("pwx/keep/")]
        assert progress[-1]["done"] == 3 * BLOCK_SIZE and progress[-1]["tier"] == "warm"
        du = ops.du("pwx/keep/")
        assert du["tiers"]["warm"] == 3 * BLOCK_SIZE and du["tiers"]["hot"] == 0
        for k, v in scan.items():
            assert await read_file(ns, (await ns.resolve(ROOT, k)).ino) == v
        assert p.stats.evicted_from["warm"] > 0  # warm dropped scan blocks...
        assert await _exposed(p, "tierd_tier_evicted_bytes_total", tier="warm") == \
            p.stats.evicted_from["warm"]
        assert await _exposed(p, "tierd_tier_evicted_bytes_total", tier="hot") == \
            p.stats.evicted_from["hot"] == p.stats.evicted_bytes > 0
        assert p.warmc is not None and p.warmc.used <= 8 * BLOCK_SIZE
        assert ops.du("pwx/keep/")["tiers"]["warm"] == 3 * BLOCK_SIZE  # ...never the pins
        for k, v in scan.items():  # dropped blocks come back from cold
            assert await read_file(ns, (await ns.resolve(ROOT, k)).ino) == v
        with pytest.raises(ValueError):
            await ops.set_policy("pwx/x/", tier="cold")
    finally:
        await file_env.close()


async def test_policy_tier_warm_moves_written_data_down_after_persistence(env: Env) -> None:
    ns, p = await env.open(warm=64 * BLOCK_SIZE)
    ops = PlacementOps(p)
    try:
        b = await ns.create_bucket(ROOT, "twx")
        d = await ns.mkdir(ROOT, b.ino, b"ckpt", 0o755)
        await ops.set_policy("twx/ckpt/", tier="warm")
        payload = os.urandom(2 * BLOCK_SIZE + 5)
        ino = await write_file(ns, d.ino, b"step1", payload)
        other = await write_file(ns, b.ino, b"plain", payload)  # no policy: stays on hot
        assert await p.drain("twx/", timeout=30)
        await until(lambda: p.stats.demoted_bytes >= len(payload))
        blocks = await _blocks(env, "twx/ckpt/step1")
        assert _on(blocks, WARM, 3) and not _on(blocks, HOT)
        assert _on(await _blocks(env, "twx/plain"), HOT, 3)
        assert env.raw_get("twx/ckpt/step1") == payload
        assert await read_file(ns, ino) == payload
        assert await read_file(ns, other) == payload
        # new content replaces the warm copy (written on hot, demoted again once persisted)
        payload2 = os.urandom(BLOCK_SIZE)
        fh = await ns.open(ROOT, ino, os.O_WRONLY | os.O_TRUNC)
        await ns.write(fh, 0, payload2)
        await ns.release(fh)
        assert WARM not in await _blocks(env, "twx/ckpt/step1")
        assert await p.drain("twx/", timeout=30)
        await until(lambda: p.warmc is not None and p.warmc.used == BLOCK_SIZE)
        assert await read_file(ns, ino) == payload2
        assert env.raw_get("twx/ckpt/step1") == payload2
    finally:
        await env.close()


async def test_warm_state_survives_restart_and_deletes_clean_up(file_env: Env) -> None:
    payload = os.urandom(BLOCK_SIZE + 1)
    file_env.raw_put("rwx/a", payload)
    ns, p = await file_env.open(warm=16 * BLOCK_SIZE)
    try:
        await ns.list_objects(ROOT, "rwx")
        ino = (await ns.resolve(ROOT, "rwx/a")).ino
        progress = [doc async for doc in PlacementOps(p).warmup("rwx/", tier="warm")]
        assert progress[-1]["done"] == len(payload)
    finally:
        await file_env.close()
    ns, p = await file_env.open(warm=16 * BLOCK_SIZE)
    try:
        assert p.warmc is not None and p.warmc.used == len(payload)  # rebuilt from metadata
        assert p.warm is not None and os.path.exists(p.warm.path(ino))
        assert await read_file(ns, ino) == payload
        b = await ns.resolve(ROOT, "rwx")
        await ns.unlink(ROOT, b.ino, b"a")
        await ns.garbage.drain()  # local copies go once the unlink is durable
        assert p.warmc.used == 0 and not os.path.exists(p.warm.path(ino))
    finally:
        await file_env.close()


async def test_reads_under_a_warm_policy_land_on_warm(env: Env) -> None:
    payload = os.urandom(3 * BLOCK_SIZE + 9)
    env.raw_put("rdw/ds/big", payload)
    ns, p = await env.open(warm=64 * BLOCK_SIZE)
    try:
        await PlacementOps(p).set_policy("rdw/ds/", tier="warm")
        await ns.list_objects(ROOT, "rdw")
        ino = (await ns.resolve(ROOT, "rdw/ds/big")).ino
        assert await read_file(ns, ino) == payload  # a stream: readahead lands on warm too
        blocks = await _blocks(env, "rdw/ds/big")
        assert _on(blocks, WARM, 4) and not any(blocks.get(HOT, b""))
        assert p.stats.filled[("warm", "cold")] == len(payload)
        assert p.stats.fetched_bytes == len(payload)
        assert await read_file(ns, ino) == payload  # the second reference promotes
        assert _on(await _blocks(env, "rdw/ds/big"), HOT, 4)
        assert p.stats.fetched_bytes == len(payload)  # cold was read once
    finally:
        await env.close()
