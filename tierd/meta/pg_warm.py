"""Prefetch over PostgreSQL: the reads a transaction body will make, done in the begin's
thread, so the body on the event loop finds them answered.

An async transaction's body (``async with meta.awrite() as tx``) is synchronous code that
runs on the loop (:mod:`tierd.meta.atxn`).  Every get in it that the node's read cache
(:mod:`tierd.meta.pg_cache`) cannot answer is a round trip during which the loop runs
nothing else -- no other request, and no other writer reaching the group gate
(:mod:`tierd.meta.pg_group`), so write groups stay small.  The names a create looks up
are new (absent: never in the cache), and every commit of another node drops keys.

A caller that knows what its body reads says so at the begin (``meta.awrite(keys=...,
warm=...)``, ``meta.asnapshot(...)``):

* ``keys``: keys read in one query (``k = ANY(...)``) in the begin's thread, absent ones
  included (a negative answer is an answer);
* ``warm``: a function that makes the body's reads -- typically the body's own read code --
  run in the begin's thread against a read-only view of the transaction (a write ends it
  there: :class:`_Stop`).  A get the view cannot answer yet answers None and is noted; the
  noted keys are then read in one query and the function runs again, until a pass misses
  nothing (at most :data:`ROUNDS` passes).  So independent reads share one round trip and a
  chain the caller cannot name in advance (a dirent, then the inode it names) costs one per
  link.  Its result and its errors are ignored: it only fills.

Every answer -- the server's, or the shared cache's at the transaction's seq -- goes into the
transaction's own read map (``PgTxn.read``), which the body's gets consult after the
transaction's writes and before the shared cache: the answers hold
for the transaction's whole life, as its snapshot does (a writer's, because it holds the
cluster's writer lock, so no other node's commit can change them), even when another
transaction moves the shared cache on meanwhile.  They fill the cache too, under the cache's
usual rule (only at the transaction's seq).  A scan's pages are kept too (:func:`page`): the
body's scan of the same range is answered by them while the transaction has written no key in
that range (a reader never has; a writer's page is read anew once it wrote inside it).  So
nothing changes what a body reads: only where the wait for it happens.

A writer that joins an open group (``pg_async``) runs no begin: its warm runs in a thread,
reading what the cache lacks with one statement per round outside any transaction
(:func:`tierd.meta.pg_quiet.member_reads`; a pass that scans: on a separate read transaction,
:func:`warm_member`), which -- the group holds the writer lock -- sees exactly
the committed state the group's transaction reads for keys it has not written; the view
answers the group's own writes first, and only answers for keys the group has not written
are taken over, and only when both stand at the same seq.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tierd.errors import FsError
from tierd.meta.kv import KVTxn
from tierd.meta.pg_sql import GET_MANY

if TYPE_CHECKING:
    from tierd.meta.pg_engine import PgStore, PgTxn

log = logging.getLogger(__name__)

#: passes of a warm function at most: each reads what the one before missed, in one query
ROUNDS = 8
#: answers one transaction keeps in its read map at most (a huge transaction -- a load --
#: reads through the cache and the server as before past it)
READ_MAX = 4096


@dataclass(frozen=True)
class Warm:
    """What a body will read: ``keys`` (one query) and ``fn`` (a read-only pass over a
    :class:`~tierd.meta.kv.KVTxn` view, run after them)."""

    keys: tuple[bytes, ...] = ()
    fn: Callable[[KVTxn], object] | None = None


class _Stop(Exception):
    """A warm function tried to write: its reads so far are what it had to make."""


class _View(KVTxn):
    """The read-only transaction a warm function reads through: ``txn``'s answers, after
    ``over``'s own (a joined group's transaction, see the module doc).  A get it cannot
    answer without the server answers None for now and is noted in :attr:`missed`."""

    write = False

    def __init__(self, txn: PgTxn, over: PgTxn | None = None) -> None:
        self._txn = txn
        self._over = over
        self.missed: list[bytes] = []

    def get(self, key: bytes) -> bytes | None:
        key = bytes(key)
        if self._over is not None:
            hit, value = self._over.local(key, keep=True)
            if hit:
                return value
        hit, value = self._txn.local(key, keep=True)
        if not hit:
            self.missed.append(key)
        return value

    def absent(self, key: bytes) -> None:
        # (a body's hint holds as much for its warm pass: the number is the body's; a key
        # the joined group wrote is answered by the group first, and absorb() skips it)
        self._txn.absent(key)

    def put(self, key: bytes, value: bytes) -> None:
        raise _Stop

    def delete(self, key: bytes) -> bool:
        raise _Stop

    def scan(self, start: bytes, end: bytes | None = None, *,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        return self._txn.scan(start, end, reverse=reverse)

    def commit(self) -> None:
        raise _Stop

    def abort(self) -> None:
        raise _Stop


def prefetch(txn: PgTxn, keys: Iterable[bytes], over: PgTxn | None = None) -> int:
    """Read those of ``keys`` that ``txn`` (after ``over``) cannot answer yet, in one query;
    the number read."""
    miss = []
    for key in dict.fromkeys(bytes(k) for k in keys):
        if (over is None or not over.local(key, True)[0]) and not txn.local(key, True)[0]:
            miss.append(key)
    if not miss:
        return 0
    found = {bytes(k): bytes(v) for k, v in txn._query(GET_MANY, (miss,), "reading keys")}
    for key in miss:
        txn.learn(key, found.get(key))
    return len(miss)


def _run(txn: PgTxn, warm: Warm, over: PgTxn | None) -> None:
    prefetch(txn, warm.keys, over)
    for _ in range(ROUNDS if warm.fn is not None else 0):
        view = _View(txn, over)
        try:
            warm.fn(view)  # type: ignore[misc]
        except _Stop:
            pass
        except Exception as e:  # the body meets the same error itself, on the loop
            if txn._done:
                raise  # (a database error in a scan: the transaction is gone)
            log.debug("prefetch pass ended early: %r", e)
        if not prefetch(txn, view.missed, over):
            return


def page(txn: PgTxn, q: bytes, p: tuple[Any, ...], end: bytes | None) -> list[Any]:
    """One page of ``txn``'s scan of keys from ``p[0]`` (before ``end``): the server's, or
    the same page read before in this transaction (a warm pass's) while it has written no key
    in that range, so the page cannot have changed."""
    pages = txn.pages
    send = _unsent_in(txn, p[0], end)
    if pages is None or txn.read is None or _wrote_in(txn, p[0], end):
        return txn._query(q, p, "scanning keys", send_writes=send)
    rows = pages.get((q, p))
    if rows is None:
        rows = pages[q, p] = txn._query(q, p, "scanning keys", send_writes=send)
        txn.paged += len(rows)
        if txn.paged > READ_MAX:
            txn.pages = None
    return rows


def _unsent_in(txn: PgTxn, lo: bytes, hi: bytes | None) -> bool:
    """Whether a buffered write falls in the scanned range: only then must the writes go
    to the server before the page is read (the rest wait for the commit's one message; an
    unlink's xattr scan after its entry writes sent them as a statement per key)."""
    return any(lo <= k and (hi is None or k < hi) for k in txn._unsent)


def _wrote_in(txn: PgTxn, lo: bytes, hi: bytes | None) -> bool:
    written = txn._written
    if not txn.write or written == {}:
        return False
    return written is None or any(lo <= k and (hi is None or k < hi) for k in written)


def warm_txn(txn: PgTxn, warm: Warm | None) -> None:
    """Prefetch for a transaction just begun, in its begin thread (nothing else uses it
    yet).  A database error fails the begin, as it would have failed the body."""
    if warm is None:
        return
    try:
        _run(txn, warm, None)
    except FsError:
        txn._fail()  # (already ended by the error; releases nothing twice)
        raise


def warm_member(store: PgStore, group_txn: PgTxn, warm: Warm) -> dict[bytes, bytes | None]:
    """Prefetch for a writer joining ``group_txn``, in a thread, on a read transaction of its
    own (see the module doc); the answers for :func:`absorb`.  Errors are only logged: the
    body then reads as it would have without this."""
    reader = store.begin_read()
    try:
        if reader.seq != group_txn.seq:
            return {}
        _run(reader, warm, group_txn)
        return dict(reader.read or {})
    except FsError as e:
        log.debug("prefetch for a group member failed: %s", e)
        return {}
    finally:
        reader.abort()  # (a read: parks its connection, no round trip)


def absorb(txn: PgTxn, answers: dict[bytes, bytes | None]) -> None:
    """Take over ``answers`` (:func:`warm_member`) for the keys ``txn`` has not written."""
    read = txn.read
    if read is None:
        return
    for key, value in answers.items():
        if len(read) >= READ_MAX:
            return
        if key not in read and not txn.wrote(key):
            read[key] = value
