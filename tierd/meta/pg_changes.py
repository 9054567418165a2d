"""The change feed of the shared PostgreSQL store: other nodes' commits, in order, without gaps.

Every write commit logs its keys in ``kv_log`` under its seq and sends ``NOTIFY tierd_changes``
(:mod:`tierd.meta.pg_engine`).  A node that caches what it read (its kernel's attribute and
entry caches through FUSE, its own :class:`~tierd.meta.pg_cache.ReadCache`) learns here what
other nodes changed, so it can drop the stale parts at once instead of at their timeouts.

A :class:`ChangeFeed` runs one thread with one dedicated connection (never a pooled one: a
``LISTEN`` belongs to a session).  It keeps a cursor (the last seq it delivered) and reads the
log after it, by seq, whenever a notification arrives and at least every ``poll`` seconds --
notifications are only a wake-up: one lost (they are not sent to a session that was not
connected at the commit) costs at most ``poll`` seconds, never a change.  For each row it:

* applies the keys to the store's read cache (this node's own commits included; the cache
  then does not wait for this node's next transaction to drop them);
* calls ``callback(seq, keys)`` unless the row is this node's own commit (``keys`` None: "the
  commit changed too many keys to list; anything may have changed").

A notification names its commit's seq, and (:func:`tierd.meta.pg_sql.commit_query`) its node
and keys: a notification that follows the cursor without a gap is delivered from its payload,
with no read of the log (over three nodes each commit cost every node's feed a query: ~1.2
statements per FUSE create).  Anything else -- a gap, a payload with the seq alone (a large
commit's, one too long for a payload, an older tierd's) -- reads the log as before.

While it follows the log, the feed also says whether this node knows of every commit the
database announced (:meth:`ChangeFeed.current`): connected, no announced commit left to
deliver, and a read of the log completed within ``poll`` + :data:`SLACK` seconds.  Reads
whose answers are already bounded by this feed (a FUSE lookup or getattr, whose kernel caches
only the feed invalidates: :mod:`tierd.meta.pg_quiet`) are answered from the read cache then.

If the log was trimmed past the cursor (the node was disconnected longer than the log keeps),
the cache is dropped and the callback gets ``(seq, None)`` for the stretch that is gone.  A
broken connection (a database restart) is reconnected with a growing pause (0.1 s to 2 s),
and the log is read from the cursor again, so nothing is skipped and nothing is repeated.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from tierd.meta.pg_cache import ReadCache

log = logging.getLogger(__name__)

#: ``callback(seq, keys)``: the commit ``seq`` of another node changed ``keys`` (None: anything)
FeedCallback = Callable[[int, list[bytes] | None], None]

#: how much older than ``poll`` the last completed read of the log may be while the feed
#: still counts as current (:meth:`ChangeFeed.current`)
SLACK = 1.0
_ROWS = b"SELECT seq, node, keys FROM kv_log WHERE seq > %s ORDER BY seq LIMIT %s"
_BATCH = 1000


class ChangeFeed:
    """See the module doc.  :meth:`start` once, :meth:`close` once."""

    def __init__(self, url: str, node: str, cache: ReadCache | None,
                 callback: FeedCallback, *, poll: float = 1.0) -> None:
        self.url = url
        self.node = node
        self.cache = cache
        self.callback = callback
        self.poll = poll
        #: the last seq delivered (None until the first connection read the current seq)
        self.cursor: int | None = None
        #: set once the feed listens (commits after this are delivered); for tests and startup
        self.ready = threading.Event()
        #: connections made (1 + reconnects) and full invalidations sent, for status and tests
        self.connects = 0
        self.gaps = 0
        #: the highest seq announced to this feed (a notification's, or the log's), when
        #: its last read of the log completed (monotonic), whether it is connected; and
        #: commits delivered from a notification's payload (no read of the log)
        self.heard = -1
        self.checked = 0.0
        self.connected = False
        self.from_payload = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tierd-pg-changes",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread (within about a quarter second: it waits in short slices)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def current(self) -> bool:
        """Whether every commit announced to this node so far is delivered (the read cache
        stands past it) and the feed's connection answered within ``poll`` + SLACK s."""
        cursor = self.cursor
        return (self.connected and not self._stop.is_set() and cursor is not None
                and cursor >= self.heard
                and time.monotonic() - self.checked < self.poll + SLACK)

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        pause = 0.1
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                    self._listen(conn)
                    pause = 0.1
                    self._follow(conn)
            except psycopg.Error as e:
                self.connected = False
                if self._stop.is_set():
                    return
                log.warning("metadata change feed lost its connection (retrying in %.1f s):"
                            " %s", pause, e)
            except Exception:  # a bug: keep the feed alive rather than go silent
                self.connected = False
                log.exception("metadata change feed failed (retrying)")
            self._stop.wait(pause)
            pause = min(pause * 2, 2.0)

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(b"LISTEN tierd_changes")
        if self.cursor is None:
            row = conn.execute(b"SELECT seq FROM meta_schema").fetchone()
            self.cursor = int(row[0]) if row is not None else 0
        self.connects += 1
        self.heard = max(self.heard, self.cursor)
        self.connected = True
        self.ready.set()

    def _follow(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stop.is_set():
            self._read(conn)
            deadline = time.monotonic() + self.poll
            behind = False
            while not behind and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for note in conn.notifies(timeout=min(left, 0.25), stop_after=1):
                    behind = not self._notified(note.payload)

    def _notified(self, payload: str) -> bool:
        """Deliver the commit a notification announces from its payload (``seq/node/keys``,
        keys in hex, comma separated); False when the log must be read instead."""
        head, _, rest = payload.partition("/")
        try:
            seq = int(head)
        except ValueError:
            return False
        self.heard = max(self.heard, seq)
        cursor = self.cursor
        if cursor is None or seq != cursor + 1 or not rest:
            return cursor is not None and seq <= cursor  # (delivered by a read already)
        node, _, listed = rest.partition("/")
        try:
            names = [bytes.fromhex(k) for k in listed.split(",")]
        except ValueError:
            return False
        self._row(seq, node, names)
        self.from_payload += 1
        return True

    def _read(self, conn: psycopg.Connection[Any]) -> None:
        """Deliver every logged commit after the cursor, in order."""
        assert self.cursor is not None
        while not self._stop.is_set():
            rows = conn.execute(_ROWS, (self.cursor, _BATCH), binary=True).fetchall()
            if rows:
                self.heard = max(self.heard, int(rows[-1][0]))
            else:
                self.checked = time.monotonic()
                return
            first = int(rows[0][0])
            if first != self.cursor + 1:  # trimmed away while we were not looking
                self.gaps += 1
                log.warning("metadata change log was trimmed past this node's cursor "
                            "(%d < %d): every cached entry is dropped", self.cursor, first - 1)
                if self.cache is not None:
                    self.cache.drop_all(first - 1)
                self._deliver(first - 1, None)
                self.cursor = first - 1
            for seq, node, keys in rows:
                self._row(int(seq), node, [bytes(k) for k in keys])
            if len(rows) < _BATCH:
                self.checked = time.monotonic()
                return

    def _row(self, seq: int, node: str, names: list[bytes]) -> None:
        """One commit, the next after the cursor: to the cache, then to the callback."""
        if self.cache is not None:
            self.cache.apply(seq, names)
        if node != self.node:
            self._deliver(seq, names or None)
        self.cursor = seq

    def _deliver(self, seq: int, keys: list[bytes] | None) -> None:
        try:
            self.callback(seq, keys)
        except Exception:
            log.exception("metadata change feed callback failed at seq %d", seq)


def start_feed(feed: ChangeFeed, feeds: list[ChangeFeed]) -> Callable[[], None]:
    """Start ``feed`` as one of a store's ``feeds``; the function that stops it."""
    feeds.append(feed)
    feed.start()

    def stop() -> None:
        feed.close()
        if feed in feeds:
            feeds.remove(feed)
    return stop
