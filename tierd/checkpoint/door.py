"""The memory door: the pool, its socket and the checkpoint service, started as one.

The daemon owns one :class:`MemoryDoor`; the admin API asks it for status, quotas and
forced frees.  Quotas are kept in the metadata store (``U<uid>`` records, through
:meth:`tierd.namespace.Namespace.set_pool_quota`) so they survive restarts; regions do not
(they are memory).

It lives here, above both :mod:`tierd.mempool` and the checkpoint service, because it starts
the two together: the pool below knows nothing of checkpoints.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierd.checkpoint.service import CheckpointService
from tierd.logs import get_logger, kv
from tierd.mempool.pool import FarMemory, MemPool, PoolError
from tierd.mempool.server import PoolServer

if TYPE_CHECKING:
    from tierd.config import Config
    from tierd.namespace.api import NamespaceAPI

log = get_logger("mempool")


class MemoryDoor:
    def __init__(self, ns: NamespaceAPI, *, capacity: int, socket_path: Path,
                 default_quota: int = 0, far: FarMemory | None = None, keep_local: int = 2,
                 keep_cold: int = 0, shared: bool = False) -> None:
        self.ns = ns
        self.pool = MemPool(capacity, default_quota, far)
        self.pool.quotas = ns.pool_quotas()
        if default_quota > self.pool.capacity:
            log.warning("pool_default_quota is larger than the pool: it limits nothing",
                        extra=kv(default_quota=default_quota, capacity=self.pool.capacity))
        for tenant, q in self.pool.quotas.items():
            if q > self.pool.capacity:
                log.warning("a tenant's pool quota is larger than the pool: it limits "
                            "nothing", extra=kv(tenant=tenant, quota=q,
                                                capacity=self.pool.capacity))
        self.server = PoolServer(socket_path, self.pool)
        self.ckpt = CheckpointService(ns, self.pool, keep_local=keep_local,
                                      keep_cold=keep_cold, shared=shared)
        self.ckpt.register(self.server)

    @classmethod
    def from_config(cls, ns: NamespaceAPI, cfg: Config) -> MemoryDoor:
        return cls(ns, capacity=cfg.pool_capacity, socket_path=cfg.pool_socket,
                   default_quota=cfg.pool_default_quota,
                   far=FarMemory(cfg.pool_latency_us, cfg.pool_bandwidth),
                   keep_local=cfg.ckpt_keep_local, keep_cold=cfg.ckpt_keep_cold,
                   shared=bool(cfg.node_name))

    async def start(self) -> None:
        parent = self.server.path.parent
        # /run/tierd (the shared location) is made here: 0755, traversable by every uid
        parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        # tenants of every uid must reach the socket; the directory is only made
        # traversable (o+x), its subdirectories keep their own 0700
        mode = os.stat(parent).st_mode & 0o7777
        if mode & 0o011 != 0o011:
            os.chmod(parent, mode | 0o011)
        await self.server.start()
        log.info("memory pool ready", extra=kv(socket=self.server.path,
                                               capacity=self.pool.capacity))

    async def stop(self) -> None:
        await self.server.close()
        await self.ckpt.close()
        self.pool.close()

    # -- admin ---------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        doc = self.pool.stats()
        doc["socket"] = str(self.server.path)
        doc["region_list"] = [r.describe() for r in self.pool.regions.values()]
        return doc

    async def set_quota(self, tenant: int, nbytes: int) -> dict[str, Any]:
        if tenant < 0 or nbytes < 0:
            raise ValueError("tenant and bytes must be non-negative")
        if nbytes > self.pool.capacity:
            # it would limit nothing, and its errors would say "quota" when the pool is full
            raise ValueError(f"a quota of {nbytes} bytes is larger than the pool "
                             f"({self.pool.capacity} bytes, pool_capacity): use at most that, "
                             "or 0 for the whole pool")
        await self.ns.set_pool_quota(tenant, nbytes)
        if nbytes == 0:
            self.pool.quotas.pop(tenant, None)
        else:
            self.pool.quotas[tenant] = nbytes
        return {"tenant": tenant, "quota": self.pool.quota_of(tenant),
                "used": self.pool.used_by(tenant)}

    def free_region(self, rid: int) -> dict[str, Any]:
        r = self.pool.get(rid)
        for run in self.ckpt.runs.values():
            if run.region_busy(r):
                raise PoolError(errno.EBUSY, f"pool region {rid} holds a checkpoint being "
                                "staged or written out")
            if r in run.regions:
                self.ckpt.drop_region(run, r)
        if rid in self.pool.regions:
            self.pool.free(rid)
        log.info("region freed by an admin", extra=kv(region=rid, tenant=r.tenant))
        return {"freed": rid, "tenant": r.tenant, "size": r.size}
