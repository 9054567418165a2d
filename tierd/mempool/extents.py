"""Address space of the emulated CXL device: first-fit allocation with coalescing frees.

Each region is backed by its own memfd (so it can be handed to exactly one tenant), but a
real CXL pool is one device address range: regions occupy extents of it, and a pool with
enough free bytes in total can still fail a large allocation when the free bytes are
scattered.  Modelling the range keeps that behaviour (and the ``fragmentation`` statistic)
honest instead of treating capacity as a single counter.
"""

from __future__ import annotations

import bisect

#: extents are multiples of this (a huge page: how CXL memory is usually carved up)
ALIGN = 2 << 20


def align_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Extents:
    """Free extents of ``[0, capacity)``, kept sorted by offset and coalesced."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity // ALIGN * ALIGN
        self._starts: list[int] = [0] if self.capacity else []
        self._lens: list[int] = [self.capacity] if self.capacity else []

    @property
    def free(self) -> int:
        return sum(self._lens)

    @property
    def largest(self) -> int:
        return max(self._lens, default=0)

    def fragmentation(self) -> float:
        """0 when all free bytes are one extent, towards 1 when they are scattered."""
        free = self.free
        return 0.0 if free == 0 else 1.0 - self.largest / free

    def alloc(self, size: int) -> int | None:
        """Offset of a new extent of ``size`` (aligned) bytes, or None if none fits."""
        size = align_up(size)
        for i, length in enumerate(self._lens):
            if length >= size:
                off = self._starts[i]
                if length == size:
                    del self._starts[i], self._lens[i]
                else:
                    self._starts[i] += size
                    self._lens[i] -= size
                return off
        return None

    def release(self, offset: int, size: int) -> None:
        """Give an extent back, merging it with free neighbours."""
        size = align_up(size)
        i = bisect.bisect_left(self._starts, offset)
        if i < len(self._starts) and self._starts[i] < offset + size:
            raise ValueError(f"extent {offset}+{size} overlaps a free extent")
        if i > 0 and self._starts[i - 1] + self._lens[i - 1] > offset:
            raise ValueError(f"extent {offset}+{size} overlaps a free extent")
        merge_prev = i > 0 and self._starts[i - 1] + self._lens[i - 1] == offset
        merge_next = i < len(self._starts) and self._starts[i] == offset + size
        if merge_prev and merge_next:
            self._lens[i - 1] += size + self._lens[i]
            del self._starts[i], self._lens[i]
        elif merge_prev:
            self._lens[i - 1] += size
        elif merge_next:
            self._starts[i] = offset
            self._lens[i] += size
        else:
            self._starts.insert(i, offset)
            self._lens.insert(i, size)
