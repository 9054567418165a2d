"""Eviction and demotion: making room on a local tier.

Hot evicts by **demoting** clean blocks to warm (when there is a warm tier and it has room
for them), warm evicts by dropping (cold has every clean block).  Only blocks of CLEAN files
whose cold record is at the current version leave a tier, and never blocks of a file that is
held by a reader, being filled, open with unflushed writes, or under a pinned prefix.  Order:
each tier's 2Q (``cache.py``).

The metadata bit of a block is cleared first (one transaction, right after the
evictability check, with no await in between: a reader either holds the inode or sees the
block missing), then the block is copied down (demotion), the cleared bits are made durable
(one metadata flush for a whole batch: a crash must never find a bit naming a punched
block, which would read as zeros), and only then is the block punched.  A fill of the same
tier and inode waits for the punch (``_evicting``), so a punch can never erase fresh data.

**The write path** (S3 staging, parts, copies, FUSE writes) calls :meth:`room_for_write`:
before a write it keeps the watermark rule and makes the file system itself hold the bytes
(the hot directory shares it with staging files and maybe the metadata); after a write
failed with ENOSPC it evicts a batch of clean data, and the caller retries once.  Nothing
clean to evict (all dirty or pinned): the caller answers ENOSPC (S3 507).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tierd.meta import STATE_CLEAN, Inode, MetaTxn
from tierd.placement import bitmap
from tierd.placement.engine import HOT, WARM, PlacementCore
from tierd.placement.paths import file_policy
from tierd.placement.tiercache import TierCache
from tierd.tiers import BLOCK_SIZE

log = logging.getLogger("tierd.placement")

#: the least one eviction after a failed write frees (at most 1/8 of the tier): a batch,
#: not a block per failed write
WRITE_BATCH = 16 << 20
#: free bytes the hot file system keeps beyond a write about to be made
WRITE_SLACK = 1 << 20
#: seconds between two log lines about writes the full hot tier refused
FULL_LOG_EVERY = 30.0


@dataclass
class _Unmarked:
    """Blocks of one inode whose bits were cleared, to be copied down and punched."""

    ino: int
    blocks: list[int]
    inode: Inode  # as it was when the bits were cleared
    warm_bm: bytes
    done: asyncio.Future[None]  # fills of (tier, ino) wait for it


class Evicting(PlacementCore):
    """Adds :meth:`make_room`, :meth:`room_for_write`, :meth:`evict`, :meth:`evict_file`
    and :meth:`demote_file`."""

    _full_logged = 0.0  # when room_for_write last logged a refusal

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

    async def room_for_write(self, nbytes: int, *, failed: bool = False) -> int:
        """Room on the hot file system for ``nbytes`` a write path is about to write, or
        (``failed``) just failed to write with ENOSPC; returns the bytes evicted.  After a
        failure 0 means nothing clean is left to evict: the caller answers ENOSPC."""
        tc = self.hotc
        want = tc.to_free(nbytes)
        if failed:
            want = max(want, 2 * nbytes, min(WRITE_BATCH, tc.capacity // 8))
        else:
            free = await asyncio.to_thread(self.hot.fs_free) if nbytes > WRITE_SLACK else (
                WRITE_SLACK + nbytes)  # (small writes: the watermark and ENOSPC suffice)
            want = max(want, nbytes + WRITE_SLACK - free)
        if want <= 0:
            return 0
        freed = await self.evict(want, tier=HOT)
        self.stats.write_evicted_bytes += freed
        if failed and not freed:
            self.stats.write_full_refusals += 1
            now = time.monotonic()
            if now - self._full_logged > FULL_LOG_EVERY:  # a writer may retry in a loop
                self._full_logged = now
                log.warning("hot tier full: a write of %d bytes found nothing clean to evict "
                            "(dirty data waits for the cold store, or is pinned); %d such "
                            "writes refused so far", nbytes,
                            self.stats.write_full_refusals)
        return freed

    def _pinned(self, tx: MetaTxn, ino: int) -> bool:
        if not any(p.pin for p in self.policies.values()):
            return False
        policy = file_policy(tx, ino, self.policy_for)
        return policy is not None and policy.pin

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
        async with self.meta.asnapshot() as tx:
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
        unmarked = []
        for ino, blocks in plan.items():
            if (u := await self._unmark(tc, ino, blocks)) is not None:
                unmarked.append(u)
        return await self._take_off(tc, unmarked, demote=True)

    async def evict_file(self, ino: int, tier: str, *, demote: bool = True) -> int:
        """Every block of one file off ``tier`` (``evict PREFIX``); hot blocks go down to
        warm when ``demote`` and there is a warm tier."""
        tc = self.cache_of(tier)
        async with self.meta.asnapshot() as tx:
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
        async with self.meta.asnapshot() as tx:
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
        u = await self._unmark(tc, ino, blocks, pinned_ok=pinned_ok)
        return await self._take_off(tc, [u], demote=demote) if u is not None else 0

    async def _unmark(self, tc: TierCache, ino: int, blocks: list[int], *,
                      pinned_ok: bool = False) -> _Unmarked | None:
        """Clear the bits of ``blocks`` (those still set) if the inode may leave ``tc``,
        and make fills of it on ``tc`` wait for the punch; None when nothing may go.  The
        fills wait from inside the transaction's body: over PostgreSQL others run while its
        commit is in flight, and a fill must not land under the punch."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = (tc.name, ino)
        try:
            async with self.meta.awrite() as tx:
                if not self._evictable(tx, ino, pinned_ok=pinned_ok):
                    return None
                inode = tx.get_inode(ino)
                assert inode is not None
                bm = inode.blocks.get(tc.name)
                if bm is None:
                    bm = bitmap.full(inode.size) if tc is self.hotc else b""
                blocks = [b for b in blocks if bitmap.has(bm, b)]
                if not blocks:
                    return None
                inode.blocks[tc.name] = bitmap.with_bits(bm, blocks, False)
                tx.put_inode(inode)
                warm_bm = inode.blocks.get(WARM, b"")
                if tc is self.hotc:
                    self._whole.discard(ino)
                self._evicting[key] = done
        except BaseException:
            if self._evicting.get(key) is done:  # the commit failed: nothing to wait for
                del self._evicting[key]
                done.set_result(None)
            raise
        return _Unmarked(ino, blocks, inode, warm_bm, done)

    async def _take_off(self, tc: TierCache, batch: list[_Unmarked], *, demote: bool) -> int:
        """Copy unmarked blocks down (hot to warm, when ``demote``), make the cleared bits
        durable, punch; returns the bytes freed.  When the metadata cannot be made durable
        (its store is full) nothing is punched: the bytes stay, unnamed, and a read
        fetches them again."""
        if not batch:
            return 0
        freed = 0
        try:
            if tc is self.hotc and demote and self.warmc is not None:
                for u in batch:
                    try:
                        await self._demote(u.ino, [b for b in u.blocks
                                                   if not bitmap.has(u.warm_bm, b)],
                                           u.inode.version, u.inode.size)
                    except Exception as e:  # an optimisation only: cold has the blocks
                        log.warning("demoting inode %d failed (%s): dropped instead",
                                    u.ino, e)
            try:
                await self.meta.flush()
                durable = True
            except OSError as e:
                log.warning("eviction from %s: the cleared block bits cannot be made "
                            "durable (%s): %d files keep their bytes", tc.name, e, len(batch))
                durable = False
            sizes = []
            for u in batch:  # the accounting follows the bits, punched or not
                sizes.append(sum(bitmap.block_bytes(u.inode.size, b) for b in u.blocks))
                tc.add_bytes(u.ino, -sizes[-1])
                for b in u.blocks:
                    tc.removed(u.ino, b)
            for u, n in zip(batch, sizes, strict=True):
                if durable:
                    await tc.tier.evict_blocks(u.ino, u.blocks)
                    freed += n
        finally:
            for u in batch:
                u.done.set_result(None)
                if self._evicting.get((tc.name, u.ino)) is u.done:
                    del self._evicting[(tc.name, u.ino)]
        self.stats.evicted_from[tc.name] += freed
        if tc is self.hotc:
            self.stats.evicted_bytes += freed
        return freed

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
            self.stats.demote_skipped_bytes += n
            return
        for start, count in bitmap.runs(blocks):
            off = start * BLOCK_SIZE
            await self.warm.copy_from(self.hot, ino, off,
                                      min(size, off + count * BLOCK_SIZE) - off)
        async with self.meta.awrite() as tx:
            inode = tx.get_inode(ino)
            if inode is None or inode.version != version:
                return  # changed meanwhile: the warm copy is stale, no bit records it
            inode.blocks[WARM] = bitmap.with_bits(inode.blocks.get(WARM, b""), blocks, True)
            tx.put_inode(inode)
        self.warmc.add_bytes(ino, n)
        for b in blocks:
            self.warmc.add(ino, b)
        self.stats.demoted_bytes += n
