"""Eviction and demotion: making room on a local tier.

Hot evicts by **demoting** clean blocks to warm (when there is a warm tier and it has room
for them), warm evicts by dropping (cold has every clean block).  Only blocks of CLEAN files
whose cold record is at the current version leave a tier, and never blocks of a file that is
held by a reader, being filled, open with unflushed writes, or under a pinned prefix.  Order:
each tier's 2Q (``cache.py``).

The metadata bit of a block is cleared first (one transaction, right after the
evictability check, with no await in between: a reader either holds the inode or sees the
block missing), then the block is copied down (demotion) and punched.  A fill of the same
tier and inode waits for the punch (``_evicting``), so a punch can never erase fresh data.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tierd.meta import STATE_CLEAN, MetaTxn
from tierd.placement import bitmap
from tierd.placement.engine import HOT, WARM, PlacementCore
from tierd.placement.paths import file_keys
from tierd.placement.tiercache import TierCache
from tierd.tiers import BLOCK_SIZE

log = logging.getLogger("tierd.placement")


class Evicting(PlacementCore):
    """Adds :meth:`make_room`, :meth:`evict`, :meth:`evict_file` and :meth:`demote_file`."""

    def cache_of(self, tier: str) -> TierCache:
        if tier == HOT:
            return self.hotc
        if tier == WARM and self.warmc is not None:
            return self.warmc
        raise ValueError("no warm tier is configured (warm_enabled)" if tier == WARM
                         else f"unknown tier {tier!r} (hot or warm)")

    async def make_room(self, tc: TierCache, nbytes: int) -> None:
        """Before ``nbytes`` land on ``tc``: above the high watermark, evict down to the low
        one (in one batch)."""
        need = tc.to_free(nbytes)
        if need > 0:
            await self.evict(need, tier=tc.name)

    def _pinned(self, tx: MetaTxn, ino: int) -> bool:
        if not any(p.pin for p in self.policies.values()):
            return False
        return any(self.policy_for(k).pin for k in file_keys(tx, ino))

    def _evictable(self, tx: MetaTxn, ino: int, *, pinned_ok: bool = False) -> bool:
        if self._holds.get(ino) or self._filling.get(ino) or self.busy(ino):
            return False
        inode = tx.get_inode(ino)
        rec = tx.get_cold(ino)
        if inode is None or rec is None or inode.state != STATE_CLEAN:
            return False
        return rec.version == inode.version and (pinned_ok or not self._pinned(tx, ino))

    async def evict(self, nbytes: int, only: Callable[[int], bool] | None = None,
                    tier: str = HOT) -> int:
        """Free ``nbytes`` of ``tier`` in policy order (hot demotes to warm, warm drops);
        returns the bytes freed.  Only blocks cold holds at the current version leave."""
        tc = self.cache_of(tier)
        freed = 0
        plan: dict[int, list[int]] = {}
        verdict: dict[int, bool] = {}
        with self.meta.snapshot() as tx:
            for ino, b in tc.order.victims():
                if freed >= nbytes:
                    break
                if only is not None and not only(ino):
                    continue
                ok = verdict.get(ino)
                if ok is None:
                    ok = verdict[ino] = self._evictable(tx, ino)
                if ok:
                    plan.setdefault(ino, []).append(b)
                    freed += BLOCK_SIZE
        done = 0
        for ino, blocks in plan.items():
            done += await self.evict_blocks(tc, ino, blocks)
        return done

    async def evict_file(self, ino: int, tier: str, *, demote: bool = True) -> int:
        """Every block of one file off ``tier`` (``evict PREFIX``); hot blocks go down to
        warm when ``demote`` and there is a warm tier."""
        tc = self.cache_of(tier)
        with self.meta.snapshot() as tx:
            inode = tx.get_inode(ino)
        if inode is None or not inode.is_reg:
            return 0
        bm = inode.blocks.get(tier)
        if bm is None and tier == WARM:
            return 0
        blocks = bitmap.present(bm, inode.size)
        return await self.evict_blocks(tc, ino, blocks, demote=demote) if blocks else 0

    async def demote_file(self, ino: int) -> int:
        """The file's policy names warm as its tier: move its hot blocks there (after
        persistence; a pin does not stop this, the pin is on the warm tier)."""
        if self.warmc is None:
            return 0
        with self.meta.snapshot() as tx:
            inode = tx.get_inode(ino)
        if inode is None or not inode.is_reg:
            return 0
        blocks = bitmap.present(inode.blocks.get(HOT), inode.size)
        if not blocks:
            return 0
        return await self.evict_blocks(self.hotc, ino, blocks, pinned_ok=True)

    async def evict_blocks(self, tc: TierCache, ino: int, blocks: list[int], *,
                           demote: bool = True, pinned_ok: bool = False) -> int:
        """Take ``blocks`` of ``ino`` off tier ``tc``; returns the bytes freed there."""
        with self.meta.write() as tx:
            if not self._evictable(tx, ino, pinned_ok=pinned_ok):
                return 0
            inode = tx.get_inode(ino)
            assert inode is not None
            bm = inode.blocks.get(tc.name)
            if bm is None:
                bm = bitmap.full(inode.size) if tc is self.hotc else b""
            blocks = [b for b in blocks if bitmap.has(bm, b)]
            if not blocks:
                return 0
            inode.blocks[tc.name] = bitmap.with_bits(bm, blocks, False)
            tx.put_inode(inode)
            warm_bm = inode.blocks.get(WARM, b"")
        if tc is self.hotc:
            self._whole.discard(ino)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._evicting[(tc.name, ino)] = done
        try:
            if tc is self.hotc and demote and self.warmc is not None:
                try:
                    await self._demote(ino, [b for b in blocks if not bitmap.has(warm_bm, b)],
                                       inode.version, inode.size)
                except Exception as e:  # demotion is an optimisation: cold has the blocks
                    log.warning("demoting inode %d failed (%s): dropped instead", ino, e)
            await tc.tier.evict_blocks(ino, blocks)
        finally:
            done.set_result(None)
            if self._evicting.get((tc.name, ino)) is done:
                del self._evicting[(tc.name, ino)]
        n = sum(bitmap.block_bytes(inode.size, b) for b in blocks)
        tc.add_bytes(ino, -n)
        for b in blocks:
            tc.removed(ino, b)
        self.stats[f"evicted_{tc.name}_bytes"] += n
        if tc is self.hotc:
            self.stats["evicted_bytes"] += n
        return n

    async def _demote(self, ino: int, blocks: list[int], version: int, size: int) -> None:
        """Copy hot blocks (still there: the punch comes after) to warm and record them.
        A warm tier that cannot take them (full of pinned data, a disk error) just means
        they are dropped: cold has them."""
        assert self.warm is not None and self.warmc is not None
        n = sum(bitmap.block_bytes(size, b) for b in blocks)
        if n == 0:
            return
        await self.make_room(self.warmc, n)
        if not self.warmc.fits(n):
            self.stats["demote_skipped_bytes"] += n
            return
        for start, count in bitmap.runs(blocks):
            off = start * BLOCK_SIZE
            await self.warm.copy_from(self.hot, ino, off,
                                      min(size, off + count * BLOCK_SIZE) - off)
        with self.meta.write() as tx:
            inode = tx.get_inode(ino)
            if inode is None or inode.version != version:
                return  # changed meanwhile: the warm copy is stale, no bit records it
            inode.blocks[WARM] = bitmap.with_bits(inode.blocks.get(WARM, b""), blocks, True)
            tx.put_inode(inode)
        self.warmc.add_bytes(ino, n)
        for b in blocks:
            self.warmc.add(ino, b)
        self.stats["demoted_bytes"] += n
