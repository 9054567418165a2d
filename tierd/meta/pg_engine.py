"""A shared metadata engine on PostgreSQL (psycopg 3), behind the :mod:`tierd.meta.kv` contract.

lmdb is embedded: one node, one namespace.  Several nodes share one namespace only through an
engine they all reach over the network; this one speaks the PostgreSQL protocol and uses
nothing but core SQL (no extension, no advisory lock), so PostgreSQL-compatible databases can
serve it too.  Selected with the ``meta_url`` setting (``postgresql://user@host:port/db``);
see docs/metadata.md, "PostgreSQL engine".

Layout: one table ``kv(k bytea primary key, v bytea not null)`` -- ``bytea`` compares byte by
byte, so ``ORDER BY k`` is the contract's key order -- and ``meta_schema(version)``, one row,
created or migrated when the store opens.

Transactions:

* **Reads** are ``REPEATABLE READ READ ONLY``: a snapshot.  PostgreSQL takes the snapshot at
  the first statement, not at ``BEGIN``, so :meth:`PgStore.begin` runs one at once (in the
  same round trip): a reader begun before a writer commits never sees that commit.
* **Writes** are serialized, as the contract says (one writer at a time): a writer first locks
  the ``meta_schema`` row (``SELECT ... FOR UPDATE``), so writers of every node that shares
  the database queue there, and then runs ``READ COMMITTED``: with every writer behind the same
  lock nothing commits while it holds it, so each statement sees exactly the state at its
  lock plus its own writes.  (Under ``REPEATABLE READ`` its snapshot would predate the lock
  and miss the writer it waited for.)  No serialization failure can occur in a transaction
  body; the interface could not replay one anyway (the caller's code ran between the
  statements).  ``begin`` retries a connection that broke while idle in the pool.
* Puts are buffered (a get or delete of a buffered key is answered from the buffer; of any
  other key the server answers, unaffected by the buffer) and sent in one pipelined batch
  before the next scan page or the commit: a group-commit flush
  (:mod:`tierd.meta.group_engine`) of a thousand keys costs a few round trips, not a
  thousand.
* A commit is durable when it returns (the server's ``synchronous_commit``), so :meth:`sync`
  has nothing to do.  A database error inside a transaction becomes ``FsError(EIO)``; the
  transaction is rolled back whole (if the connection broke during ``COMMIT`` itself, the
  outcome is the server's and the error says so).

Range scans page by key (``k >= $lo AND k < $hi ORDER BY k LIMIT n``, resuming after the last
key returned), so they are lazy, see the transaction's own writes made between pages (as the
memory engine does), and hold no server-side cursor across the caller's writes.

Every call is a network round trip: the caller runs it in a thread, or measures what one costs
on its event loop (bench/meta_engines.py; the figures are in docs/metadata.md).
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from tierd.errors import FsError
from tierd.meta.kv import KVStore, KVTxn

log = logging.getLogger(__name__)

#: the layout this code reads; :func:`_migrate` brings an older database up to it
PG_SCHEMA_VERSION = 1
#: keys fetched by a scan's first page; later pages double up to _SCAN_MAX, so taking a few
#: entries costs one small query and a full scan few round trips
_SCAN_FIRST = 64
_SCAN_MAX = 2048
#: puts buffered before they are sent anyway, so a transaction of millions (tierd meta load)
#: holds a bounded amount of memory
_PENDING_MAX = 4096
#: no lmdb-like map: the database's own limits apply; the group commit only needs a figure
#: far larger than a group (headroom is what admission compares with)
_HEADROOM = 1 << 50

_BEGIN_READ = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1"
_BEGIN_WRITE = (b"BEGIN ISOLATION LEVEL READ COMMITTED; "
                b"SELECT version FROM meta_schema FOR UPDATE")
_GET = b"SELECT v FROM kv WHERE k = %b"
_PUT = b"INSERT INTO kv (k, v) VALUES (%b, %b) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
_DELETE = b"DELETE FROM kv WHERE k = %b"
_SCAN_UP = b"SELECT k, v FROM kv WHERE k >= %b ORDER BY k LIMIT %s"
_SCAN_UP_END = b"SELECT k, v FROM kv WHERE k >= %b AND k < %b ORDER BY k LIMIT %s"
_SCAN_DOWN = b"SELECT k, v FROM kv WHERE k >= %b ORDER BY k DESC LIMIT %s"
_SCAN_DOWN_END = b"SELECT k, v FROM kv WHERE k >= %b AND k < %b ORDER BY k DESC LIMIT %s"
_AFTER = b"SELECT k, v FROM kv WHERE k > %b ORDER BY k LIMIT %s"
_AFTER_END = b"SELECT k, v FROM kv WHERE k > %b AND k < %b ORDER BY k LIMIT %s"


def _io_error(e: psycopg.Error, doing: str) -> FsError:
    return FsError(errno.EIO, f"metadata database error while {doing}: "
                   f"{type(e).__name__}: {e}".rstrip())


def _migrate(conn: psycopg.Connection[Any]) -> None:
    """Create the tables, or bring an older layout up to :data:`PG_SCHEMA_VERSION`; refuse
    a newer one (a newer tierd wrote it)."""
    with conn.transaction():
        conn.execute("CREATE TABLE IF NOT EXISTS kv (k bytea PRIMARY KEY, v bytea NOT NULL)")
        conn.execute("CREATE TABLE IF NOT EXISTS meta_schema (version integer NOT NULL)")
        row = conn.execute("SELECT version FROM meta_schema FOR UPDATE").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta_schema (version) VALUES (%s)",
                         (PG_SCHEMA_VERSION,))
            return
        found = int(row[0])
        if found > PG_SCHEMA_VERSION:
            raise RuntimeError(f"the metadata database has layout version {found}; this tierd "
                               f"reads version {PG_SCHEMA_VERSION} (upgrade tierd)")
        # versions 1..found-1 -> found: none yet; each future step goes here, in order
        if found < PG_SCHEMA_VERSION:
            conn.execute("UPDATE meta_schema SET version = %s", (PG_SCHEMA_VERSION,))


class PgTxn(KVTxn):
    def __init__(self, store: PgStore, write: bool, conn: psycopg.Connection[Any]) -> None:
        self.write = write
        self._store = store
        self._conn = conn
        self._pending: dict[bytes, bytes] = {}  # puts not yet sent (see the module doc)
        self._done = False

    def _check(self) -> None:
        if self._done:
            raise RuntimeError("transaction already ended")

    def _send_puts(self) -> None:
        if self._pending:
            items, self._pending = list(self._pending.items()), {}
            with self._conn.cursor() as cur:
                cur.executemany(_PUT, items)

    def _query(self, query: bytes, params: tuple[Any, ...], doing: str,
               *, send_puts: bool = False) -> list[Any]:
        """Run ``query`` (after the buffered puts, when it could see their keys: scans);
        rows, or rowcount as ``[n]`` for DML."""
        try:
            if send_puts:
                self._send_puts()
            cur = self._conn.execute(query, params, binary=True)
            return cur.fetchall() if cur.description is not None else [cur.rowcount]
        except psycopg.Error as e:
            self._fail()
            raise _io_error(e, doing) from e

    def get(self, key: bytes) -> bytes | None:
        self._check()
        if key in self._pending:
            return self._pending[key]
        rows = self._query(_GET, (bytes(key),), "reading a key")
        return bytes(rows[0][0]) if rows else None

    def put(self, key: bytes, value: bytes) -> None:
        self._check()
        if not self.write:
            raise PermissionError("write in a read-only transaction")
        self._pending[bytes(key)] = bytes(value)
        if len(self._pending) >= _PENDING_MAX:  # a huge transaction (a load) streams
            try:
                self._send_puts()
            except psycopg.Error as e:
                self._fail()
                raise _io_error(e, "writing keys") from e

    def delete(self, key: bytes) -> bool:
        self._check()
        if not self.write:
            raise PermissionError("write in a read-only transaction")
        pending = self._pending.pop(key, None) is not None
        # (a pending put over an absent key: the DELETE finds nothing, yet it existed)
        rows = self._query(_DELETE, (bytes(key),), "deleting a key")
        return pending or rows[0] > 0

    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        start = bytes(start)
        if end is not None and end <= start:
            return
        limit, hi = _SCAN_FIRST, end
        lo: bytes | None = None  # forward: the last key returned (resume after it)
        while not self._done:
            if reverse:
                q, p = ((_SCAN_DOWN, (start, limit)) if hi is None
                        else (_SCAN_DOWN_END, (start, hi, limit)))
            elif lo is None:
                q, p = ((_SCAN_UP, (start, limit)) if end is None
                        else (_SCAN_UP_END, (start, end, limit)))
            else:
                q, p = (_AFTER, (lo, limit)) if end is None else (_AFTER_END, (lo, end, limit))
            rows = self._query(q, p, "scanning keys", send_puts=True)
            for k, v in rows:
                yield bytes(k), bytes(v)
            if len(rows) < limit:
                return
            if reverse:
                hi = bytes(rows[-1][0])
            else:
                lo = bytes(rows[-1][0])
            limit = min(limit * 2, _SCAN_MAX)

    def commit(self) -> None:
        if self._done:
            return
        try:
            self._send_puts()
            self._conn.execute(b"COMMIT")
        except psycopg.Error as e:
            self._fail()
            why = "committing"
            if isinstance(e, psycopg.OperationalError):
                why += " (if the connection broke during COMMIT it may have been applied)"
            raise _io_error(e, why) from e
        self._end()

    def abort(self) -> None:
        if self._done:
            return
        self._pending = {}
        try:
            self._conn.execute(b"ROLLBACK")
        except psycopg.Error:
            self._fail()  # the server rolls back a transaction whose connection is gone
            return
        self._end()

    def _end(self) -> None:
        self._done = True
        self._store._release(self, self._conn, broken=False)

    def _fail(self) -> None:
        """An error ends the transaction: roll back (best effort) and hand the connection
        back, closed when it is broken."""
        if self._done:
            return
        self._done = True
        self._pending = {}
        broken = self._conn.broken or self._conn.closed
        if not broken:
            try:
                self._conn.execute(b"ROLLBACK")
            except psycopg.Error:
                broken = True
        self._store._release(self, self._conn, broken=broken)


class PgStore(KVStore):
    """Metadata in a PostgreSQL database reached at ``url``."""

    name = "pg"
    space_hint = "delete something, or give the metadata database more space"

    def __init__(self, url: str, *, pool_size: int = 16, timeout: float = 30.0) -> None:
        self.url = url
        self._writer = threading.Lock()  # this process's writers queue here, not in a socket
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url, min_size=1, max_size=pool_size, timeout=timeout, open=False,
            kwargs={"autocommit": True}, name="tierd-meta")
        # first one connection of our own: an unreachable server or a refused login is
        # psycopg's own message ("connection refused", "password authentication failed")
        # rather than the pool's "initialization incomplete"
        with psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout))) as c:
            _migrate(c)
        self._pool.open(wait=True, timeout=timeout)

    def begin(self, write: bool = False) -> KVTxn:
        if write:
            self._writer.acquire()
        try:
            return self._begin(write)
        except BaseException:
            if write:
                self._writer.release()
            raise

    def _begin(self, write: bool) -> PgTxn:
        # after a database restart every pooled connection is broken: try them all
        tries = self._pool.max_size + 1
        for attempt in range(tries):
            conn = self._pool.getconn()
            try:
                conn.execute(_BEGIN_WRITE if write else _BEGIN_READ)
            except psycopg.OperationalError as e:
                # most often a connection the server closed while it idled (a restart)
                conn.close()
                self._pool.putconn(conn)
                if attempt + 1 == tries:
                    raise _io_error(e, "starting a transaction") from e
                log.info("metadata database connection failed at BEGIN, retrying: %s", e)
                continue
            except psycopg.Error as e:
                self._pool.putconn(conn)
                raise _io_error(e, "starting a transaction") from e
            return PgTxn(self, write, conn)
        raise AssertionError("unreachable")

    def _release(self, txn: PgTxn, conn: psycopg.Connection[Any], *, broken: bool) -> None:
        if broken and not conn.closed:
            conn.close()
        self._pool.putconn(conn)  # the pool replaces a closed connection
        if txn.write:
            self._writer.release()

    def sync(self) -> None:
        return None  # every commit is durable when it returns

    def close(self) -> None:
        self._pool.close()

    def stat(self) -> dict[str, int]:
        try:
            with self._pool.connection() as conn:
                row = conn.execute("SELECT (SELECT count(*) FROM kv), "
                                   "pg_total_relation_size('kv')").fetchone()
        except psycopg.Error:
            return {}
        return {} if row is None else {"entries": int(row[0]), "used_bytes": int(row[1])}

    def headroom(self) -> int:
        return _HEADROOM
