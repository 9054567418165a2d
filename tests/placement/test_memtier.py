"""The memory tier: files of a ``tier = "mem"`` prefix copied into memory-pool regions,
served from there, refilling hot from there, spilling to hot when the pool cannot hold them,
and giving their regions back to checkpoints (real pool memfds, real hot files, both cold
engines)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tierd.mempool.pool import MemPool, PoolError
from tierd.namespace import Namespace
from tierd.placement import Placement
from tierd.placement.memtier import MEM, MemTier
from tierd.placement.ops import PlacementOps
from tierd.tiers import BLOCK_SIZE

from .conftest import ROOT, Env, MiB, body, read_file, until, write_file


async def _put(env: Env, key: str, data: bytes) -> int:
    assert env.ns is not None
    await env.ns.put_object(ROOT, "mem", key, body(data))
    return (await env.ns.resolve(ROOT, f"mem/{key}")).ino


@contextlib.asynccontextmanager
async def _pooled(env: Env, capacity: int, max_share: float = 0.5,
                  policy: str | None = "mem/", bucket: bool = True,
                  ) -> AsyncIterator[tuple[Namespace, Placement, MemPool, MemTier]]:
    """A started namespace over ``env`` with a pool of ``capacity`` attached as the memory
    tier, bucket ``mem`` made and ``policy`` (a prefix) placed in memory."""
    ns, p = await env.open()
    pool = MemPool(capacity)
    mem = p.attach_pool(pool, max_share)
    try:
        if bucket:
            await ns.create_bucket(ROOT, "mem")
        if policy is not None:
            await PlacementOps(p).set_policy(policy, tier=MEM)
        yield ns, p, pool, mem
    finally:
        p.detach_pool()
        pool.close()
        await env.close()


def _regions(pool: MemPool) -> dict[str, int]:
    return {r.name: r.size for r in pool.regions.values()}


async def test_mem_policy_files_are_copied_into_the_pool_and_served_from_it(env: Env) -> None:
    async with _pooled(env, 64 * MiB, policy=None) as (ns, p, pool, mem):
        ops = PlacementOps(p)
        await ops.set_policy("mem/ckpt/", tier=MEM)
        data = os.urandom(3 * MiB + 17)
        ino = await _put(env, "ckpt/a.bin", data)
        other = await _put(env, "plain/b.bin", os.urandom(MiB))
        await until(lambda: mem.get(ino) is not None)
        assert _regions(pool) == {f"mem:{ino}": len(data)}  # the pool accounts for it
        assert mem.get(other) is None  # not under the policy
        assert await read_file(ns, ino) == data
        assert mem.stats["hits"] >= 1 and mem.stats["read_bytes"] == len(data)
        # the copy is real pool memory with the file's bytes, not a view of the hot file
        region = mem.copies[ino].region
        assert os.pread(region.fd, len(data), 0) == data
        du = ops.du("mem/ckpt/")
        assert du["tiers"][MEM] == len(data) and du["totals"][MEM]["used"] == 4 * MiB
        # a PUT over it is a new inode: the old copy is freed and the new one made
        new = os.urandom(2 * MiB)
        ino2 = await _put(env, "ckpt/a.bin", new)
        await until(lambda: mem.get(ino2) is not None and mem.get(ino) is None)
        assert await read_file(ns, ino2) == new
        assert _regions(pool) == {f"mem:{ino2}": len(new)}
        # new content in place (the file API): the copy is dropped at once, then remade
        fh = await ns.open(ROOT, ino2, os.O_WRONLY)
        await ns.write(fh, 0, b"X" * 10)
        await ns.release(fh)
        new = b"X" * 10 + new[10:]
        await until(lambda: (c := mem.get(ino2)) is not None and c.version != 0
                    and os.pread(c.region.fd, 10, 0) == b"X" * 10)
        assert await read_file(ns, ino2) == new
        # deleting the file frees its region
        await ns.delete_object(ROOT, "mem", "ckpt/a.bin")
        await until(lambda: not pool.regions)
        assert mem.used == 0


async def test_written_through_the_file_api_and_renamed(file_env: Env) -> None:
    """The torch.save pattern: write a temporary file, close, rename into place."""
    async with _pooled(file_env, 64 * MiB) as (ns, p, _pool, mem):
        data = os.urandom(5 * MiB)
        b = await ns.resolve(ROOT, "mem")
        ino = await write_file(ns, b.ino, b"ckpt.pt.tmp", data)
        await until(lambda: mem.get(ino) is not None)
        await ns.rename(ROOT, b.ino, b"ckpt.pt.tmp", b.ino, b"ckpt.pt")
        assert mem.get(ino) is not None  # a rename does not change the content
        assert await read_file(ns, ino) == data
        assert await p.drain(timeout=30)
        assert file_env.raw_get("mem/ckpt.pt") == data


async def test_hot_refilled_from_the_pool_not_cold(env: Env) -> None:
    async with _pooled(env, 64 * MiB) as (ns, p, _pool, mem):
        data = os.urandom(2 * BLOCK_SIZE + 5)
        ino = await _put(env, "x", data)
        await until(lambda: mem.get(ino) is not None)
        assert await p.drain(timeout=30)
        assert await p.evict_file(ino, "hot") == len(data)
        fetched = p.stats.fetched_bytes
        assert await read_file(ns, ino) == data  # the FUSE path: straight from the pool
        reader = await ns.get_object(ROOT, "mem", "x")  # the S3 path needs the hot file
        try:
            got = os.pread(reader.fd, len(data), 0)
        finally:
            await reader.close()
        assert got == data
        assert p.stats.filled["hot", "mem"] == len(data)
        assert p.stats.fetched_bytes == fetched  # cold was not asked


async def test_a_failed_refill_from_the_pool_raises_its_os_error(
        file_env: Env, tmp_path: Path) -> None:
    """A refill whose write into the tier fails (ENOSPC in life; here a descriptor open
    for reading: EBADF) raises that OSError, which the read path answers (evict and retry
    on ENOSPC) -- not a BufferError from closing the copy's mapping while the failed
    write's traceback still held a view of it."""
    async with _pooled(file_env, 64 * MiB) as (_ns, _p, _pool, mem):
        data = os.urandom(MiB)
        ino = await _put(file_env, "refill", data)
        await until(lambda: mem.get(ino) is not None)
        copy = mem.get(ino)
        assert copy is not None
        (tmp_path / "ro").write_bytes(b"")
        fd = os.open(tmp_path / "ro", os.O_RDONLY)
        try:
            with pytest.raises(OSError) as ei:
                await asyncio.to_thread(mem.copy_out, ino, copy.version, fd, 0, len(data))
            assert ei.value.errno == errno.EBADF
        finally:
            os.close(fd)


