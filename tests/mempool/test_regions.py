"""Regions of the memory pool (tierd/mempool/pool.py) on real memfds: sealing, sharing,
ownership, frees and their hooks, reclaim before a refusal, connection clean-up, stats.

tests/checkpoint/test_pool.py covers quota versus pool-full through the daemon and the
bandwidth pacing of far memory; these drive :class:`MemPool` itself.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import mmap
import os

import pytest

from tierd.mempool.extents import ALIGN, PAGE
from tierd.mempool.pool import FarMemory, MemPool, PoolError, Region

MiB = 1 << 20


def test_a_region_is_sealed_at_its_size() -> None:
    pool = MemPool(16 * MiB)
    r = pool.alloc(7, 3 * MiB + 5, name="x")
    try:
        assert os.fstat(r.fd).st_size == 3 * MiB + 5
        seals = fcntl.fcntl(r.fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
        for size in (MiB, 8 * MiB):  # neither shrinks nor grows
            with pytest.raises(OSError) as e:
                os.ftruncate(r.fd, size)
            assert e.value.errno == errno.EPERM
        with pytest.raises(OSError) as e:  # and the seals themselves are sealed
            fcntl.fcntl(r.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        assert e.value.errno == errno.EPERM
    finally:
        pool.close()


def test_a_backed_region_is_shared_memory() -> None:
    """What a tenant writes through its mapping of the descriptor, any other mapping of
    the same region (the daemon's, a restore's) reads."""
    pool = MemPool(16 * MiB)

    async def main() -> Region:
        return await pool.alloc_backed(1, 2 * MiB)

    r = asyncio.run(main())
    a = mmap.mmap(r.fd, r.size)
    b = mmap.mmap(os.dup(r.fd), r.size)  # mmap keeps its own reference to the file
    try:
        a[:5] = b"hello"
        a[r.size - 3:] = b"end"
        assert b[:5] == b"hello" and b[r.size - 3:] == b"end"
        assert os.pread(r.fd, 5, 0) == b"hello"
    finally:
        a.close()
        b.close()
        pool.close()


def test_sizes_must_be_positive_and_leave_nothing_behind() -> None:
    pool = MemPool(8 * MiB)
    for size in (0, -1):
        with pytest.raises(PoolError) as e:
            pool.alloc(1, size)
        assert e.value.errno == errno.EINVAL
    assert pool.regions == {} and pool.used == 0


def test_ownership_of_get_and_free() -> None:
    pool = MemPool(8 * MiB)
    r = pool.alloc(5, MiB)
    with pytest.raises(PoolError) as e:
        pool.get(r.id, 6)
    assert e.value.errno == errno.EACCES
    with pytest.raises(PoolError) as e:
        pool.free(r.id, 6)
    assert e.value.errno == errno.EACCES and r.id in pool.regions
    assert pool.get(r.id, 5) is r and pool.get(r.id, 0) is r and pool.get(r.id) is r
    with pytest.raises(PoolError) as e:
        pool.get(r.id + 100)
    assert e.value.errno == errno.ENOENT
    pool.free(r.id, 0)  # root (the admin API) frees anyone's
    with pytest.raises(PoolError) as e:
        pool.free(r.id)
    assert e.value.errno == errno.ENOENT
    with pytest.raises(OSError):
        os.fstat(r.fd)  # the daemon's descriptor is closed
    assert pool.used == 0


def test_on_free_runs_once_whoever_frees() -> None:
    pool = MemPool(8 * MiB)
    freed: list[int] = []
    a, b, c = (pool.alloc(1, PAGE, conn=3) for _ in range(3))
    for r in (a, b, c):
        r.on_free = lambda region: freed.append(region.id)
    pool.free(a.id)
    pool.connection_closed(3)
    pool.close()
    assert sorted(freed) == sorted([a.id, b.id, c.id])


def test_a_closed_connection_frees_only_its_own_transient_regions() -> None:
    pool = MemPool(16 * MiB)
    mine = pool.alloc(1, MiB, conn=1)
    kept = pool.alloc(1, MiB, conn=1, persistent=True)
    other = pool.alloc(1, MiB, conn=2)
    daemon = pool.alloc(1, MiB)  # conn 0: the daemon's own
    assert pool.connection_closed(1) == [mine.id]
    assert set(pool.regions) == {kept.id, other.id, daemon.id}
    assert pool.connection_closed(1) == []


def test_reclaimers_make_room_before_a_refusal_in_order() -> None:
    """Cache users of the pool give regions back before an allocation is refused: the
    ordinary reclaimers first, the late ones (checkpoints' copies) only if that was not
    enough; a request that can never succeed asks nobody."""
    pool = MemPool(4 * ALIGN)
    cache = [pool.alloc(0, ALIGN) for _ in range(2)]
    ckpt = [pool.alloc(0, ALIGN) for _ in range(2)]
    calls: list[str] = []

    def drop_cache(tenant: int, need: int) -> None:  # a cache gives back what it holds
        calls.append("cache")
        while cache:
            pool.free(cache.pop().id)

    def drop_ckpt(tenant: int, need: int) -> None:  # one copy at a time
        calls.append("ckpt")
        if ckpt:
            pool.free(ckpt.pop().id)

    pool.reclaimers.append(drop_cache)
    pool.late_reclaimers.append(drop_ckpt)
    with pytest.raises(PoolError):
        pool.alloc(9, 0)
    assert calls == []
    pool.alloc(9, 2 * ALIGN)
    assert calls == ["cache"] and not cache and len(ckpt) == 2
    calls.clear()
    pool.alloc(9, ALIGN)  # the cache has nothing left: one checkpoint copy goes
    assert calls == ["cache", "ckpt"] and len(ckpt) == 1
    calls.clear()
    with pytest.raises(PoolError) as e:
        pool.alloc(9, 2 * ALIGN)  # one unit is all that can be made free
    assert e.value.errno == errno.ENOSPC and calls == ["cache", "ckpt"] and not ckpt


def test_quota_limits_a_tenant_and_stats_show_it() -> None:
    pool = MemPool(8 * ALIGN, default_quota=3 * ALIGN)
    pool.quotas[2] = 0  # an entry of 0: the whole pool
    pool.quotas[4] = ALIGN  # listed even without regions
    a = pool.alloc(1, 2 * ALIGN)
    with pytest.raises(PoolError) as e:
        pool.alloc(1, 2 * ALIGN)
    assert e.value.errno == errno.EDQUOT
    assert not pool.quota_limited(2) and pool.quota_limited(1)
    pool.alloc(2, 5 * ALIGN)
    small = pool.alloc(1, 10 << 10)
    s = pool.stats()
    assert s["capacity"] == 8 * ALIGN and s["regions"] == 3
    # the small one holds three pages of a slab; the slab's other pages stay free
    assert s["used"] == 7 * ALIGN + 12 * 1024 and s["free"] == ALIGN - 12 * 1024
    assert s["tenants"]["1"] == {"used": 2 * ALIGN + 12 * 1024, "regions": 2,
                                 "quota": 3 * ALIGN}
    assert s["tenants"]["2"]["quota"] == 8 * ALIGN
    assert s["tenants"]["4"] == {"used": 0, "regions": 0, "quota": ALIGN}
    pool.free(a.id)
    pool.free(small.id)
    s = pool.stats()  # units 0-1 and 7 are free: the largest extent is 2 of the 3
    assert s["used"] == 5 * ALIGN and s["largest_free"] == 2 * ALIGN
    assert s["fragmentation"] == round(1 / 3, 4)


def test_far_memory_moves_in_batches_and_counts_both_ways() -> None:
    far = FarMemory(latency_us=100.0)
    src = os.urandom(10_000)
    dst = bytearray(len(src))
    batches: list[tuple[int, int]] = []

    def copy(off: int, n: int) -> None:
        batches.append((off, n))
        dst[off:off + n] = src[off:off + n]

    asyncio.run(far.move(len(src), 4096, copy))
    assert bytes(dst) == src
    assert batches == [(0, 4096), (4096, 4096), (8192, 10_000 - 8192)]
    asyncio.run(far.move(100, 4096, copy, outbound=False))
    assert (far.moved_out, far.moved_in) == (10_000, 100)
