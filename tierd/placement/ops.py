"""Operator actions on placement (admin API, ``tierctl``) and construction from settings.

Prefixes are ``bucket/key-prefix`` strings, matched against files' cold keys.  Every command
walks only the prefix's subtree (:func:`~tierd.placement.paths.files_under`: lookups down
to the last segment, a range scan of its directory, a walk of what matches).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from tierd.meta import STATE_CLEAN, MetaStore, PlacementPolicy
from tierd.placement import bitmap
from tierd.placement.engine import HOT, MODES, POLICY_TIERS, WARM, PlacementSettings
from tierd.placement.memtier import MEM
from tierd.placement.paths import file_keys, files_under, keys_policy
from tierd.placement.placement import Placement

if TYPE_CHECKING:
    from tierd.config import Config


async def placement_from_config(cfg: Config, meta: MetaStore) -> Placement:
    """The daemon's placement: cold from ``cold_url`` (default ``file://DATA_DIR/cold``),
    hot from ``hot_dir``, warm from ``warm_dir`` when ``warm_enabled``; started (persister
    running, cold buckets imported)."""
    from tierd.tiers import local_tiers_from_config, object_tier_from_config

    cold = object_tier_from_config(cfg)
    hot, warm = local_tiers_from_config(cfg)
    p = Placement(meta, cold, hot, PlacementSettings(
        dirty_limit=cfg.dirty_limit, import_ttl=float(cfg.import_ttl),
        persist_parallel=cfg.persist_parallel, hot_high=cfg.hot_high_watermark / 100,
        hot_low=min(cfg.hot_low_watermark, cfg.hot_high_watermark) / 100,
        warm_high=cfg.warm_high_watermark / 100,
        warm_low=min(cfg.warm_low_watermark, cfg.warm_high_watermark) / 100,
        persist_delay=cfg.persist_delay,
        probe_interval=cfg.cold_probe_interval),
        warm=warm if cfg.warm_enabled else None)
    await p.start()
    return p


def _bytes(bm: bytes | None, size: int) -> int:
    return sum(bitmap.block_bytes(size, b) for b in bitmap.present(bm, size))


class PlacementOps:
    """What the admin endpoints do; each returns a JSON-able document."""

    def __init__(self, placement: Placement) -> None:
        self.p = placement

    def check_tier(self, tier: str) -> None:
        """ValueError unless ``tier`` names a tier files can be brought onto here."""
        if tier == MEM:
            if self.p.mem is None:
                raise ValueError("no memory pool is attached (the daemon's pool_capacity)")
            return
        self.p.cache_of(tier)  # ValueError for an unknown or missing tier

    def _files(self, prefix: str) -> list[tuple[int, int, list[str]]]:
        with self.p.meta.snapshot() as tx:
            return [(f.ino, f.size, file_keys(tx, f.ino))
                    for f in files_under(tx, prefix, versions=True)]

    def du(self, prefix: str) -> dict[str, Any]:
        """Bytes under ``prefix`` per tier (hot, warm, cold at the current version) and
        dirty, plus each tier's totals."""
        files = total = dirty = clean = 0
        tiers = {MEM: 0, HOT: 0, WARM: 0}
        mem = self.p.mem
        with self.p.meta.snapshot() as tx:
            for inode in files_under(tx, prefix):
                files += 1
                total += inode.size
                if mem is not None and mem.get(inode.ino, inode.version) is not None:
                    tiers[MEM] += inode.size
                tiers[HOT] += _bytes(inode.blocks.get(HOT), inode.size)
                tiers[WARM] += _bytes(inode.blocks.get(WARM, b""), inode.size)
                if tx.queued(inode.ino) is not None and inode.state != STATE_CLEAN:
                    dirty += inode.size
                rec = tx.get_cold(inode.ino)
                if rec is not None and rec.version == inode.version:
                    clean += inode.size
        doc: dict[str, Any] = {
            "prefix": prefix, "files": files, "bytes": total,
            "tiers": {**tiers, "cold": clean}, "dirty": dirty,
            "hot_used": self.p.used, "hot_capacity": self.p.capacity,
            "dirty_total": self.p.dirty_bytes, "dirty_limit": self.p.settings.dirty_limit}
        doc["totals"] = {tc.name: {"used": tc.used, "capacity": tc.capacity}
                         for tc in self.p.tiers()}
        if mem is not None:
            doc["totals"][MEM] = {"used": mem.used, "capacity": mem.capacity}
        return doc

    async def evict(self, prefix: str, tier: str = "all") -> dict[str, Any]:
        """Evict the prefix's clean blocks: from hot (``tier="hot"``: demoted to warm when
        there is one), from warm, or from every local tier (``all``: dropped, cold has
        them).  Pinned, dirty and in-use files stay.  ``mem`` (and ``all``) drop memory-tier
        copies, which are never the only copy."""
        if tier not in (*POLICY_TIERS, "all"):
            raise ValueError("tier must be mem, hot, warm or all")
        freed = {MEM: 0, HOT: 0, WARM: 0}
        for ino, _, _ in self._files(prefix):
            await self.evict_one(ino, tier, freed)
        return {"prefix": prefix, "evicted": sum(freed.values()), "tiers": freed}

    async def evict_one(self, ino: int, tier: str, freed: dict[str, int]) -> None:
        """One file of :meth:`evict` (the admin API's evict jobs go file by file), adding
        the bytes it freed per tier to ``freed``."""
        if tier in (MEM, "all") and self.p.mem is not None:
            c = self.p.mem.get(ino)
            if c is not None:
                freed[MEM] += c.size
                self.p.mem.drop(ino)
        if tier == MEM:
            return
        if tier in (HOT, "all"):
            freed[HOT] += await self.p.evict_file(ino, HOT, demote=tier == HOT)
        if tier in (WARM, "all") and self.p.warmc is not None:
            freed[WARM] += await self.p.evict_file(ino, WARM)

    def policies(self) -> list[dict[str, Any]]:
        return [{"prefix": p.prefix, "mode": p.mode, "pin": p.pin, "tier": p.tier}
                for p in sorted(self.p.policies.values(), key=lambda p: p.prefix)]

    async def set_policy(self, prefix: str, *, mode: str | None = None,
                         pin: bool | None = None, tier: str | None = None) -> dict[str, Any]:
        """Set (or, equal to the default, drop) the policy of ``prefix`` (``awrite``: the
        loop does not wait for the cluster's writers' lock).  It takes effect here once
        committed: memory files it no longer places in memory are dropped from there."""
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if tier is not None:
            if tier not in POLICY_TIERS:
                raise ValueError("tier must be mem, hot or warm")
            self.check_tier(tier)
        async with self.p.meta.awrite() as tx:
            cur = tx.get_policy(prefix) or PlacementPolicy(prefix)
            if mode is not None:
                cur.mode = mode
            if pin is not None:
                cur.pin = pin
            if tier is not None:
                cur.tier = tier
            if cur == PlacementPolicy(prefix):
                tx.delete_policy(prefix)
            else:
                tx.put_policy(cur)
        if cur == PlacementPolicy(prefix):
            self.p.policies.pop(prefix, None)
        else:
            self.p.policies[prefix] = cur
        self.p.policies_changed()
        if self.p.mem is not None and cur.tier != MEM:
            for ino, _, keys in self._files(prefix):
                policy = keys_policy(keys, self.p.policy_for)
                if policy is not None and policy.tier != MEM:
                    self.p.mem.drop(ino)
        return {"prefix": prefix, "mode": cur.mode, "pin": cur.pin, "tier": cur.tier}

    async def warmup(self, prefix: str, tier: str | None = None
                     ) -> AsyncIterator[dict[str, Any]]:
        """Bring every block under ``prefix`` onto ``tier`` (default: each file's policy
        tier, hot unless the policy names warm); yields progress documents."""
        if tier is not None:
            self.check_tier(tier)
        await self.import_prefix(prefix)
        files = self._files(prefix)
        total = sum(size for _, size, _ in files)
        done, t0 = 0, time.monotonic()
        copied: dict[str, int] = {}  # bytes per tier they actually went to (mem spills)
        yield {"done": 0, "total": total, "files": len(files), "copied": copied}
        for ino, size, keys in files:
            target = tier or (self.p.policy_for(keys[0]).tier if keys else HOT)
            if target == WARM and self.p.warmc is None:
                target = HOT
            if target == MEM:
                if self.p.mem is None or not await self.p.admit_mem(ino, force=True):
                    target = HOT  # spilled (or no pool): the file stays on hot
                    await self.p.fill(ino, HOT)
            else:
                await self.p.fill(ino, target)
            done += size
            copied[target] = copied.get(target, 0) + size
            yield {"done": done, "total": total, "files": len(files), "tier": target,
                   "copied": copied, "bytes_per_s": done / max(time.monotonic() - t0, 1e-6)}

    async def persist_wait(self, prefix: str, timeout: float | None) -> dict[str, Any]:
        ok = await self.p.drain(prefix, timeout)
        doc: dict[str, Any] = {"prefix": prefix, "persisted": ok}
        bad = self.p.unpersistable_under(prefix)
        if bad:
            doc["unpersistable"] = bad  # files the cold store cannot take, with the error
        if not ok and self.p.stranded:  # files only a dead node of the cluster holds
            doc["stranded"] = [s.describe() for _, s in sorted(self.p.stranded.items())]
        return doc

    async def import_prefix(self, prefix: str) -> dict[str, Any]:
        n = await self.p.importer.import_prefix(prefix)
        await self.p.forget_dropped()
        return {"prefix": prefix, "imported": n}
