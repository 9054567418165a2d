"""The memory pool: regions of shared memory, tenants, quotas and far-memory emulation.

A region is a sealed memfd (it can neither grow nor shrink once handed out, so a tenant
cannot exceed its quota by ``ftruncate``) whose pages are allocated up front with
``fallocate``: the pool's capacity is real memory, not an overcommit that would end in a
SIGBUS half-way through a checkpoint.  Isolation comes from the descriptor itself: only
the daemon holds every region's fd and hands one to its owner alone (:mod:`.server`).

Tenants are uids (the peer credentials of the unix socket).  ``quota`` maps a tenant to
its byte limit; a tenant without an entry gets ``default_quota`` (0: the whole pool).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tierd.mempool.extents import Extents, align_up

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class PoolError(OSError):
    """A refused pool request; ``errno`` says which kind (EDQUOT, ENOSPC, EACCES, ENOENT)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)


@dataclass
class Region:
    id: int
    tenant: int
    size: int
    offset: int
    fd: int
    name: str = ""
    #: survives its owner's connection (committed checkpoints, regions asked so)
    persistent: bool = False
    #: the connection that allocated it (freed with it unless persistent); 0: the daemon
    conn: int = 0
    created: float = field(default_factory=time.time)
    #: called once the region is freed (by anyone: its owner, an admin, the pool's close),
    #: so a daemon-side user of the region (the memory tier) forgets it
    on_free: Callable[[Region], None] | None = field(default=None, repr=False)

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "tenant": self.tenant, "size": self.size,
                "offset": self.offset, "name": self.name, "persistent": self.persistent,
                "created": self.created}


@dataclass
class FarMemory:
    """Emulated CXL-attached memory: a latency per access batch and a bandwidth cap on the
    daemon's moves in and out of the pool (0 = off).  Clients' loads and stores through
    their own mappings are not slowed: only page-table tricks could do that."""

    latency_us: float = 0.0
    bandwidth: int = 0  # bytes/s
    moved_in: int = 0
    moved_out: int = 0

    async def move(self, total: int, batch: int, copy: Callable[[int, int], None],
                   outbound: bool = True) -> None:
        """Run ``copy(offset, length)`` over ``total`` bytes in batches (each in a thread),
        paying the latency per batch and pacing to the bandwidth."""
        start = time.monotonic()
        off = 0
        while off < total:
            n = min(batch, total - off)
            await asyncio.to_thread(copy, off, n)
            off += n
            if outbound:
                self.moved_out += n
            else:
                self.moved_in += n
            wait = self.latency_us / 1e6
            if self.bandwidth:
                wait = max(wait, start + off / self.bandwidth - time.monotonic())
            if wait > 0:
                await asyncio.sleep(wait)


