"""A node's read cache of the shared PostgreSQL store: key -> value (or "absent"), valid at a seq.

Several nodes share one database, so a value this node read a moment ago may have been
replaced by another node since.  The database numbers every write commit (``meta_schema.seq``,
bumped in the commit) and logs the keys each one changed (``kv_log``); see
:mod:`tierd.meta.pg_engine`.  The cache is tagged with the seq its entries are valid at:

* a transaction learns the seq of its snapshot in its first round trip, together with the
  log rows after the cache's seq (:meth:`ReadCache.since` says from where); :meth:`advance`
  drops the keys those rows name (everything, when the log no longer reaches back) and moves
  the cache to the snapshot's seq;
* a transaction uses and fills the cache only while the cache is at exactly its own snapshot's
  seq (:meth:`lookup`, :meth:`fill` take that seq): a reader whose snapshot is older than the
  cache (another transaction moved it on) simply reads the server, so no transaction ever sees
  a value older or newer than its snapshot;
* the writer (who holds the database's writer lock, so nothing else commits meanwhile) hands
  its own writes over after its commit (:meth:`committed`): the cache moves from the writer's
  seq to the commit's seq with those values in place, and this node's next read of a key it
  just wrote costs no round trip.  From before the commit is sent until then the cache does
  not move to it or past it (:meth:`ReadCache.expect`).

A key the cache does not hold is unknown, except under a **complete prefix**: one that
every key of the store starting with it is in the cache (:meth:`committed`'s ``complete``:
the keys of an inode this node created -- its extended attributes, a new directory's
entries -- which its commit hints at with :meth:`~tierd.meta.kv.KVTxn.empty_prefix`).
There a missing key is absent, so the kernel's LOOKUP of a new name in a new directory
(one before each create) and its ``security.capability`` look before a new file's first
write cost no round trip.  A prefix stops being complete as soon as a key under it leaves
the cache or is dropped by a commit the cache did not see the values of (another node's,
from the log), whether the cache held that key or not, and when everything is dropped.

The seq only grows (an empty cache is valid at any seq, so dropping everything never needs to
go back).  Bounded by entries and bytes, least recently used out first.  Every method is
thread safe: transactions run on the event loop and in worker threads, and the change feed
(:mod:`tierd.meta.pg_changes`) advances the cache from its own thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Final

#: "no such key" as a cached fact (a lookup answering it returns None without a round trip)
ABSENT: Final = None
#: values larger than this are not cached (the small-write log's ``W`` values carry file bytes)
VALUE_MAX = 64 << 10
#: a log row with no keys: the commit changed too many keys to list (a ``tierd meta load``)
EVERYTHING: Final[tuple[bytes, ...]] = ()
_MISSING: Final = object()
#: the change feed's rows held back while this node's commit is in flight, at most
_HELD_MAX = 4096


class ReadCache:
    """Key -> value (``None``: known absent), valid at :attr:`seq`; see the module doc."""

    def __init__(self, max_entries: int = 200_000, max_bytes: int = 64 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._map: OrderedDict[bytes, bytes | None] = OrderedDict()
        self._bytes = 0
        #: the seq the entries are valid at (-1: never learned one; the cache is empty)
        self.seq = -1
        #: prefixes whose every key is in the map (see the module doc), each with its keys
        #: that hold a value (a scan of the prefix lists them: :meth:`under`), and their
        #: lengths (a dict for its order: past ``max_entries`` the oldest go, always safe)
        self._complete: dict[bytes, set[bytes]] = {}
        self._lengths: set[int] = set()
        #: the seq of this node's write commit in flight (:meth:`expect`, until
        #: :meth:`committed` or :meth:`abandon`): the cache does not move to it or past it
        #: meanwhile, so the writer's :meth:`committed` always finds it just before its
        #: commit; and the change feed's rows held back meanwhile, applied after it
        self._own: int | None = None
        self._held: list[tuple[int, list[bytes]]] = []
        # figures for status pages and the bench
        self.hits = 0
        self.misses = 0
        self.dropped_all = 0

    def __len__(self) -> int:
        return len(self._map)

    def since(self) -> int | None:
        """The seq after which a transaction should fetch log rows to bring the cache up to
        its snapshot, or None when the cache is empty (nothing to drop: no log needed)."""
        with self._lock:
            return self.seq if self._knows() else None

    def expect(self, seq: int) -> None:
        """This node's writer is about to send its commit, which will be seq ``seq``.

        Until its :meth:`committed` (or :meth:`abandon`), another transaction of this node
        whose snapshot includes that commit reads the server (:meth:`advance` says False),
        and the change feed's rows from ``seq`` on wait: otherwise a reader beginning
        between the server's commit and the writer's :meth:`committed` moved the cache past
        it, and the writer's values and the prefixes it made complete (a new directory's
        entries) were lost -- on a busy cluster, for most commits."""
        with self._lock:
            self._own = seq
            self._held = []

    def abandon(self, seq: int) -> None:
        """The commit :meth:`expect` announced failed (or its outcome is unknown): the
        cache moves on without it, from the server's log."""
        with self._lock:
            if self._own == seq:
                self._own = None
                self._held = []

    def advance(self, frm: int | None, to: int,
                rows: Iterable[tuple[int, Iterable[bytes]]] | None) -> bool:
        """Bring the cache to seq ``to``, given the log ``rows`` (seq, keys) after ``frm``
        (what :meth:`since` said; ``rows`` None: not fetched, or they do not reach back
        to ``frm + 1``, or were cut short: drop everything).  True when the cache is now at
        ``to`` (the caller may use it); False when it has moved past ``to`` (an older
        snapshot: the caller reads the server)."""
        with self._lock:
            if self.seq == to:
                return True
            if self.seq > to or (self._own is not None and to >= self._own):
                return False
            if not self._knows():
                self.seq = to
                return True
            if frm is None or rows is None or self.seq < frm:
                self._clear()
                self.seq = to
                return True
            for seq, keys in rows:
                if seq <= self.seq:
                    continue  # already applied (by the feed, or another transaction)
                if seq > to:
                    break
                self._drop(keys)
            self.seq = to
            return True

    def apply(self, seq: int, keys: Iterable[bytes]) -> None:
        """One log row, from the change feed, applied if the cache is just before it (the
        feed reads the log in order; a cache further behind waits for the next transaction
        to bring it up with the whole stretch).  This node's own commit, and the rows after
        it, wait for its writer's :meth:`committed` (:meth:`expect`)."""
        with self._lock:
            if self._own is not None and seq >= self._own:
                # in order from the writer's own; past _HELD_MAX the rest are left to the
                # next transaction's log rows (the cache stays behind meanwhile: exact)
                if (self._held or seq == self._own) and len(self._held) < _HELD_MAX:
                    self._held.append((seq, [bytes(k) for k in keys]))
                return
            self._apply(seq, keys)

    def _apply(self, seq: int, keys: Iterable[bytes]) -> None:
        if self.seq == seq - 1:
            self._drop([bytes(k) for k in keys])
            self.seq = seq
        elif self.seq < seq - 1 and not self._knows():
            self.seq = seq

    def drop_all(self, at: int) -> None:
        """Forget everything and stand at seq ``at`` (the feed lost the log: a trim)."""
        with self._lock:
            if at > self.seq:
                self._clear()
                self.seq = at

    def lookup(self, seq: int, key: bytes) -> tuple[bool, bytes | None]:
        """``(True, value)`` when the cache holds ``key`` at exactly ``seq``."""
        with self._lock:
            if self.seq != seq:
                return False, None
            try:
                value = self._map[key]
            except KeyError:
                if self._complete and self._under_complete(key):
                    self.hits += 1
                    return True, ABSENT
                self.misses += 1
                return False, None
            self._map.move_to_end(key)
            self.hits += 1
            return True, value

    def under(self, seq: int, prefix: bytes) -> list[tuple[bytes, bytes]] | None:
        """Every key under ``prefix`` with its value, in key order, when ``prefix`` is
        complete at exactly ``seq`` (a scan of it needs no round trip); else None."""
        with self._lock:
            keys = self._complete.get(prefix) if self.seq == seq else None
            if keys is None:
                return None
            self.hits += 1
            return sorted((k, v) for k in keys if (v := self._map.get(k)) is not None)

    def fill(self, seq: int, key: bytes, value: bytes | None) -> None:
        """Remember what the server said ``key`` holds at ``seq`` (ignored unless the cache
        is still at ``seq``)."""
        with self._lock:
            if self.seq == seq:
                self._set(key, value)

    def committed(self, before: int, after: int,
                  writes: Mapping[bytes, bytes | None] | None,
                  complete: Iterable[bytes] = ()) -> None:
        """The writer that began at ``before`` committed seq ``after`` with ``writes`` (None:
        too many to keep: forget everything), after which no key of the store starts with
        a prefix of ``complete`` but those in ``writes``.  The cache waited for it
        (:meth:`expect`): the change feed's rows from ``after`` on, held meanwhile, follow
        (its own row is skipped: these writes are what it changed)."""
        with self._lock:
            held, self._held = self._held, []
            if self._own == after:
                self._own = None
            self._committed(before, after, writes, complete)
            for seq, keys in held:
                self._apply(seq, keys)

    def _committed(self, before: int, after: int,
                   writes: Mapping[bytes, bytes | None] | None,
                   complete: Iterable[bytes]) -> None:
        if self.seq not in (before, after):
            return  # moved on without it (dropped everything past it: a trim, a restart)
        if writes is None:
            self._clear()
        else:
            # the prefixes first, then the writes: _set keeps each prefix's keys, and a
            # write it cannot keep (too big) or an entry it evicts takes the prefix's
            # completeness again
            for prefix in complete:
                self._complete.setdefault(prefix, set())
                self._lengths.add(len(prefix))
            for key, value in writes.items():
                self._set(key, value)
            while len(self._complete) > self.max_entries:
                del self._complete[next(iter(self._complete))]
        self.seq = after

    def _set(self, key: bytes, value: bytes | None) -> None:
        old = self._map.pop(key, _MISSING)
        if old is not _MISSING:
            self._bytes -= len(key) + len(old or b"")  # type: ignore[arg-type]
        if value is not None and len(value) > VALUE_MAX:
            self._uncomplete(key)  # held by the store, not here
            return
        self._map[key] = value
        self._bytes += len(key) + len(value or b"")
        if self._complete:  # a key under a complete prefix: its scan lists it (or not)
            for n in self._lengths:
                keys = self._complete.get(key[:n])
                if keys is not None:
                    if value is None:
                        keys.discard(key)
                    else:
                        keys.add(key)
        while len(self._map) > self.max_entries or self._bytes > self.max_bytes:
            k, v = self._map.popitem(last=False)
            self._bytes -= len(k) + len(v or b"")
            self._uncomplete(k)

    def _drop(self, keys: Iterable[bytes]) -> None:
        if keys == EVERYTHING or (isinstance(keys, list | tuple) and not keys):
            self._clear()
            return
        for key in keys:
            key = bytes(key)
            old = self._map.pop(key, _MISSING)
            if old is not _MISSING:
                self._bytes -= len(key) + len(old or b"")  # type: ignore[arg-type]
            self._uncomplete(key)  # (a key new to the cache too: it may exist now)

    def _knows(self) -> bool:
        """Whether the cache holds any fact -- a value, an absence, or a complete prefix
        with no key in it -- that a commit it has not seen could make wrong."""
        return bool(self._map or self._complete)

    def _under_complete(self, key: bytes) -> bool:
        return any(key[:n] in self._complete for n in self._lengths)

    def _uncomplete(self, key: bytes) -> None:
        if self._complete:
            for n in self._lengths:
                self._complete.pop(key[:n], None)

    def _clear(self) -> None:
        if self._map:
            self.dropped_all += 1
        self._map.clear()
        self._complete.clear()
        self._bytes = 0
