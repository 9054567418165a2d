"""The node registry: which nodes share this namespace, where their peer doors are, and
whether they are alive.

One key per node in the shared metadata store (the ``A`` line of the key table in
:mod:`tierd.meta.store`): ``A<node name, utf-8>`` -> msgpack ``[peer_url, heartbeat_ns,
started_ns]``.  A node writes it when its peer door starts (:func:`register`) and refreshes
``heartbeat_ns`` every couple of seconds (:class:`Heartbeat`); another node finds the door's
URL there (:func:`lookup`) and judges it dead when the heartbeat is older than a lease
(:func:`alive`).  Times are the wall clock (``time.time_ns``) because they are compared
across machines: the nodes' clocks must agree (NTP), as the peer door's signatures already
need (:mod:`tierd.peer.auth`).

The functions are synchronous, one small transaction each.  Every engine may be called from
a worker thread (the memory and group-commit engines serialize writers with a lock; lmdb
keeps each transaction in the thread that began it; PostgreSQL takes a pooled connection),
so :class:`Heartbeat` runs its transaction with :func:`asyncio.to_thread`: over PostgreSQL
it is a network round trip that must not stall the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import msgpack

from tierd.logs import get_logger
from tierd.meta.kv import prefix_end
from tierd.meta.store import MetaStore

log = get_logger("peer")

#: ``A`` ("addresses"): ``H`` and ``J`` are bucket versioning's (tierd/namespace/versions.py)
PREFIX = b"A"
#: how often (seconds) a node refreshes its heartbeat
HEARTBEAT_S = 2.0
#: a node whose heartbeat is older than this (seconds) is dead (several missed beats, so a
#: slow database transaction or a paused process does not kill a node)
LEASE_S = 10.0


@dataclass(frozen=True)
class NodeInfo:
    """One node's registry entry."""

    node: str
    url: str  # the peer door's base URL, e.g. http://10.0.0.2:9100
    heartbeat_ns: int  # wall clock of the last heartbeat
    started_ns: int  # wall clock of the daemon's start (tells two processes apart)


def _key(node: str) -> bytes:
    return PREFIX + node.encode()


def _decode(key: bytes, raw: bytes) -> NodeInfo:
    url, beat, started = msgpack.unpackb(raw)
    return NodeInfo(key[len(PREFIX):].decode(), str(url), int(beat), int(started))


def _encode(info: NodeInfo) -> bytes:
    packed: bytes = msgpack.packb([info.url, info.heartbeat_ns, info.started_ns])
    return packed


def register(meta: MetaStore, node: str, url: str, *, now_ns: int | None = None) -> NodeInfo:
    """Record that ``node`` (re)started and serves its peer door at ``url``; its previous
    entry, if any, is replaced (a restart)."""
    now = time.time_ns() if now_ns is None else now_ns
    info = NodeInfo(node, url, now, now)
    with meta.write() as tx:
        tx.kv.put(_key(node), _encode(info))
    return info


def beat(meta: MetaStore, mine: NodeInfo, *, now_ns: int | None = None) -> bool:
    """Refresh the heartbeat of the entry ``mine`` (what :func:`register` returned).  False
    when the stored entry is another process's (another daemon registered under the same
    name since, or the entry was removed): the entry is then written back as ours, and the
    caller reports the clash; two daemons must never share a node name."""
    now = time.time_ns() if now_ns is None else now_ns
    key = _key(mine.node)
    with meta.write() as tx:
        raw = tx.kv.get(key)
        ours = raw is not None and _decode(key, raw).started_ns == mine.started_ns
        tx.kv.put(key, _encode(NodeInfo(mine.node, mine.url, now, mine.started_ns)))
    return ours


def lookup(meta: MetaStore, node: str) -> NodeInfo | None:
    """The registry entry of ``node``, or None when it never registered."""
    key = _key(node)
    with meta.snapshot() as tx:
        raw = tx.kv.get(key)
    return None if raw is None else _decode(key, raw)


def list_nodes(meta: MetaStore) -> list[NodeInfo]:
    """Every registered node, by name."""
    with meta.snapshot() as tx:
        return [_decode(k, v) for k, v in tx.kv.scan(PREFIX, prefix_end(PREFIX))]


def unregister(meta: MetaStore, node: str) -> bool:
    """Remove ``node``'s entry (a node leaving the cluster for good); True if it existed."""
    with meta.write() as tx:
        return tx.kv.delete(_key(node))


def alive(info: NodeInfo, now_ns: int | None = None, lease_s: float = LEASE_S) -> bool:
    """Whether ``info``'s node beat within the last ``lease_s`` seconds."""
    now = time.time_ns() if now_ns is None else now_ns
    return now - info.heartbeat_ns <= int(lease_s * 1e9)


def age_s(info: NodeInfo, now_ns: int | None = None) -> float:
    """Seconds since ``info``'s last heartbeat (for messages)."""
    now = time.time_ns() if now_ns is None else now_ns
    return (now - info.heartbeat_ns) / 1e9


class Heartbeat:
    """Keeps one node's registry entry fresh: :func:`beat` every ``interval_s`` seconds in
    a worker thread.  A failed beat (the database unreachable) is logged and retried at the
    next interval: the node stays up, and the other nodes see its heartbeat age."""

    def __init__(self, meta: MetaStore, mine: NodeInfo, interval_s: float = HEARTBEAT_S) -> None:
        self.meta = meta
        self.mine = mine
        self.interval_s = interval_s
        self.beats = 0  # successful beats (for tests and status)
        self.failures = 0  # failed beats
        self._task: asyncio.Task[None] | None = None
        self._clash_logged = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"tierd-peer-heartbeat-{self.mine.node}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def beat_once(self) -> None:
        """One beat, now (off the event loop)."""
        ours = await asyncio.to_thread(beat, self.meta, self.mine)
        self.beats += 1
        if not ours and not self._clash_logged:
            self._clash_logged = True
            log.error("node %r: its registry entry was written by another process (another "
                      "daemon with the same node_name?); node names must be unique",
                      self.mine.node)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.beat_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the database may be down for a while: keep trying
                self.failures += 1
                log.warning("node %r: heartbeat failed: %s", self.mine.node, e)
