"""Replacement policies over block keys ``(ino, block)``: 2Q for the hot tier, LRU to compare.

Plain LRU lets one scan of a dataset larger than the tier push out everything, including a
working set that is read over and over.  2Q (Johnson & Shasha, VLDB '94) admits a block first
into a small FIFO (``A1in``); a block referenced again -- while in the FIFO, or after it left
it (its key is remembered in the ghost list ``A1out``) -- enters the main LRU (``Am``).  A scan
references each block once, so it only cycles through ``A1in`` and the working set in ``Am``
stays.  The paper ignores re-references inside ``A1in`` as "correlated"; here the engine
already folds the several reads of one block by one sequential stream into one reference, so
a second reference is a real one and promotes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

Key = tuple[int, int]


class LRU:
    """Least recently used first: the baseline the benchmark compares 2Q with."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._d: OrderedDict[Key, None] = OrderedDict()

    def __contains__(self, key: Key) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def access(self, key: Key) -> None:
        self._d[key] = None
        self._d.move_to_end(key)

    add = access

    def remove(self, key: Key) -> None:
        self._d.pop(key, None)

    def victims(self) -> Iterator[Key]:
        yield from list(self._d)


class TwoQ:
    """The full 2Q: ``A1in`` FIFO of ``kin`` blocks, ``A1out`` ghosts of ``kout`` keys,
    ``Am`` LRU.  :meth:`victims` yields eviction candidates best first, without removing
    them (the caller removes what it really evicts: dirty or pinned blocks stay)."""

    def __init__(self, capacity: int, kin: float = 0.25, kout: float = 0.5) -> None:
        self.capacity = max(1, capacity)
        self.kin = max(1, int(self.capacity * kin))
        self.kout = max(1, int(self.capacity * kout))
        self.a1in: OrderedDict[Key, None] = OrderedDict()
        self.a1out: OrderedDict[Key, None] = OrderedDict()
        self.am: OrderedDict[Key, None] = OrderedDict()

    def __contains__(self, key: Key) -> bool:
        return key in self.a1in or key in self.am

    def __len__(self) -> int:
        return len(self.a1in) + len(self.am)

    def access(self, key: Key) -> None:
        """A reference to a cached (or just cached) block."""
        if key in self.am:
            self.am.move_to_end(key)
        elif key in self.a1in:
            del self.a1in[key]
            self.am[key] = None
        elif key in self.a1out:
            del self.a1out[key]
            self.am[key] = None
        else:
            self.a1in[key] = None

    def add(self, key: Key) -> None:
        if key not in self:
            self.access(key)

    def remove(self, key: Key) -> None:
        """The block left the tier: a FIFO block is remembered as a ghost."""
        if self.a1in.pop(key, 0) is None:
            self.a1out[key] = None
            while len(self.a1out) > self.kout:
                self.a1out.popitem(last=False)
        self.am.pop(key, None)

    def forget(self, key: Key) -> None:
        """The block's file is gone: no ghost."""
        self.a1in.pop(key, None)
        self.am.pop(key, None)
        self.a1out.pop(key, None)

    def victims(self) -> Iterator[Key]:
        if len(self.a1in) > self.kin:
            yield from list(self.a1in)
            yield from list(self.am)
        else:
            yield from list(self.am)
            yield from list(self.a1in)