class MemPool:
    def __init__(self, capacity: int, default_quota: int = 0,
                 far: FarMemory | None = None) -> None:
        self.extents = Extents(capacity)
        self.capacity = self.extents.capacity
        self.default_quota = default_quota
        self.quotas: dict[int, int] = {}
        self.far = far or FarMemory()
        self.regions: dict[int, Region] = {}
        self._next_id = 1
        #: called as ``reclaim(tenant, bytes)`` before an allocation is refused: cache
        #: users of the pool (the memory tier) give regions back so that checkpoints and
        #: clients, which hold the only copy of their bytes, come first
        self.reclaimers: list[Callable[[int, int], None]] = []
        #: asked after ``reclaimers``: checkpoints' pool copies of steps durable on hot
        #: (they also serve restores and the run's next save, so they go last)
        self.late_reclaimers: list[Callable[[int, int], None]] = []

    # -- accounting --------------------------------------------------------------------
    def quota_of(self, tenant: int) -> int:
        q = self.quotas.get(tenant, self.default_quota)
        return q if q > 0 else self.capacity

    def quota_limited(self, tenant: int) -> bool:
        """Whether the tenant's quota, not the pool's size, is what bounds it."""
        return self.quota_of(tenant) < self.capacity

    def used_by(self, tenant: int) -> int:
        return sum(align_up(r.size) for r in self.regions.values() if r.tenant == tenant)

    @property
    def used(self) -> int:
        return self.capacity - self.extents.free

    def check_room(self, tenant: int, size: int) -> None:
        """Raise the error an allocation of ``size`` would get, before anyone copies.
        Reclaimable cache regions are given back first."""
        err = self._room_error(tenant, size)
        for reclaim in [*self.reclaimers, *self.late_reclaimers]:
            if err is None or err.errno == errno.EINVAL:
                break
            reclaim(tenant, align_up(size))
            err = self._room_error(tenant, size)
        if err is not None:
            raise err

    def _room_error(self, tenant: int, size: int) -> PoolError | None:
        """EDQUOT when the tenant's own quota is what is exceeded, ENOSPC ("pool full")
        when the pool has no extent for it -- a tenant without a quota of its own (its
        limit is the whole pool) that finds the pool full is told so, not that a quota was
        exceeded."""
        if size <= 0:
            return PoolError(errno.EINVAL, f"region size must be positive, not {size}")
        need = align_up(size)
        used, quota = self.used_by(tenant), self.quota_of(tenant)
        if self.quota_limited(tenant) and used + need > quota:
            return PoolError(errno.EDQUOT, f"pool quota exceeded for tenant {tenant}: "
                             f"{used} bytes used + {need} asked > quota {quota}")
        if not self.extents.fits(size):
            return PoolError(errno.ENOSPC, f"memory pool full: {need} bytes asked, "
                             f"{self.extents.free} free (largest extent "
                             f"{self.extents.largest}) of {self.capacity}; tenant {tenant} "
                             f"holds {used}")
        return None

    # -- regions -----------------------------------------------------------------------
    def alloc(self, tenant: int, size: int, *, name: str = "", persistent: bool = False,
              conn: int = 0) -> Region:
        """A new region (its pages not yet allocated: see :meth:`alloc_backed`)."""
        self.check_room(tenant, size)
        offset = self.extents.alloc(size)
        assert offset is not None  # check_room saw an extent this large
        rid = self._next_id
        self._next_id += 1
        try:
            fd = os.memfd_create(f"tierd-region-{rid}",
                                 os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as e:
            self.extents.release(offset, size)
            if e.errno in (errno.EMFILE, errno.ENFILE):  # one descriptor per region
                raise PoolError(errno.ENOSPC, f"memory pool full: no descriptor left for "
                                f"another region ({len(self.regions)} regions)") from None
            raise
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        except OSError:
            os.close(fd)
            self.extents.release(offset, size)
            raise
        r = Region(rid, tenant, size, offset, fd, name, persistent, conn)
        self.regions[rid] = r
        return r

    async def alloc_backed(self, tenant: int, size: int, **kw: Any) -> Region:
        """:meth:`alloc` and its pages allocated now (in a thread), so a pool that cannot
        back the region fails here, not with a SIGBUS in the middle of a client's copy."""
        r = self.alloc(tenant, size, **kw)
        try:
            await asyncio.to_thread(os.posix_fallocate, r.fd, 0, r.size)
        except OSError as e:
            self.free(r.id)
            raise PoolError(errno.ENOMEM, f"cannot back region {r.id} with {r.size} bytes "
                            f"of memory: {e.strerror}") from None
        return r

    def get(self, rid: int, tenant: int | None = None) -> Region:
        """Region ``rid``; with ``tenant``, only if that tenant owns it."""
        r = self.regions.get(rid)
        if r is None:
            raise PoolError(errno.ENOENT, f"no pool region {rid}")
        if tenant is not None and r.tenant != tenant and tenant != 0:
            raise PoolError(errno.EACCES, f"pool region {rid} belongs to another tenant")
        return r

    def free(self, rid: int, tenant: int | None = None) -> Region:
        r = self.get(rid, tenant)
        del self.regions[rid]
        os.close(r.fd)
        self.extents.release(r.offset, r.size)
        if r.on_free is not None:
            r.on_free(r)
        return r

    def connection_closed(self, conn: int) -> list[int]:
        """Free what connection ``conn`` allocated and did not make persistent."""
        gone = [r.id for r in self.regions.values() if r.conn == conn and not r.persistent]
        for rid in gone:
            self.free(rid)
        return gone

    def close(self) -> None:
        for rid in list(self.regions):
            self.free(rid)

    def stats(self) -> dict[str, Any]:
        tenants: dict[int, dict[str, int]] = {}
        for r in self.regions.values():
            t = tenants.setdefault(r.tenant, {"used": 0, "regions": 0})
            t["used"] += align_up(r.size)
            t["regions"] += 1
        for t_id in self.quotas:
            tenants.setdefault(t_id, {"used": 0, "regions": 0})
        for t_id, t in tenants.items():
            t["quota"] = self.quota_of(t_id)
        return {
            "capacity": self.capacity,
            "used": self.used,
            "free": self.extents.free,
            "largest_free": self.extents.largest,
            "default_quota": self.default_quota,
            "fragmentation": round(self.extents.fragmentation(), 4),
            "regions": len(self.regions),
            "tenants": {str(k): v for k, v in sorted(tenants.items())},
            "bytes_moved_in": self.far.moved_in,
            "bytes_moved_out": self.far.moved_out,
            "latency_us": self.far.latency_us,
            "bandwidth": self.far.bandwidth,
        }
