"""The memory tier: whole-file copies of ``tier = "mem"`` files in memory-pool regions.

A prefix whose placement policy names ``mem`` keeps its files in pool memory (the emulated
CXL pool of :mod:`tierd.mempool`): once a file is durable on hot — after a write's commit,
after persistence, on its first read, or by ``warmup --tier mem`` — its bytes are copied
into a region of the pool and FUSE reads are served from there (a ``pread`` of memory, on
the loop: it never waits for a disk), and a hot block the file lost to eviction is refilled
from the region instead of from cold.

Why whole-file copies in regions rather than a third block cache like warm: the pool's unit
is a region (a sealed memfd with its pages allocated up front, placed in the pool's address
range), the pool's accounting, quotas and far-memory pacing then cover the tier as they
cover checkpoints, and ``tierctl pool status`` shows each copy as a region ``mem:<ino>``.
The files the policy is for (checkpoints read back by training, small hot datasets) are
read whole.

The copies are a cache, never the only copy: writes land on hot as everywhere (the
durability points fsync there), so losing the pool — a daemon restart, an admin's ``pool
free`` — loses nothing.  **Spill**: a copy the pool cannot hold (over the owner's quota, no
extent large enough, larger than ``max_share`` of the pool) is simply not made, and the file
is served from hot.  **Priority**: checkpoints and clients' regions hold the only copy of
their bytes, so when the pool refuses them an allocation it first reclaims memory-tier
copies (least recently used first, of the same tenant when the limit hit is a quota);
a new copy likewise displaces older ones.

Copies are charged to the file owner's uid (the pool's tenant), so a pool quota bounds
both what a user stages as checkpoints and what their files keep in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import mmap
import os
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from tierd.mempool.extents import align_up
from tierd.mempool.pool import MemPool, PoolError, Region
from tierd.tiers.fileio import pwrite_all

log = logging.getLogger("tierd.placement")

MEM = "mem"
#: bytes per paced batch when moving a file into the pool (far-memory emulation)
MOVE_BATCH = 64 << 20


@dataclass(slots=True)
class MemCopy:
    ino: int
    version: int
    size: int
    region: Region


class MemTier:
    """The copies, their LRU order and the pool's reclaim hook."""

    def __init__(self, pool: MemPool, max_share: float = 0.5) -> None:
        self.pool = pool
        self.max_share = max_share
        self.copies: OrderedDict[int, MemCopy] = OrderedDict()
        self.used = 0
        # bumped by every drop of an inode: an admission that started before is stale
        self._gen: Counter[int] = Counter()
        self._admitting: dict[int, asyncio.Task[bool]] = {}
        self.stats = Counter[str]()
        pool.reclaimers.append(self.reclaim)

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    def close(self) -> None:
        """Detach from the pool and free every copy (the daemon's shutdown)."""
        with contextlib.suppress(ValueError):
            self.pool.reclaimers.remove(self.reclaim)
        for t in self._admitting.values():
            t.cancel()
        for ino in list(self.copies):
            self.drop(ino)

    # -- lookups -------------------------------------------------------------------------
    def get(self, ino: int, version: int | None = None) -> MemCopy | None:
        c = self.copies.get(ino)
        if c is None or (version is not None and c.version != version):
            return None
        return c

    def read(self, ino: int, offset: int, length: int) -> bytes | None:
        """The bytes of ``[offset, offset+length)`` from the file's copy (short at its end),
        or None without one.  Runs on the loop: the region's pages are allocated memory,
        a ``pread`` of them is a copy, never a wait."""
        c = self.copies.get(ino)
        if c is None:
            return None
        self.copies.move_to_end(ino)
        n = max(0, min(c.size, offset + length) - offset)
        data = os.pread(c.region.fd, n, offset) if n else b""
        self.stats["hits"] += 1
        self.stats["read_bytes"] += len(data)
        return data

    def copy_out(self, ino: int, version: int, dst_fd: int, offset: int, n: int) -> None:
        """Write ``n`` bytes at ``offset`` of the copy into ``dst_fd`` at the same offset
        (refilling hot; call in a thread).  OSError when the copy is gone."""
        c = self.get(ino, version)
        if c is None:
            raise FileNotFoundError(f"inode {ino} has no memory copy of version {version}")
        fd = os.dup(c.region.fd)  # an admin may free the region meanwhile
        try:
            with mmap.mmap(fd, c.size, prot=mmap.PROT_READ) as m:
                view = memoryview(m)
                try:
                    pwrite_all(dst_fd, view[offset:offset + n], offset)
                finally:
                    view.release()
        finally:
            os.close(fd)
        self.stats["copied_out_bytes"] += n

    # -- changes -------------------------------------------------------------------------
    def drop(self, ino: int) -> None:
        """The file's content changed or it is gone: free its copy (and make a copy being
        made now be thrown away when it is done)."""
        self._gen[ino] += 1
        c = self.copies.pop(ino, None)
        if c is not None:
            self._free(c)

    def _free(self, c: MemCopy) -> None:
        c.region.on_free = None
        self.used -= align_up(c.region.size)
        with contextlib.suppress(PoolError):
            self.pool.free(c.region.id)

    def _freed(self, ino: int, region: Region) -> None:
        """A region of ours was freed by someone else (an admin, the pool's close)."""
        c = self.copies.get(ino)
        if c is not None and c.region is region:
            del self.copies[ino]
            self.used -= align_up(region.size)
            self.stats["freed_by_pool"] += 1

    def reclaim(self, tenant: int, need: int) -> None:
        """The pool is about to refuse ``need`` bytes to ``tenant``: give back copies, least
        recently used first — the tenant's own while it is over its quota, then any while
        no extent is large enough."""
        pool = self.pool
        mine = sum(align_up(c.region.size) for c in self.copies.values()
                   if c.region.tenant == tenant)
        if (pool.used_by(tenant) - mine + need > pool.quota_of(tenant)
                or need > pool.extents.free + self.used):
            return  # hopeless: evicting would empty the cache and still not make room
        for c in list(self.copies.values()):
            if pool.used_by(tenant) + need <= pool.quota_of(tenant):
                break
            if c.region.tenant == tenant:
                self._evict(c)
        for c in list(self.copies.values()):
            if pool.extents.largest >= need:
                break
            self._evict(c)

    def _evict(self, c: MemCopy) -> None:
        del self.copies[c.ino]
        self._free(c)
        self.stats["evicted"] += 1
        self.stats["evicted_bytes"] += c.size

    # -- admission -----------------------------------------------------------------------
    def start_admit(self, ino: int, admit: Callable[[], Coroutine[Any, Any, bool]]
                    ) -> asyncio.Task[bool]:
        """Run ``admit()`` once per inode at a time (concurrent callers share it)."""
        running = self._admitting.get(ino)
        if running is not None:
            return running
        t = asyncio.create_task(admit())
        self._admitting[ino] = t
        t.add_done_callback(lambda _t: self._admitting.pop(ino, None))
        t.add_done_callback(_quiet)
        return t

    async def admit(self, ino: int, version: int, size: int, tenant: int, src_fd: int,
                    current: Callable[[], bool]) -> bool:
        """Copy ``size`` bytes of ``src_fd`` (the hot file, whole) into a new region and make
        it the file's copy if the file is still at ``version`` afterwards (``current()``).
        False when the pool cannot hold it (spilled: the file stays on hot) or the file
        changed meanwhile."""
        have = self.get(ino, version)
        if have is not None:
            return True
        if size <= 0 or size > self.max_share * self.capacity:
            self.stats["spilled"] += 1
            return False
        gen = self._gen[ino]
        try:
            region = await self.pool.alloc_backed(tenant, size, name=f"{MEM}:{ino}",
                                                  persistent=True)
        except PoolError as e:
            self.stats["spilled"] += 1
            log.debug("memory tier: inode %d (%d bytes) stays on hot: %s", ino, size, e)
            return False
        fd = os.dup(region.fd)
        try:
            with mmap.mmap(fd, size) as m:
                view = memoryview(m)
                try:
                    await self.pool.far.move(
                        size, MOVE_BATCH,
                        lambda off, n: _read_exact(src_fd, view[off:off + n], off),
                        outbound=False)
                finally:
                    view.release()
        except BaseException:
            with contextlib.suppress(PoolError):
                self.pool.free(region.id)
            raise
        finally:
            os.close(fd)
        if region.id not in self.pool.regions:
            return False  # freed by an admin while it was being filled
        if self._gen[ino] != gen or not current():
            self.pool.free(region.id)
            self.stats["stale"] += 1
            return False
        old = self.copies.pop(ino, None)
        if old is not None:
            self._free(old)
        region.on_free = functools.partial(self._freed, ino)
        self.copies[ino] = MemCopy(ino, version, size, region)
        self.used += align_up(size)
        self.stats["admitted"] += 1
        self.stats["admitted_bytes"] += size
        return True

    def describe(self) -> dict[str, int]:
        return {"used": self.used, "capacity": self.capacity, "files": len(self.copies),
                **{k: v for k, v in sorted(self.stats.items())}}


def _read_exact(fd: int, buf: memoryview, offset: int) -> None:
    """Fill ``buf`` from ``fd`` at ``offset``; EIO-like error on a short file."""
    pos = 0
    while pos < len(buf):
        n = os.preadv(fd, [buf[pos:]], offset + pos)
        if n == 0:
            raise OSError(5, f"short read at {offset + pos}: the hot file ends early")
        pos += n


def _quiet(task: asyncio.Task[bool]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("memory tier: copying a file into the pool failed: %s",
                    task.exception())
