"""Reads answered by the node's read cache without a transaction, while the change feed is
current: a FUSE lookup or getattr over PostgreSQL with no round trip.

Every read transaction over PostgreSQL begins with a round trip (:mod:`tierd.meta.pg_engine`:
the snapshot's seq and the log after the cache's) and a thread hop on each side of it
(:mod:`tierd.meta.pg_async`).  A FUSE create cost two or three of them besides its own write:
the parent directory's GETATTR that the kernel sends after the create changed the
directory, and the RELEASE's look at whether the file lost its last name while open; its
LOOKUP of an existing name another.  Their answers are in the node's cache: the node wrote
those keys itself, or read them a moment ago.

Those answers are bounded by the change feed already: the kernel caches entries and
attributes for up to 300 s and drops them when the feed reports another node's change
(docs/cluster.md, "Consistency"), so a lookup or a stat that does not open sees another
node's rename, unlink or chmod only once the feed delivered it.  The feed applies each
commit to the read cache *before* it invalidates the kernel, so the cache at the feed's
cursor is at least as new as anything the kernel may still hold.  A read that accepts that
bound (``bounded``: ``meta.asnapshot(bounded=True)``) is answered from the cache when

* a change feed of the store is current (:meth:`~tierd.meta.pg_changes.ChangeFeed.current`:
  connected, every commit announced to it delivered, its last read of the log at most
  ``poll`` + 1 s old) and the cache stands at or past the last seq it heard of;
* the cache is at or past this process's own last commit, and no commit is in flight;
* the body's reads, named at the begin as ``keys`` or a ``warm`` pass
  (:mod:`tierd.meta.pg_warm`), are all in the cache at that seq.

When the pass misses keys the cache lacks (the LOOKUP of a name not created yet, a name
another node made), they are read in one statement outside any transaction (:func:`fetch`,
one per link of a chain: a dirent, then its inode) and the pass runs again; the answers
taken from the cache must still be the cache's afterwards (:func:`settle`).  Otherwise the
read begins as before.  What stays exact: an open (it reads the file's content
version in a transaction of its own, ``fuse/files.py``; close-to-open does not rest on the
feed), every write (it reads under the cluster's writer lock), S3 and the admin API (they
never ask for ``bounded``).

A writer that joins an open write group (:mod:`tierd.meta.pg_group`) reads its prefetch
the same way, exactly (:func:`member_reads`): the group holds the writer lock, so the cache
at the group's seq and a statement outside any transaction both read the group's committed
state.

The transaction this gives (:class:`CachedTxn`) holds no connection.  Its body's reads are
answered from the answers the begin's pass collected; a read the pass did not foresee
begins a real read transaction then, on the event loop, and reads there (its snapshot is
newer: such a body sees each key as of a seq the feed had reached, as the kernel would).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import psycopg

from tierd.meta.pg_engine import PgTxn
from tierd.meta.pg_sql import GET_MANY
from tierd.meta.pg_warm import ROUNDS, Warm, _Stop, _View

if TYPE_CHECKING:
    from tierd.meta.pg_engine import PgStore


class _Miss(Exception):
    """The begin's pass reached a read the cache cannot answer (a scan)."""


class CachedTxn(PgTxn):
    """A read transaction at the cache's seq with no connection (see the module doc)."""

    def __init__(self, store: PgStore, seq: int) -> None:
        super().__init__(store, False, cast(Any, None), seq, True)
        self._real: PgTxn | None = None
        self.probing = True  # the begin's pass: a scan is a miss
        self.fetched: set[bytes] = set()  # keys read by fetch(), not from the cache

    def _server(self) -> PgTxn:
        """The real read transaction, begun at the first read the cache cannot answer."""
        self._check()
        if self._real is None:
            self._real = self._store._begin(False)
            self._store.cache_only_misses += 1
        return self._real

    def get(self, key: bytes) -> bytes | None:
        self._check()
        hit, value = self.local(bytes(key))
        return value if hit else self._server().get(key)

    def prefetch(self, keys: list[bytes]) -> None:
        missed = [k for k in keys if not self.local(bytes(k))[0]]
        if missed:
            self._server().prefetch(missed)

    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        if self.probing:
            raise _Miss
        return self._server().scan(start, end, reverse=reverse)

    def _query(self, query: bytes, params: tuple[Any, ...], doing: str,
               *, send_writes: bool = False) -> list[Any]:
        return self._server()._query(query, params, doing)

    def commit(self) -> None:
        self.abort()

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        real, self._real = self._real, None
        if real is not None:
            real.abort()

    def _fail(self) -> None:
        self.abort()


def quiet_seq(store: PgStore) -> int | None:
    """The seq at which the cache answers a bounded read now, or None (see the module doc)."""
    committing = store.committing
    if committing is not None and not committing.done():
        return None
    seq = store.cache.seq
    if seq < store.local_seq:
        return None
    for feed in list(store._feeds):
        if feed.cache is store.cache and feed.current() and seq >= feed.heard:
            return seq
    return None


