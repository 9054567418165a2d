"""Other nodes' changes, reported to this namespace's subscribers as :class:`Change` objects.

With several nodes on one PostgreSQL store, a name or an inode another node changes is stale
in whatever this node cached about it -- above all the kernel's attribute and entry caches
behind the FUSE mount, which the namespace's subscribers invalidate.  The store's change feed
(:meth:`tierd.meta.pg_engine.PgStore.watch`, :mod:`tierd.meta.pg_changes`) hands over every
other node's committed keys, in commit order, on its own thread; :func:`follow` turns them into
the same reports this node's own object calls make, and calls the subscribers on the event
loop (``loop.call_soon_threadsafe``), as :meth:`NamespaceBase.subscribe` promises.

Keys (the layout is in :mod:`tierd.meta.store`): ``I<ino>`` and ``X<ino><xattr name>`` ->
``Change(ino=ino)``; ``D<parent><name>[/]`` -> ``Change(parent=parent, name=name)`` (without a
directory's trailing ``/``).  Other keys (counters, queues, cold records, ...) change nothing a
door caches.  A commit too large to list its keys, or a stretch of the log trimmed away before
this node read it, is reported as :data:`EVERYTHING`, a ``Change()`` that names nothing: a
door that cannot drop everything at once keeps relying on its cache timeouts there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from tierd.meta.nodes import scoped_ino, scoped_prefix
from tierd.namespace.base import Change, NamespaceBase

log = logging.getLogger(__name__)

#: "anything may have changed" (see the module doc)
EVERYTHING = Change()

_U64 = struct.Struct(">Q")


@runtime_checkable
class ChangeSource(Protocol):
    """An engine with a change feed (the PostgreSQL engine): ``watch(callback)`` calls
    ``callback(seq, keys)`` from its own thread for each other node's commit (``keys`` None:
    anything) and returns the function that stops it."""

    def watch(self, callback: Callable[[int, list[bytes] | None], None]
              ) -> Callable[[], None]: ...


def changes_of(keys: Iterable[bytes]) -> list[Change]:
    """What the changed ``keys`` mean to a door that caches, without repeats, in key order."""
    seen: dict[Change, None] = {}
    for key in keys:
        kind = key[:1]
        if len(key) < 9 or kind not in (b"I", b"X", b"D"):
            continue
        (num,) = _U64.unpack_from(key, 1)
        if kind == b"D":
            name = key[9:]
            if name.endswith(b"/"):
                name = name[:-1]
            if name:
                seen.setdefault(Change(parent=num, name=name))
        else:
            seen.setdefault(Change(ino=num))
    return list(seen)


def follow(ns: NamespaceBase, engine: object,
           loop: asyncio.AbstractEventLoop | None = None, *,
           also: Callable[[list[bytes] | None], None] | None = None
           ) -> Callable[[], None] | None:
    """Report every other node's change of ``engine``'s data to ``ns``'s subscribers, on
    ``loop`` (default: the running loop), and reclaim the data files other nodes' commits
    made garbage on this node (their ``G`` keys under this node's name: a file deleted
    through another node that this node held a copy of); ``also`` hears the raw keys on the
    loop too (None: anything).  Returns the function that stops it, or None when the engine
    has no change feed (lmdb, memory: a single node has no other nodes)."""
    if not isinstance(engine, ChangeSource):
        return None
    target = loop if loop is not None else asyncio.get_running_loop()
    garbage = scoped_prefix(b"G", ns.meta.node) if ns.meta.node else None

    def on_commit(seq: int, keys: list[bytes] | None) -> None:  # the feed's thread
        changes = [EVERYTHING] if keys is None else changes_of(keys)
        mine = [] if keys is None or garbage is None else [
            scoped_ino(k, garbage) for k in keys
            if k.startswith(garbage) and len(k) == len(garbage) + 8]
        if not changes and not mine and also is None:
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: the daemon is stopping
            target.call_soon_threadsafe(_apply, ns, changes, mine, also, keys)

    return engine.watch(on_commit)


def _apply(ns: NamespaceBase, changes: list[Change], garbage: list[int],
           also: Callable[[list[bytes] | None], None] | None,
           keys: list[bytes] | None) -> None:
    """On the loop: report the changes, reclaim this node's copies of dropped files."""
    _report(ns, changes)
    for ino in garbage:  # the dropping commit is durable: it is in the database's log
        ns.garbage.add(ino)
    if also is not None:
        try:
            also(keys)
        except Exception:
            log.exception("change follower failed")


def _report(ns: NamespaceBase, changes: list[Change]) -> None:
    """On the loop: each subscriber hears each change (as :meth:`NamespaceBase._notify`
    does, without taking the changes a local call has gathered but not yet reported)."""
    for cb in list(ns._subscribers):
        for ch in changes:
            try:
                cb(ch)
            except Exception:
                log.exception("change subscriber failed")
