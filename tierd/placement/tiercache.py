"""In-memory bookkeeping of one local tier (hot or warm): bytes per inode, the running total
against the watermarks, and the replacement order of its blocks.

Everything here is rebuilt from the block bitmaps in metadata at start
(``PlacementCore.load_state``), so it is never persisted: the bitmaps are the record, this is
the index that makes eviction decisions O(blocks evicted) instead of a scan.
"""

from __future__ import annotations

from tierd.placement.cache import TwoQ
from tierd.tiers import BLOCK_SIZE, LocalTier


class TierCache:
    """One local tier and what placement knows about it."""

    def __init__(self, tier: LocalTier, high: float, low: float) -> None:
        self.tier = tier
        self.name = tier.name
        self.capacity = tier.capacity()
        self.high, self.low = high, min(low, high)
        self.order = TwoQ(max(1, self.capacity // BLOCK_SIZE))
        self.resident: dict[int, int] = {}  # ino -> bytes on this tier
        self.used = 0
        self._blocks_of: dict[int, set[int]] = {}  # ino -> blocks known to ``order``

    def set_resident(self, ino: int, n: int) -> None:
        self.used += n - self.resident.get(ino, 0)
        if n > 0:
            self.resident[ino] = n
        else:
            self.resident.pop(ino, None)

    def add_bytes(self, ino: int, n: int) -> None:
        self.set_resident(ino, max(0, self.resident.get(ino, 0) + n))

    def add(self, ino: int, b: int) -> None:
        """Block ``b`` of ``ino`` is now on this tier (first reference if new)."""
        self.order.add((ino, b))
        self._blocks_of.setdefault(ino, set()).add(b)

    def removed(self, ino: int, b: int) -> None:
        """Block ``b`` left this tier (its key may stay as a 2Q ghost)."""
        self.order.remove((ino, b))
        blocks = self._blocks_of.get(ino)
        if blocks is not None:
            blocks.discard(b)
            if not blocks:
                del self._blocks_of[ino]

    def forget(self, ino: int) -> None:
        """The inode's data on this tier is gone (deleted, or replaced by new content)."""
        for b in self._blocks_of.pop(ino, ()):
            self.order.forget((ino, b))
        self.set_resident(ino, 0)

    def blocks(self, ino: int) -> set[int]:
        return set(self._blocks_of.get(ino, ()))

    def to_free(self, nbytes: int) -> int:
        """Bytes to evict before ``nbytes`` more fit under the high watermark: down to the
        low watermark, so eviction runs in batches rather than per block."""
        if self.used + nbytes <= self.capacity * self.high:
            return 0
        return int(self.used + nbytes - self.capacity * self.low)

    def fits(self, nbytes: int) -> bool:
        """Would ``nbytes`` more stay within the tier's capacity?"""
        return self.used + nbytes <= self.capacity
