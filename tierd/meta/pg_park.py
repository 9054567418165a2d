"""Read transactions over PostgreSQL that end without a round trip of their own.

Ending a read-only transaction cannot fail or change anything; until it ends it only holds its
snapshot.  So a read transaction's end (:meth:`tierd.meta.pg_engine.PgTxn.commit` or
``abort``) keeps its connection here, the transaction still open on the server, and the next
begin takes it and sends the ``COMMIT`` in the same message as its own ``BEGIN``: a read
transaction costs one round trip, not two.  A sweeper thread ends what waited longer than
:data:`PARK_S` (the open snapshot holds back the server's vacuum meanwhile: keep it short).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

#: seconds a parked connection waits for the next begin before the sweeper ends it
PARK_S = 0.2


class Parking:
    """The parked connections of one engine's ``pool`` (see the module doc)."""

    def __init__(self, pool: ConnectionPool[psycopg.Connection[Any]]) -> None:
        self._pool = pool
        self._parked: list[tuple[psycopg.Connection[Any], float]] = []
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None
        self._closed = threading.Event()

    def park(self, conn: psycopg.Connection[Any]) -> None:
        """Keep ``conn``, its read transaction open, for the next :meth:`take`."""
        with self._lock:
            if not self._closed.is_set():
                self._parked.append((conn, time.monotonic()))
                if self._sweeper is None:
                    self._sweeper = threading.Thread(target=self._sweep, daemon=True,
                                                     name="tierd-pg-park")
                    self._sweeper.start()
                return
        self._end(conn)

    def take(self) -> psycopg.Connection[Any] | None:
        """A parked connection (its ``COMMIT`` is the caller's to send), if any."""
        with self._lock:
            return self._parked.pop()[0] if self._parked else None

    def _sweep(self) -> None:
        while True:
            self._closed.wait(PARK_S / 2)
            now = time.monotonic()
            with self._lock:
                closing = self._closed.is_set()
                old = [c for c, t in self._parked if closing or now - t >= PARK_S]
                self._parked = [(c, t) for c, t in self._parked
                                if not closing and now - t < PARK_S]
                done = not self._parked
                if done:
                    self._sweeper = None
            for conn in old:
                self._end(conn)
            if done:
                return

    def _end(self, conn: psycopg.Connection[Any]) -> None:
        try:
            conn.execute(b"COMMIT")
        except psycopg.Error:
            conn.close()
        self._pool.putconn(conn)

    def close(self) -> None:
        """End every parked transaction; later parks end at once."""
        with self._lock:
            self._closed.set()
            parked, self._parked = self._parked, []
            sweeper = self._sweeper
        for conn, _ in parked:
            self._end(conn)
        if sweeper is not None:
            sweeper.join(5)
