"""Uploads to one cold key, ordered across the nodes of a cluster (``T`` keys).

The cold store keeps one object per key.  On one node, uploads and deletes of a key take
turns (``KeyGates``) and the node knows which upload is in flight (``putting``).  On a
cluster two nodes may hold versions of one key: node A uploading the version a client has
just replaced through node B, B uploading the new one.  Without an order A's stale upload
can land after B's and leave cold holding the old bytes under a record that names the new.

So on a cluster an upload first records, in the transaction that writes its put-intention,
``T<key>`` -> ``[node, ino, time_ns]``, and removes it in the transaction that records what
it put (whatever the outcome).  A node that finds another live node's mark on the key does
not upload now: its file stays queued and is tried again shortly, after the other upload
has landed -- the last upload to land is then always the newest version's.  A mark left by
a node that died (not heart-beating: :mod:`tierd.peer.registry`), or older than
:data:`STALE_S`, is ignored; a node drops its own marks when it starts.

Record keys follow :mod:`tierd.placement.intents` (the cold key's head, plus a digest when
long), so the marks of a prefix are one range scan.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgpack

from tierd.meta import MetaTxn
from tierd.meta.kv import prefix_end
from tierd.placement.intents import record_key

PREFIX = b"T"
#: seconds after which a mark is taken for a leftover (an upload takes far less)
STALE_S = 600.0


def _key(key: str) -> bytes:
    return record_key(key, PREFIX)


def mark(tx: MetaTxn, key: str, node: str, ino: int) -> None:
    """``node`` is about to upload ``ino``'s content to ``key``."""
    tx.kv.put(_key(key), msgpack.packb([node, ino, time.time_ns()]))


def unmark(tx: MetaTxn, key: str, node: str) -> None:
    """``node``'s upload to ``key`` is over (landed, failed or cancelled)."""
    raw = tx.kv.get(_key(key))
    if raw is not None and msgpack.unpackb(raw)[0] == node:
        tx.kv.delete(_key(key))


def held_by(tx: MetaTxn, key: str, node: str, alive: Callable[[str], bool] | None) -> str:
    """The other node whose upload to ``key`` may be in flight ("" if none)."""
    raw = tx.kv.get(_key(key))
    if raw is None:
        return ""
    other, _ino, at = msgpack.unpackb(raw)
    if other == node or time.time_ns() - at > STALE_S * 1e9:
        return ""
    if alive is not None and not alive(other):
        return ""
    return str(other)


def drop_own(tx: MetaTxn, node: str) -> int:
    """At start: this node's marks are leftovers of its previous run (nothing is in flight
    yet); returns how many went."""
    gone = [k for k, v in tx.kv.scan(PREFIX, prefix_end(PREFIX))
            if msgpack.unpackb(v)[0] == node]
    for k in gone:
        tx.kv.delete(k)
    return len(gone)


__all__ = ["PREFIX", "STALE_S", "drop_own", "held_by", "mark", "unmark"]
