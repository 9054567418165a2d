"""Address space of the emulated CXL device: first-fit allocation with coalescing frees.

Each region is backed by its own memfd (so it can be handed to exactly one tenant), but a
real CXL pool is one device address range: regions occupy extents of it, and a pool with
enough free bytes in total can still fail a large allocation when the free bytes are
scattered.  Modelling the range keeps that behaviour (and the ``fragmentation`` statistic)
honest instead of treating capacity as a single counter.

Large regions take whole 2 MiB units.  Small ones (under half a unit: the memory tier's
copies of small files) are **packed**: they take 4 KiB pages of a 2 MiB slab carved from
the range, so a thousand 10 KiB files hold 12 MiB of the pool, not 2 GiB.  A slab goes back
to the range when its last region is freed.
"""

from __future__ import annotations

import bisect

#: extents of large regions are multiples of this (a huge page: how CXL memory is carved)
ALIGN = 2 << 20
#: small regions are multiples of this, packed into slabs of ALIGN bytes
PAGE = 4 << 10
#: regions below this size are packed
SMALL = ALIGN // 2


def align_up(n: int) -> int:
    """The bytes a region of ``n`` bytes holds of the pool: whole pages while that stays
    under :data:`SMALL` (packed), else whole units.  Every result is either below SMALL or
    a multiple of ALIGN, so large extents stay on the unit grid that slabs are found by."""
    pages = (max(n, 1) + PAGE - 1) // PAGE * PAGE
    return pages if pages < SMALL else (pages + ALIGN - 1) // ALIGN * ALIGN


class _Range:
    """Free extents of ``[base, base+size)`` in multiples of ``unit``, sorted, coalesced."""

    def __init__(self, base: int, size: int, unit: int) -> None:
        self.unit = unit
        self._starts: list[int] = [base] if size else []
        self._lens: list[int] = [size] if size else []

    @property
    def free(self) -> int:
        return sum(self._lens)

    @property
    def largest(self) -> int:
        return max(self._lens, default=0)

    def alloc(self, size: int) -> int | None:
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


class Extents:
    """The pool's range: large extents first-fit in 2 MiB units, small ones in slabs."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity // ALIGN * ALIGN
        self._big = _Range(0, self.capacity, ALIGN)
        #: slab offset -> its free pages
        self._slabs: dict[int, _Range] = {}

    @property
    def free(self) -> int:
        return self._big.free + sum(s.free for s in self._slabs.values())

    @property
    def largest(self) -> int:
        """The largest extent one region could take now."""
        return max([self._big.largest, *(s.largest for s in self._slabs.values())])

    def fits(self, size: int) -> bool:
        need = align_up(size)
        if need < SMALL and any(s.largest >= need for s in self._slabs.values()):
            return True
        return self._big.largest >= (need if need >= SMALL else ALIGN)

    def fragmentation(self) -> float:
        """0 when all free bytes are one extent, towards 1 when they are scattered."""
        free = self.free
        return 0.0 if free == 0 else 1.0 - self.largest / free

    def alloc(self, size: int) -> int | None:
        """Offset of a new extent for a region of ``size`` bytes, or None if none fits."""
        need = align_up(size)
        if need >= SMALL:
            return self._big.alloc(need)
        for slab in self._slabs.values():
            off = slab.alloc(need)
            if off is not None:
                return off
        base = self._big.alloc(ALIGN)
        if base is None:
            return None
        slab = self._slabs[base] = _Range(base, ALIGN, PAGE)
        return slab.alloc(need)

    def release(self, offset: int, size: int) -> None:
        """Give an extent back, merging it with free neighbours (and an emptied slab with
        the range)."""
        need = align_up(size)
        if need >= SMALL:
            self._big.release(offset, need)
            return
        base = offset // ALIGN * ALIGN
        slab = self._slabs.get(base)
        if slab is None:
            raise ValueError(f"extent {offset}+{size} is in no slab")
        slab.release(offset, need)
        if slab.free == ALIGN:
            del self._slabs[base]
            self._big.release(base, ALIGN)