async def test_spill_to_hot_when_the_pool_cannot_hold_a_file(file_env: Env) -> None:
    async with _pooled(file_env, 8 * MiB, max_share=0.5) as (ns, _p, pool, mem):
        big = os.urandom(6 * MiB)  # over half of the pool
        ino = await _put(file_env, "big", big)
        await until(lambda: mem.stats["spilled"] >= 1)
        assert mem.get(ino) is None and not pool.regions
        assert await read_file(ns, ino) == big  # served from hot
        # a quota below the file's size spills too, and is the owner's (uid 0) quota
        pool.quotas[0] = 2 * MiB
        small = os.urandom(3 * MiB)
        ino2 = await _put(file_env, "small", small)
        await until(lambda: mem.stats["spilled"] >= 2)
        assert mem.get(ino2) is None
        assert await read_file(ns, ino2) == small


async def test_checkpoint_regions_reclaim_memory_copies_lru(file_env: Env) -> None:
    async with _pooled(file_env, 16 * MiB) as (ns, _p, pool, mem):
        inos = []
        for i in range(4):  # four 4 MiB copies fill the pool
            inos.append(await _put(file_env, f"f{i}", os.urandom(3 * MiB)))
            await until(lambda i=i: mem.get(inos[i]) is not None)
        assert pool.extents.free == 0
        await read_file(ns, inos[0])  # f0 is now the most recently used
        # a client's region (a checkpoint) gets room: the least recently used copies go
        region = await pool.alloc_backed(1000, 6 * MiB, name="ckpt")
        assert mem.get(inos[1]) is None and mem.get(inos[2]) is None
        assert mem.get(inos[0]) is not None and mem.get(inos[3]) is not None
        assert mem.stats["evicted"] == 2
        # a copy never takes a client's region: a new file now spills or evicts copies only
        ino5 = await _put(file_env, "f5", os.urandom(7 * MiB))
        await until(lambda: mem.stats["spilled"] >= 1 or mem.get(ino5) is not None)
        assert region.id in pool.regions
        # quota: over its own quota, a tenant's request reclaims that tenant's copies only
        copies = len(mem.copies)
        with pytest.raises(PoolError) as e:
            pool.check_room(7, 12 * MiB)  # more than copies + free: reclaim cannot help
        assert e.value.errno == errno.ENOSPC
        assert len(mem.copies) == copies  # ... so it evicted nothing
        pool.quotas[0] = pool.used_by(0)
        pool.check_room(0, 2 * MiB)  # tenant 0 at its quota: its own copies make room
        assert pool.used_by(0) + 2 * MiB <= pool.quota_of(0)
        pool.free(region.id)


