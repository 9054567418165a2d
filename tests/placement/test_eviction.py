"""Eviction under watermarks with a working set and a large scan; pin; warmup; evict."""

from __future__ import annotations

import os

from tierd.placement import HOT, LRU, TwoQ
from tierd.placement.ops import PlacementOps
from tierd.tiers import BLOCK_SIZE

from .conftest import ROOT, Env, read_file

CAP_BLOCKS = 16


def _present(ns_inode_blocks: dict[str, bytes]) -> bool:
    bm = ns_inode_blocks.get(HOT)
    return bm is None or bm == b"\x01"


async def test_working_set_survives_a_scan_and_lru_would_not(file_env: Env) -> None:
    for i in range(4):
        file_env.raw_put(f"evx/ws/{i}", os.urandom(BLOCK_SIZE))
    for i in range(30):
        file_env.raw_put(f"evx/scan/{i:02d}", os.urandom(BLOCK_SIZE))
    ns, p = await file_env.open(capacity=CAP_BLOCKS * BLOCK_SIZE, hot_high=0.9, hot_low=0.75)
    lru = LRU(CAP_BLOCKS)
    try:
        await ns.list_objects(ROOT, "evx")  # imports everything
        ws = [await ns.resolve(ROOT, f"evx/ws/{i}") for i in range(4)]
        scan = [await ns.resolve(ROOT, f"evx/scan/{i:02d}") for i in range(30)]
        for _ in range(3):  # the working set is read again and again
            for inode in ws:
                await read_file(ns, inode.ino)
                lru.access((inode.ino, 0))
        for inode in scan:  # one pass over a dataset twice the tier
            await read_file(ns, inode.ino)
            lru.access((inode.ino, 0))
            while len(lru) > CAP_BLOCKS:
                lru.remove(next(lru.victims()))
        assert p.used <= CAP_BLOCKS * BLOCK_SIZE
        kept = [_present((await ns.resolve(ROOT, f"evx/ws/{i}")).blocks) for i in range(4)]
        assert all(kept), kept
        assert not any((inode.ino, 0) in lru for inode in ws)  # plain LRU lost them all
        assert p.stats.evicted_bytes > 0
    finally:
        await file_env.close()


async def test_pin_warmup_and_evict(file_env: Env) -> None:
    for i in range(3):
        file_env.raw_put(f"pinx/keep/{i}", os.urandom(BLOCK_SIZE))
    for i in range(20):
        file_env.raw_put(f"pinx/scan/{i:02d}", os.urandom(BLOCK_SIZE))
    ns, p = await file_env.open(capacity=8 * BLOCK_SIZE, hot_high=0.9, hot_low=0.5)
    ops = PlacementOps(p)
    try:
        await ns.list_objects(ROOT, "pinx")
        assert (await ops.set_policy("pinx/keep/", pin=True))["pin"] is True
        progress = [doc async for doc in ops.warmup("pinx/keep/")]
        assert progress[-1]["done"] == progress[-1]["total"] == 3 * BLOCK_SIZE
        du = ops.du("pinx/keep/")
        assert du["tiers"]["hot"] == 3 * BLOCK_SIZE and du["dirty"] == 0
        for i in range(20):  # read once each: would push out unpinned blocks
            inode = await ns.resolve(ROOT, f"pinx/scan/{i:02d}")
            await read_file(ns, inode.ino)
        for i in range(3):
            assert _present((await ns.resolve(ROOT, f"pinx/keep/{i}")).blocks)
        assert ops.du("pinx/keep/")["tiers"]["hot"] == 3 * BLOCK_SIZE
        # evict PREFIX drops what it may; pinned data stays until unpinned
        assert (await ops.evict("pinx/keep/"))["evicted"] == 0
        await ops.set_policy("pinx/keep/", pin=False)
        assert (await ops.evict("pinx/keep/"))["evicted"] == 3 * BLOCK_SIZE
        assert ops.du("pinx/keep/")["tiers"]["hot"] == 0
        inode = await ns.resolve(ROOT, "pinx/keep/0")
        assert len(await read_file(ns, inode.ino)) == BLOCK_SIZE  # read-through again
    finally:
        await file_env.close()


def test_two_q_keeps_hot_keys_through_scans() -> None:
    q = TwoQ(100)
    for _ in range(2):
        for k in range(50):
            q.access((1, k))
            if len(q) > 100:
                q.remove(next(q.victims()))
    for k in range(1000):
        q.access((2, k))
        while len(q) > 100:
            q.remove(next(q.victims()))
    assert sum((1, k) in q for k in range(50)) >= 40
