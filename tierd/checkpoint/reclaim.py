"""Giving pool memory back: checkpoint regions whose bytes are durable elsewhere.

A run keeps its regions after its steps are written out: the newest step's pool copy makes
a restore zero-copy and the next save reuses the mapped region.  That is a cache, and a
pool full of finished runs' caches must not refuse the next run's save.  When the pool is
about to refuse an allocation it asks its reclaimers (after the memory tier's file copies,
:mod:`tierd.placement.memtier`); this one frees idle checkpoint regions, least recently
used run first, whose bytes are durable on hot (no step or part of them is still only in
the pool).  It never takes the region of the newest step of an **active** run (one that
has a client connected that saved to it): that run is about to save again into it.  When
the limit hit is a tenant's quota, only that tenant's regions are taken.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tierd.checkpoint.state import LOCAL, PERSISTED, Run
from tierd.logs import get_logger, kv
from tierd.mempool.extents import align_up
from tierd.mempool.pool import Region

if TYPE_CHECKING:
    from tierd.checkpoint.service import CheckpointService

log = get_logger("checkpoint")


class Reclaimer:
    def __init__(self, svc: CheckpointService) -> None:
        self.svc = svc
        self._spared: Run | None = None
        self.stats = Counter[str]()

    @contextlib.contextmanager
    def sparing(self, run: Run) -> Iterator[None]:
        """While ``run`` asks for room itself: it frees its own spare regions (and knows
        which step it is about to overwrite), so the reclaimer leaves it alone."""
        prev, self._spared = self._spared, run
        try:
            yield
        finally:
            self._spared = prev

    def candidates(self, tenant: int | None) -> list[tuple[Run, Region]]:
        """Idle regions with nothing only the pool holds, least recently used run first;
        within a run, regions of older steps first."""
        pool = self.svc.pool
        out: list[tuple[Run, Region]] = []
        for run in sorted(self.svc.runs.values(), key=lambda r: r.used_at):
            if run is self._spared:
                continue
            newest = self._newest(run)
            keep = newest if run.conns else set()
            regions = [r for r in run.regions
                       if r.id in pool.regions and id(r) not in keep
                       and not run.region_busy(r) and (tenant is None or r.tenant == tenant)]
            regions.sort(key=lambda r: id(r) in newest)
            out.extend((run, r) for r in regions)
        return out

    @staticmethod
    def _newest(run: Run) -> set[int]:
        done = [n for n, s in run.steps.items() if s.state in (LOCAL, PERSISTED)]
        if not done:
            return set()
        return {id(r) for r in run.steps[max(done)].regions()}

    def reclaim(self, tenant: int, need: int) -> None:
        """The pool is about to refuse ``need`` bytes to ``tenant``: free checkpoint regions
        until it would not (nothing, when freeing all candidates would not be enough)."""
        pool = self.svc.pool
        if pool.quota_limited(tenant) and pool.used_by(tenant) + need > pool.quota_of(tenant):
            mine = self.candidates(tenant)
            if pool.used_by(tenant) - sum(align_up(r.size) for _, r in mine) + need \
                    <= pool.quota_of(tenant):
                for run, r in mine:
                    if pool.used_by(tenant) + need <= pool.quota_of(tenant):
                        break
                    self._free(run, r, "quota")
        if not pool.extents.fits(need):
            every = self.candidates(None)
            if pool.extents.free + sum(align_up(r.size) for _, r in every) >= need:
                for run, r in every:
                    if pool.extents.fits(need):
                        break
                    self._free(run, r, "pool full")

    def _free(self, run: Run, r: Region, why: str) -> None:
        log.info("pool copy of a checkpoint reclaimed", extra=kv(
            run=f"{run.bucket}/{run.name}", region=r.id, size=r.size, why=why))
        self.svc.drop_region(run, r)
        self.stats["regions"] += 1
        self.stats["bytes"] += r.size