def begin_cached(store: PgStore, warm: Warm | None) -> tuple[CachedTxn, list[bytes]] | None:
    """A :class:`CachedTxn` for a body whose reads ``warm`` names, and the keys its pass
    missed ([]: the cache answered every one; fetch the rest with :func:`fetch` and
    :func:`settle`); None when the cache may not answer (not quiet, a scan, an error)."""
    if warm is None:
        return None
    seq = quiet_seq(store)
    if seq is None:
        return None
    txn = CachedTxn(store, seq)
    missed = _missed(txn, warm)
    if missed is None:
        txn.abort()
        return None
    if not missed:
        txn.probing = False
        store.cache_only_reads += 1
    return txn, missed


def fetch(store: PgStore, keys: list[bytes]) -> dict[bytes, bytes] | None:
    """The values of ``keys`` now (absent ones left out), in one statement outside any
    transaction: for a bounded read whose pass the cache could not answer whole (the
    LOOKUP of a name not created yet), instead of a read transaction's four (``BEGIN``, the
    seq and log, the keys, ``COMMIT``).  Run in a begin thread; None on a database error
    (the read then begins a transaction, which reports it)."""
    try:
        with store._pool.connection() as conn:
            rows = conn.execute(GET_MANY, (keys,), binary=True).fetchall()
    except psycopg.Error:
        return None
    return {bytes(k): bytes(v) for k, v in rows}


def settle(txn: CachedTxn, warm: Warm, keys: list[bytes],
           found: dict[bytes, bytes]) -> list[bytes] | None:
    """Take the fetched answers for ``keys`` into ``txn`` and run the pass again: the keys
    it still misses (a chain: a dirent, then its inode), [] when it is answered -- and then
    ``txn`` is ready, if every answer it took from the cache is still the cache's.  The
    fetched answers are newer than the cache's seq: a body sees each key as of a seq the
    feed reached or passed, as the kernel's caches do; but a cached answer the feed has
    dropped while the fetch ran (its invalidation may be on its way to the kernel already)
    sends the read to a transaction (None)."""
    read = txn.read
    assert read is not None
    for key in keys:
        read[key] = found.get(key)
        txn.fetched.add(key)
    missed = _missed(txn, warm)
    if missed is None or (not missed and not _still_cached(txn)):
        txn.abort()
        return None
    if not missed:
        txn.probing = False
        txn._store.bounded_fetches += 1
    return missed


def _still_cached(txn: CachedTxn) -> bool:
    cache = txn._store.cache
    for key, value in (txn.read or {}).items():
        if key not in txn.fetched and cache.lookup(cache.seq, key) != (True, value):
            return False
    return True


def member_reads(store: PgStore, group: PgTxn, warm: Warm, *,
                 fetching: bool = True) -> dict[bytes, bytes | None] | None:
    """A writer's prefetch when it joins the open write ``group`` (in a begin thread,
    :mod:`tierd.meta.pg_async`): the group's own answers first, then the cache at the
    group's seq, then one statement per round for the rest (:func:`fetch`), with no read
    transaction.  Exact: the group holds the cluster's writer lock from before its seq until
    this member's body has run, so nothing commits meanwhile and a statement outside any
    transaction reads the state the group's transaction reads for keys it has not written
    (:func:`tierd.meta.pg_warm.warm_member` checked the same with a read transaction's
    seq, three statements more).  None when the pass scans (that member reads as before);
    without ``fetching`` (on the event loop: no statement, no thread), None also when the
    group's answers and the cache do not answer the whole pass."""
    txn = CachedTxn(store, group.seq)
    read = txn.read
    assert read is not None
    for _ in range(ROUNDS):
        missed = _missed(txn, warm, group)
        if missed is None:
            return None
        if not missed:
            break
        if not fetching:
            return None
        found = fetch(store, missed)
        if found is None:
            return {}  # (the body reads what it needs itself)
        for key in missed:
            read[key] = found.get(key)
    return dict(read)


def _missed(txn: CachedTxn, warm: Warm, over: PgTxn | None = None) -> list[bytes] | None:
    """One run of ``warm`` (its keys, its pass) over ``txn`` (after ``over``'s answers): the
    keys neither the cache nor the fetched answers hold; None when the pass scanned or
    failed (the server decides)."""
    missed = [k for k in warm.keys
              if not (over is not None and over.local(k, True)[0])
              and not txn.local(k, keep=True)[0]]
    if warm.fn is None:
        return missed
    view = _View(txn, over)
    try:
        warm.fn(view)
    except _Stop:
        pass
    except _Miss:
        return None
    except Exception:  # a read it missed (answered None) ended it: fetch, pass again
        if not view.missed:
            return None  # (an error the body will meet: the server decides)
    return list(dict.fromkeys(missed + view.missed))