async def test_an_admin_free_and_a_restart_lose_only_the_cache(file_env: Env) -> None:
    data = os.urandom(3 * MiB)
    async with _pooled(file_env, 32 * MiB) as (ns, p, pool, mem):
        ino = await _put(file_env, "x", data)
        await until(lambda: mem.get(ino) is not None)
        (rid,) = pool.regions
        pool.free(rid)  # tierctl pool free
        assert mem.get(ino) is None and mem.used == 0
        assert await read_file(ns, ino) == data  # from hot; and it comes back
        await until(lambda: mem.get(ino) is not None)
        assert await p.drain(timeout=30)
    # a restart: the pool is new and empty (the policy is kept in the metadata); the first
    # read brings the file back into it
    async with _pooled(file_env, 32 * MiB, policy=None, bucket=False) as (ns, p, pool, mem):
        assert p.policy_for("mem/x").tier == MEM
        ino = (await ns.resolve(ROOT, "mem/x")).ino
        assert mem.get(ino) is None
        assert await read_file(ns, ino) == data
        await until(lambda: mem.get(ino) is not None)
        assert await read_file(ns, ino) == data
        assert mem.stats["hits"] >= 1


async def test_warmup_evict_and_policy_change(env: Env) -> None:
    async with _pooled(env, 64 * MiB, policy=None) as (ns, p, pool, mem):
        ops = PlacementOps(p)
        payloads = {f"d/{i}": os.urandom(MiB + i) for i in range(3)}
        for k, v in payloads.items():
            env.raw_put(f"mem/{k}", v)
        await ns.list_objects(ROOT, "mem")
        docs = [d async for d in ops.warmup("mem/d/", tier=MEM)]
        assert docs[-1]["done"] == sum(map(len, payloads.values()))
        assert docs[-1]["tier"] == MEM
        inos = {k: (await ns.resolve(ROOT, f"mem/{k}")).ino for k in payloads}
        assert all(mem.get(i) is not None for i in inos.values())
        for k, i in inos.items():
            assert await read_file(ns, i) == payloads[k]
        out = await ops.evict("mem/d/", MEM)
        assert out["tiers"][MEM] == sum(map(len, payloads.values())) and not pool.regions
        # a prefix that leaves the memory tier drops its copies
        await ops.set_policy("mem/d/", tier=MEM)
        for i in inos.values():
            await read_file(ns, i)
        await until(lambda: all(mem.get(i) is not None for i in inos.values()))
        await ops.set_policy("mem/d/", tier="hot")
        assert not mem.copies and not pool.regions


async def test_policy_needs_a_pool(file_env: Env) -> None:
    _, p = await file_env.open()
    try:
        with pytest.raises(ValueError, match="memory pool"):
            await PlacementOps(p).set_policy("mem/", tier=MEM)
        with pytest.raises(ValueError, match="tier must be"):
            await PlacementOps(p).set_policy("mem/", tier="ram")
        with pytest.raises(ValueError, match="memory pool"):
            PlacementOps(p).check_tier(MEM)
    finally:
        await file_env.close()


async def test_concurrent_readers_while_copies_churn(file_env: Env) -> None:
    """Readers of files whose copies are being made, reclaimed and rewritten always get
    the file's current bytes."""
    async with _pooled(file_env, 12 * MiB) as (ns, _p, pool, mem):
        history: dict[str, list[bytes]] = {}
        for i in range(5):
            history[f"k{i}"] = [os.urandom(2 * MiB + i)]
            await _put(file_env, f"k{i}", history[f"k{i}"][0])

        committed = dict.fromkeys(history, 1)

        async def reader() -> None:
            for r in range(30):
                k = f"k{r % 5}"
                since = committed[k] - 1  # the version current when the read starts
                ino = (await ns.resolve(ROOT, f"mem/{k}")).ino
                got = await read_file(ns, ino)
                # an open file keeps the content it was resolved to (a later PUT is a new
                # inode): one of the versions current during the read, never another
                assert got in history[k][since:], k

        async def writer() -> None:
            for r in range(10):
                k = f"k{r % 5}"
                history[k].append(os.urandom(2 * MiB + r))  # may be read from now on
                await _put(file_env, k, history[k][-1])
                committed[k] += 1
                await asyncio.sleep(0.01)

        await asyncio.gather(reader(), reader(), writer())
        cur = {k: v[-1] for k, v in history.items()}
        for k, v in cur.items():
            assert await read_file(ns, (await ns.resolve(ROOT, f"mem/{k}")).ino) == v
        assert mem.used <= pool.capacity
        assert mem.stats["hits"] > 0 and mem.stats["admitted"] > 5
