"""Durable cold-store intentions: pending deletes of cold keys (``Z`` keys), and the keys
this node deleted while listings of cold were in flight.

Every cold object tierd no longer wants -- a name removed or renamed away, a file deleted,
a key taken by a directory, symlink or FIFO, an upload whose name changed meanwhile -- gets
a ``Z<key>`` record **in the same transaction** as the change that made it unwanted (the
namespace's hooks in ``engine.py``), and the persister's upload writes one *before* it puts
an object (an upload interrupted by a crash then leaves an intention, never an untracked
object).  The persister's delete worker (``deletes.py``) carries them out after a crash as
before it; a delete is idempotent.  Import (``importer.py``) never creates an entry for a
key with a pending delete, nor for one :class:`RecentDeletes` says this node deleted after
the listing began: an acknowledged DELETE is never undone by the cold store's stale copy.

Value: the inode whose object the key held (u64, 0 when unknown), a random token, and the
cold key itself; a delete (or the upload that replaced the object) removes the record only
if the token is unchanged, so an intention written while it ran is carried out again, not
lost.  The record's own key is the cold key's first :data:`HEAD` bytes -- plus a digest of
the whole when it is longer (a namespace path can be far longer than a metadata key may
be) -- so records still sort by cold key and a prefix is still one range scan.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from tierd.meta import MetaTxn
from tierd.meta.kv import prefix_end

PREFIX = b"Z"
_TOMB_HEAD = b"\xff" * 8
HEAD = 400  # bytes of the cold key in the record's key (lmdb keys: at most 511 bytes)
_U64 = struct.Struct(">Q")


#: ``Intent.ino`` of a tombstone: a delete already carried out (see :func:`tombstone`)
TOMB = (1 << 64) - 1
#: seconds a tombstone keeps imports from bringing its key back
TOMB_TTL = 120.0


@dataclass(frozen=True, slots=True)
class Intent:
    """A pending delete of cold ``key``, whose object (if any) was put by inode ``ino``."""

    key: str
    ino: int
    token: bytes

    @property
    def done_ns(self) -> int:
        """A tombstone's time of deletion (wall clock, ns); 0 for a pending delete."""
        return int(_U64.unpack(self.token)[0]) if self.ino == TOMB else 0


def _raw(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def record_key(key: str, prefix: bytes = PREFIX) -> bytes:
    """The metadata key of a record about cold ``key`` (here ``Z``; ``putting.py``'s ``T``
    marks too): ``prefix`` + the cold key's first :data:`HEAD` bytes, plus a digest of the
    whole when longer, so records sort by cold key and a prefix is one range scan."""
    raw = _raw(key)
    if len(raw) <= HEAD:
        return prefix + raw
    return prefix + raw[:HEAD] + hashlib.sha256(raw).digest()[:16]


def _k(key: str) -> bytes:
    return record_key(key)


def _decode(v: bytes) -> Intent:
    return Intent(v[16:].decode("utf-8", "surrogateescape"), int(_U64.unpack(v[:8])[0]),
                  bytes(v[8:16]))


def intend(tx: MetaTxn, key: str, ino: int) -> bytes:
    """Record (or renew) the intention to delete ``key``; returns its token."""
    token = os.urandom(8)
    tx.kv.put(_k(key), _U64.pack(ino) + token + _raw(key))
    return token


def get(tx: MetaTxn, key: str) -> Intent | None:
    raw = tx.kv.get(_k(key))
    return None if raw is None else _decode(raw)


def pending(tx: MetaTxn, key: str) -> bool:
    return tx.kv.get(_k(key)) is not None


def clear(tx: MetaTxn, key: str, token: bytes) -> bool:
    """Remove the intention if it is still the one with ``token``; True if removed."""
    cur = get(tx, key)
    if cur is None or cur.token != token:
        return False
    tx.kv.delete(_k(key))
    return True


def tombstone(tx: MetaTxn, key: str, token: bytes) -> bool:
    """On a cluster, instead of :func:`clear` once the delete is carried out: keep the
    record for :data:`TOMB_TTL` as a tombstone, so that another node's listing of cold read
    before the delete does not import the object back (:class:`RecentDeletes` only knows
    this node's deletes).  True if the intention was still the one with ``token``."""
    cur = get(tx, key)
    if cur is None or cur.token != token:
        return False
    tx.kv.put(_k(key), _U64.pack(TOMB) + _U64.pack(time.time_ns()) + _raw(key))
    return True


def pending_under(tx: MetaTxn, prefix: str) -> bool:
    """Whether any pending delete has a key starting with ``prefix`` (one seek, unless
    the prefix is longer than :data:`HEAD`)."""
    return next(under(tx, prefix), None) is not None


def under(tx: MetaTxn, prefix: str) -> Iterator[Intent]:
    """The intentions whose keys start with ``prefix``, in key order."""
    start = PREFIX + _raw(prefix)[:HEAD]
    for _, v in tx.kv.scan(start, prefix_end(start)):
        it = _decode(v)
        if it.key.startswith(prefix):
            yield it


def scan(tx: MetaTxn, after: str = "", limit: int = 256) -> list[Intent]:
    """Up to ``limit`` intentions with keys after ``after`` (key order)."""
    start = _k(after) + b"\x00" if after else PREFIX
    out: list[Intent] = []
    for _, v in tx.kv.scan(start, prefix_end(PREFIX)):
        out.append(_decode(v))
        if len(out) >= limit:
            break
    return out


def count(tx: MetaTxn, limit: int = 10_000) -> tuple[int, bool]:
    """How many deletes are pending (counted up to ``limit``; True when truncated)."""
    n = 0
    for _, v in tx.kv.scan(PREFIX, prefix_end(PREFIX)):
        if v[:8] == _TOMB_HEAD:
            continue  # carried out already (a tombstone)
        n += 1
        if n >= limit:
            return n, True
    return n, False


class RecentDeletes:
    """Keys this node deleted from cold while some listing of cold was in flight.

    A listing page may have been read before a delete and be processed after it, when the
    intention is gone: without this record the listing would import the object the node
    just deleted.  A listing registers its start (:meth:`listing`) and skips keys deleted at
    or after it (:meth:`deleted_since`).  Nothing is kept while no listing runs, and entries
    older than the oldest running listing are pruned: this is bounded by the deletes that
    overlap listings, and needs no persistence (after a restart no listing is in flight)."""

    def __init__(self) -> None:
        self._at: dict[str, int] = {}
        self._running: Counter[int] = Counter()

    @contextlib.contextmanager
    def listing(self) -> Iterator[int]:
        """For the duration of one listing (import); yields its start time."""
        started = time.monotonic_ns()
        self._running[started] += 1
        try:
            yield started
        finally:
            self._running[started] -= 1
            if self._running[started] <= 0:
                del self._running[started]
            self._prune()

    def deleted(self, key: str) -> None:
        """``key`` was just deleted from cold by this node."""
        if self._running:
            self._at[key] = time.monotonic_ns()

    def deleted_since(self, key: str, started: int) -> bool:
        t = self._at.get(key)
        return t is not None and t >= started

    def any_since_under(self, prefix: str, started: int) -> bool:
        return any(t >= started and k.startswith(prefix) for k, t in self._at.items())

    def _prune(self) -> None:
        if not self._running:
            self._at.clear()
            return
        oldest = min(self._running)
        for k in [k for k, t in self._at.items() if t < oldest]:
            del self._at[k]
