"""Operator actions on placement (admin API, ``tierctl``) and construction from settings.

Prefixes are ``bucket/key-prefix`` strings, matched against files' cold keys.  Walks visit
every inode (``iter_inodes``): fine for operator commands on namespaces of millions of files;
a directory-scoped walk is the obvious refinement.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from tierd.meta import STATE_CLEAN, MetaStore, PlacementPolicy
from tierd.placement import bitmap
from tierd.placement.engine import HOT, MODES, PlacementSettings
from tierd.placement.paths import file_keys
from tierd.placement.persister import Placement

if TYPE_CHECKING:
    from tierd.config import Config


async def placement_from_config(cfg: Config, meta: MetaStore) -> Placement:
    """The daemon's placement: cold from ``cold_url`` (default ``file://DATA_DIR/cold``),
    hot from ``hot_dir``; started (persister running, cold buckets imported)."""
    from tierd.tiers import local_tiers_from_config, object_tier_from_config

    cold = object_tier_from_config(cfg)
    hot, _warm = local_tiers_from_config(cfg)
    p = Placement(meta, cold, hot, PlacementSettings(
        dirty_limit=cfg.dirty_limit, import_ttl=float(cfg.import_ttl),
        persist_parallel=cfg.persist_parallel, hot_high=cfg.hot_high_watermark / 100,
        hot_low=min(cfg.hot_low_watermark, cfg.hot_high_watermark) / 100, umask=cfg.umask))
    await p.start()
    return p


def _matches(keys: list[str], prefix: str) -> bool:
    return any(k.startswith(prefix) for k in keys)


class PlacementOps:
    """What the admin endpoints do; each returns a JSON-able document."""

    def __init__(self, placement: Placement) -> None:
        self.p = placement

    def _files(self, prefix: str) -> list[tuple[int, int, list[str]]]:
        out = []
        with self.p.meta.snapshot() as tx:
            for inode in tx.iter_inodes():
                if inode.is_reg and inode.nlink > 0:
                    keys = file_keys(tx, inode.ino)
                    if _matches(keys, prefix):
                        out.append((inode.ino, inode.size, keys))
        return out

    def du(self, prefix: str) -> dict[str, Any]:
        files = hot = dirty = clean = 0
        total = 0
        with self.p.meta.snapshot() as tx:
            for inode in tx.iter_inodes():
                if not inode.is_reg or inode.nlink == 0:
                    continue
                if not _matches(file_keys(tx, inode.ino), prefix):
                    continue
                files += 1
                total += inode.size
                hot += sum(bitmap.block_bytes(inode.size, b)
                           for b in bitmap.present(inode.blocks.get(HOT), inode.size))
                if tx.queued(inode.ino) is not None and inode.state != STATE_CLEAN:
                    dirty += inode.size
                rec = tx.get_cold(inode.ino)
                if rec is not None and rec.version == inode.version:
                    clean += inode.size
        return {"prefix": prefix, "files": files, "bytes": total,
                "tiers": {"hot": hot, "cold": clean}, "dirty": dirty,
                "hot_used": self.p.used, "hot_capacity": self.p.capacity,
                "dirty_total": self.p.dirty_bytes, "dirty_limit": self.p.settings.dirty_limit}

    async def evict(self, prefix: str) -> dict[str, Any]:
        inos = {ino for ino, _, _ in self._files(prefix)}
        freed = await self.p.evict(1 << 62, only=lambda ino: ino in inos)
        return {"prefix": prefix, "evicted": freed}

    def policies(self) -> list[dict[str, Any]]:
        return [{"prefix": p.prefix, "mode": p.mode, "pin": p.pin, "tier": p.tier}
                for p in sorted(self.p.policies.values(), key=lambda p: p.prefix)]

    def set_policy(self, prefix: str, *, mode: str | None = None, pin: bool | None = None,
                   tier: str | None = None) -> dict[str, Any]:
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if tier is not None and tier not in ("hot",):
            raise ValueError("only the hot tier is supported as a target yet")
        with self.p.meta.write() as tx:
            cur = tx.get_policy(prefix) or PlacementPolicy(prefix)
            if mode is not None:
                cur.mode = mode
            if pin is not None:
                cur.pin = pin
            if tier is not None:
                cur.tier = tier
            if cur == PlacementPolicy(prefix):
                tx.delete_policy(prefix)
                self.p.policies.pop(prefix, None)
            else:
                tx.put_policy(cur)
                self.p.policies[prefix] = cur
        return {"prefix": prefix, "mode": cur.mode, "pin": cur.pin, "tier": cur.tier}

    async def warmup(self, prefix: str) -> AsyncIterator[dict[str, Any]]:
        """Fetch every block under ``prefix`` onto hot; yields progress documents."""
        await self.import_prefix(prefix)
        files = self._files(prefix)
        total = sum(size for _, size, _ in files)
        done, t0 = 0, time.monotonic()
        yield {"done": 0, "total": total, "files": len(files)}
        for ino, size, _ in files:
            await self.p.ensure(ino, 0, size, touch=False)
            done += size
            yield {"done": done, "total": total, "files": len(files),
                   "bytes_per_s": done / max(time.monotonic() - t0, 1e-6)}

    async def persist_wait(self, prefix: str, timeout: float | None) -> dict[str, Any]:
        ok = await self.p.drain(prefix, timeout)
        return {"prefix": prefix, "persisted": ok}

    async def import_prefix(self, prefix: str) -> dict[str, Any]:
        n = await self.p.importer.import_prefix(prefix)
        return {"prefix": prefix, "imported": n}
