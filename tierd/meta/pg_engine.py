"""A shared metadata engine on PostgreSQL (psycopg 3), behind the :mod:`tierd.meta.kv` contract.

lmdb is embedded: one node, one namespace.  Several nodes share one namespace only through an
engine they all reach over the network; this one speaks the PostgreSQL protocol and uses
nothing but core SQL (no extension, no advisory lock), so PostgreSQL-compatible databases can
serve it too.  Selected with the ``meta_url`` setting (``postgresql://user@host:port/db``);
see docs/metadata.md, "PostgreSQL engine".

Layout (version 2; :func:`tierd.meta.pg_sql.migrate` creates it, or brings version 1 up to it,
at open):

* ``kv(k bytea primary key, v bytea not null)`` -- ``bytea`` compares byte by byte, so
  ``ORDER BY k`` is the contract's key order;
* ``meta_schema(version, seq)``, one row: the layout version, and ``seq``, the number of the
  last write commit (every commit that wrote something bumps it);
* ``kv_log(seq bigint primary key, node text, keys bytea[])``: for each write commit, the node
  that made it and the keys it put or deleted (an empty array: too many to list, "everything
  changed").  Trimmed to the last ``log_keep`` rows by the writers.  It is what keeps every
  node's read cache (:mod:`tierd.meta.pg_cache`) exact, and it is the change feed
  (:mod:`tierd.meta.pg_changes`); each commit also sends ``NOTIFY tierd_changes``, with its
  seq, node and keys (:func:`tierd.meta.pg_sql.payload`).

Transactions:

* **Reads** are ``REPEATABLE READ READ ONLY``: a snapshot.  PostgreSQL takes the snapshot at
  the first statement, not at ``BEGIN``, so :meth:`PgStore.begin` runs one at once: ``SELECT
  seq FROM meta_schema``, which also says which commit the snapshot ends at.  A reader begun
  before a writer commits never sees that commit.  Ending a read transaction sends nothing:
  its ``COMMIT`` goes out in the same message as the connection's next ``BEGIN`` (or a sweeper
  sends it after 0.2 s), so a read transaction whose gets the cache answers is one round trip.
* **Writes** are serialized, as the contract says (one writer at a time): a writer first locks
  the ``meta_schema`` row (``SELECT seq ... FOR UPDATE``), so writers of every node that shares
  the database queue there, and then runs ``READ COMMITTED``: with every writer behind the same
  lock nothing commits while it holds it, so each statement sees exactly the state at its
  lock (seq) plus its own writes.  (Under ``REPEATABLE READ`` its snapshot would predate the
  lock and miss the writer it waited for.)  No serialization failure can occur in a transaction
  body; the interface could not replay one anyway (the caller's code ran between the
  statements).  ``begin`` retries a connection that broke while idle in the pool.
* **The read cache.**  The begin's round trip also fetches the log rows after the cache's seq
  (when the cache holds anything), so the cache drops what other nodes changed and stands at
  the transaction's seq; gets are then answered by the cache when they can, and what the
  server answers fills it.  A transaction whose snapshot is older than the cache reads the
  server (see :mod:`tierd.meta.pg_cache`): snapshot semantics stay exact across nodes.  A
  node's repeated reads of an unchanged key cost no round trip.  Scans read the server.
* Puts and deletes are buffered (a get of a written key is answered from the buffer; a delete
  learns whether the key exists from a get, usually the cache) and sent in one pipelined batch
  before the next scan page or the commit.  A writing commit sends, in the same pipeline, the
  buffered writes, the seq bump, the log row, the ``NOTIFY`` and ``COMMIT``: one round trip.
* A commit is durable when it returns (the server's ``synchronous_commit``), so :meth:`sync`
  has nothing to do.  A database error inside a transaction becomes ``FsError(EIO)``; the
  transaction is rolled back whole (if the connection broke during ``COMMIT`` itself, the
  outcome is the server's and the error says so; the cache is not touched then, and the next
  transaction learns the outcome from the seq).

Range scans page by key (``k >= $lo AND k < $hi ORDER BY k LIMIT n``, resuming after the last
key returned), so they are lazy, see the transaction's own writes made between pages (as the
memory engine does), and hold no server-side cursor across the caller's writes.

Every call that misses the cache is a network round trip.  The daemon begins and commits its
transactions off the event loop (:meth:`PgStore.abegin`, :meth:`PgStore.aend`:
:mod:`tierd.meta.pg_async`), and makes the reads a body names at its begin there too
(:mod:`tierd.meta.pg_warm`); any other get that misses the cache inside a body runs on the
loop (bench/meta_engines.py and bench/loop_lag.py measure them; figures in docs/metadata.md).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, wait
from typing import Any

import psycopg
from psycopg import errors, generators, pq
from psycopg_pool import ConnectionPool

from tierd.errors import FsError
from tierd.meta.kv import KVStore, KVTxn, prefix_end
from tierd.meta.pg_async import AsyncGate, WriterLock
from tierd.meta.pg_cache import ReadCache
from tierd.meta.pg_changes import ChangeFeed, FeedCallback, start_feed
from tierd.meta.pg_group import Undo, finish_pending
from tierd.meta.pg_park import Parking
from tierd.meta.pg_sql import (
    CHANNEL,
    NODE,
    PG_SCHEMA_VERSION,  # re-exported: the layout version callers check
    SCANS,
    commit_query,
    contiguous,
    migrate,
    prepare,
    results,
    write_statements,
)
from tierd.meta.pg_warm import READ_MAX, Warm, page, prefetch, warm_txn

log = logging.getLogger(__name__)

__all__ = ["CHANNEL", "DEFAULT_LOG_KEEP", "PG_SCHEMA_VERSION", "PgStore", "PgTxn"]

#: keys fetched by a scan's first page; later pages double up to _SCAN_MAX, so taking a few
#: entries costs one small query and a full scan few round trips
_SCAN_FIRST = 64
_SCAN_MAX = 2048
#: writes buffered before they are sent anyway, so a transaction of millions (tierd meta
#: load) holds a bounded amount of memory
_PENDING_MAX = 4096
#: keys a writer remembers for the log and the cache; beyond, its log row says "everything"
#: (an empty array) and every node drops its whole cache
_TRACK_MAX = 10_000
#: log rows a begin fetches to bring the cache up; further behind, the cache is dropped
_LOG_FETCH_MAX = 512
#: a commit whose unsent writes are at most this many bytes goes as one inline query
_INLINE_MAX = 256 << 10
#: log rows kept (each commit's keys); a node whose cache or feed is further behind than
#: this drops its cache (a full invalidation)
DEFAULT_LOG_KEEP = 100_000
#: no lmdb-like map: the database's own limits apply; the group commit only needs a figure
#: far larger than a group (headroom is what admission compares with)
_HEADROOM = 1 << 50

# A begin is one simple-protocol query of several statements: one message each way, about
# half what psycopg's pipeline mode costs for the same statements.  Its reads are statements
# each pooled connection prepares once (pg_sql.prepare), so they are not planned again each time.
# The reader's snapshot is taken by its first statement, which reads the seq and the log after
# the cache's seq together; the writer reads the log in a statement of its own, after the lock
# (a READ COMMITTED statement begun before the wait would miss the commits it waited for).
_BEGIN_READ = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
_BEGIN_WRITE = b"BEGIN ISOLATION LEVEL READ COMMITTED; EXECUTE tierd_lock"
_SEQ_READ = b"EXECUTE tierd_seq"
_SEQ_LOG_READ = b"EXECUTE tierd_seq_log(%d, %d)"
_LOG_SINCE = b"; EXECUTE tierd_log(%d, %d)"
_HOT = b"; EXECUTE tierd_hot(ARRAY[%s]::bytea[])"
_BUMP = b"UPDATE meta_schema SET seq = %s"
_LOG = b"INSERT INTO kv_log (seq, node, keys) VALUES (%s, %s, %s::bytea[])"
_TRIM = b"DELETE FROM kv_log WHERE seq <= %d"
_GET = b"SELECT v FROM kv WHERE k = %b"
_PUT = b"INSERT INTO kv (k, v) VALUES (%b, %b) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
_DELETE = b"DELETE FROM kv WHERE k = %b"


def _io_error(e: psycopg.Error, doing: str) -> FsError:
    return FsError(errno.EIO, f"metadata database error while {doing}: "
                   f"{type(e).__name__}: {e}".rstrip())


class PgTxn(KVTxn):
    def __init__(self, store: PgStore, write: bool, conn: psycopg.Connection[Any],
                 seq: int, cached: bool) -> None:
        self.write = write
        self._store = store
        self._conn = conn
        #: the commit this transaction's state ends at (a writer: the lock's)
        self.seq = seq
        #: whether the store's cache stood at ``seq`` at begin (see pg_cache)
        self._cached = cached
        self._unsent: dict[bytes, bytes | None] = {}  # writes not yet sent (None: delete)
        #: every write of this transaction (None once there are too many to remember)
        self._written: dict[bytes, bytes | None] | None = {}
        self._done = False
        #: what this transaction read from the server, prefetched ones included
        #: (:mod:`tierd.meta.pg_warm`): answers that hold for its whole life even after the
        #: shared cache moved on; None once its writes are too many to track
        self.read: dict[bytes, bytes | None] | None = {}
        #: scan pages read, and their rows (:func:`tierd.meta.pg_warm.page`)
        self.pages: dict[tuple[bytes, tuple[Any, ...]], list[Any]] | None = {}
        self.paged = 0
        #: called once when an async transaction ends (:mod:`tierd.meta.pg_async`)
        self.on_end: Callable[[], None] | None = None
        # group commit (:mod:`tierd.meta.pg_group`): the running member's undo record, the
        # savepoint taken before its first send, and the group's commit while it is offered
        self.undo: dict[bytes, Undo] | None = None
        self.before_send: Callable[[], None] | None = None
        self.member_sent = False
        self.finish: Callable[[], None] | None = None
        #: prefixes no key starts with at the commit (:meth:`empty_prefix`)
        self.empty: list[bytes] = []
        #: the commit went out already (:meth:`send_commit`); :meth:`commit` waits for it
        self._sent = False

    def _check(self) -> None:
        if self._done:
            raise RuntimeError("transaction already ended")

    def _send_writes(self) -> None:
        if self._unsent:
            if self.before_send is not None:
                hook, self.before_send = self.before_send, None
                hook()
            small = self._unsent_bytes() <= _INLINE_MAX
            items, self._unsent = self._unsent, {}
            if small:  # one message (a statement per key cost ~8 an unlink)
                self._conn.execute(b"; ".join(write_statements(items)))
                return
            puts = [(k, v) for k, v in items.items() if v is not None]
            dels = [(k,) for k, v in items.items() if v is None]
            with self._conn.cursor() as cur:
                if puts:
                    cur.executemany(_PUT, puts)
                if dels:
                    cur.executemany(_DELETE, dels)

    def _query(self, query: bytes, params: tuple[Any, ...], doing: str,
               *, send_writes: bool = False) -> list[Any]:
        """Run ``query`` (after the buffered writes, when it could see their keys: scans)."""
        try:
            if send_writes:
                self._send_writes()
            return self._conn.execute(query, params, binary=True).fetchall()
        except psycopg.Error as e:
            self._fail()
            raise _io_error(e, doing) from e

    def local(self, key: bytes, keep: bool = False) -> tuple[bool, bytes | None]:
        """``(True, value)`` when ``key`` is answered without the server: this transaction's
        writes, what it read already, the node's cache (with ``keep``, an answer of the cache
        is kept in :attr:`read`: a prefetch's, which the cache may have dropped before the
        body reads it)."""
        if self.write:
            if key in self._unsent:
                return True, self._unsent[key]
            if self._written is not None and key in self._written:
                return True, self._written[key]
        read = self.read
        if read is not None and key in read:
            return True, read[key]
        if not self._cached:
            return False, None
        hit, value = self._store.cache.lookup(self.seq, key)
        if hit and keep and read is not None and len(read) < READ_MAX:
            read[key] = value
        return hit, value

    def absent(self, key: bytes) -> None:
        # kept as this transaction's own answer (what it read holds for its life); only
        # where nothing here knows the key (a write, a read, the cache answer first)
        read = self.read
        key = bytes(key)
        if read is not None and len(read) < READ_MAX and not self.local(key)[0]:
            read[key] = None

    def empty_prefix(self, prefix: bytes) -> None:
        # a rolled-back group member's hint holds too: its number is never used
        if self.write:
            self.empty.append(bytes(prefix))

    def wrote(self, key: bytes) -> bool:
        """Whether this transaction wrote ``key`` (its reads of it answer the write)."""
        return self.write and (key in self._unsent or self._written is None
                               or key in self._written)

    def learn(self, key: bytes, value: bytes | None) -> None:
        """What the server said ``key`` holds in this transaction (never a key it wrote)."""
        read = self.read
        if read is not None and len(read) < READ_MAX:
            read[key] = value
        if self._cached:
            # a writer's server answers never include its own writes here: those keys were
            # answered above (and _cached is off once the writes are too many to remember)
            self._store.cache.fill(self.seq, key, value)

    def get(self, key: bytes) -> bytes | None:
        self._check()
        key = bytes(key)
        hit, value = self.local(key)
        if hit:
            return value
        rows = self._query(_GET, (key,), "reading a key")
        value = bytes(rows[0][0]) if rows else None
        self.learn(key, value)
        return value

    def prefetch(self, keys: list[bytes]) -> None:
        """One query for the ``keys`` nothing here answers (kept up to ``READ_MAX``)."""
        self._check()
        prefetch(self, keys)

    def _record(self, key: bytes, value: bytes | None) -> None:
        if self.undo is not None and key not in self.undo:
            w = self._written
            self.undo[key] = (key in self._unsent, self._unsent.get(key),
                              w is not None and key in w, None if w is None else w.get(key))
        self._unsent[key] = value
        if self._written is not None:
            self._written[key] = value
            if len(self._written) > _TRACK_MAX:
                self._written = None  # logged as "everything"; the cache is off for us
                self._cached = False
                self.read = None  # (it could no longer tell our writes from the server's)
        if len(self._unsent) >= _PENDING_MAX:  # a huge transaction (a load) streams
            try:
                self._send_writes()
            except psycopg.Error as e:
                self._fail()
                raise _io_error(e, "writing keys") from e

    def put(self, key: bytes, value: bytes) -> None:
        self._check()
        if not self.write:
            raise PermissionError("write in a read-only transaction")
        self._record(bytes(key), bytes(value))

    def delete(self, key: bytes) -> bool:
        self._check()
        if not self.write:
            raise PermissionError("write in a read-only transaction")
        key = bytes(key)
        if self.get(key) is None:
            return False
        self._record(key, None)
        return True

    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        start = bytes(start)
        if end is not None and end <= start:
            return
        known = self._complete_scan(start, end)
        if known is not None:
            yield from (reversed(known) if reverse else known)
            return
        limit, hi = _SCAN_FIRST, end
        lo: bytes | None = None  # forward: the last key returned (resume after it)
        while not self._done:
            first = hi if reverse else end
            bound = () if first is None else (first,)
            q = SCANS[reverse, lo is not None, first is not None]
            p = (start if lo is None else lo, *bound, limit)
            rows = page(self, q, p, first)
            for k, v in rows:
                yield bytes(k), bytes(v)
            if len(rows) < limit:
                return
            if reverse:
                hi = bytes(rows[-1][0])
            else:
                lo = bytes(rows[-1][0])
            limit = min(limit * 2, _SCAN_MAX)

    def _complete_scan(self, start: bytes, end: bytes | None,
                       ) -> list[tuple[bytes, bytes]] | None:
        """A scan of a whole complete prefix (a new inode's attributes, listed by its
        unlink) answered from the cache and this transaction's writes, or None."""
        if not self._cached or end is None or end != prefix_end(start):
            return None
        rows = self._store.cache.under(self.seq, start)
        if rows is None:
            return None
        if self.write and self._written:
            mine = {k: v for k, v in self._written.items() if k.startswith(start)}
            if mine:
                merged = dict(rows)
                for k, v in mine.items():
                    if v is None:
                        merged.pop(k, None)
                    else:
                        merged[k] = v
                rows = sorted(merged.items())
        return rows

    def send_commit(self) -> None:
        """Send this writer's commit now, in the caller's thread (the event loop), without
        waiting: :meth:`commit` then only waits for the outcome (in the commit thread).
        The server starts on it at once instead of after the commit thread woke -- one
        thread hop less while this transaction holds the cluster's writer lock.  Only a
        commit that fits one message is sent here; on any error nothing is marked sent and
        :meth:`commit` runs as it would have."""
        if self._done or not self.write or self._sent or self.before_send is not None:
            return
        written = self._written
        query = self._commit_message(written)
        if query is None:
            return
        if written:  # (None never fits one message) a seq the cache waits for
            self._store.cache.expect(self.seq + 1)
        try:
            pgconn = self._conn.pgconn
            pgconn.send_query(query)
            pgconn.flush()  # (what a full socket buffer keeps, commit() sends)
        except psycopg.Error:
            self._store.cache.abandon(self.seq + 1)  # (a no-op without expect)
            return
        self._unsent = {}
        self._sent = True

    def _commit_message(self, written: dict[bytes, bytes | None] | None) -> bytes | None:
        """The commit as one simple-protocol query, or None when it is too large for one
        (its values then go as binary parameters, in a pipeline)."""
        if written is not None and not written:
            return b"COMMIT"
        if written is None or self._unsent_bytes() > _INLINE_MAX:
            return None
        store, new = self._store, self.seq + 1
        trim = new - store.log_keep if new % store.trim_every == 0 else None
        return commit_query(self._unsent, written, new, store.node, trim)

    def _sent_outcome(self) -> None:
        """The outcome of the commit :meth:`send_commit` sent: its results read without
        blocking the thread's waits (psycopg's generator, as ``execute`` reads them); an
        error result raises as ``execute`` would."""
        conn = self._conn
        for res in conn.wait(generators.execute(conn.pgconn)):
            if res.status == pq.ExecStatus.FATAL_ERROR:
                raise errors.error_from_result(res)

    def commit(self) -> None:
        if self._done:
            return
        if not self.write:
            self._park()
            return
        store, conn = self._store, self._conn
        written = self._written
        changed = written is None or bool(written)
        new = self.seq + 1
        if changed and not self._sent:
            store.cache.expect(new)  # (the cache waits for this commit: ReadCache.expect)
        try:
            if self._sent:
                self._sent_outcome()
            elif (query := self._commit_message(written)) is not None:
                self._unsent = {}
                conn.execute(query)
            else:  # large: the values go as binary parameters, in a pipeline
                keys = [] if written is None else list(written)
                with conn.pipeline():
                    self._send_writes()
                    conn.execute(_BUMP, (new,))
                    conn.execute(_LOG, (new, store.node, keys), binary=True)
                    conn.execute(f"NOTIFY {CHANNEL}, '{new}'".encode())
                    if new % store.trim_every == 0:
                        conn.execute(_TRIM % (new - store.log_keep,))
                    conn.execute(b"COMMIT")
        except psycopg.Error as e:
            store.cache.abandon(new)
            self._fail()
            why = "committing"
            if isinstance(e, psycopg.OperationalError):
                why += " (if the connection broke during COMMIT it may have been applied)"
            raise _io_error(e, why) from e
        except BaseException:
            store.cache.abandon(new)  # (no commit this node's cache could wait for)
            raise
        if changed:
            store.cache.committed(self.seq, new, written, self.empty)
            store.local_seq = max(store.local_seq, new)
        self._end()

    def _unsent_bytes(self) -> int:
        return sum(len(k) + len(v or b"") for k, v in self._unsent.items())

    def abort(self) -> None:
        if self._done:
            return
        if not self.write:
            self._park()
            return
        self._unsent = {}
        try:
            self._conn.execute(b"ROLLBACK")
        except psycopg.Error:
            self._fail()  # the server rolls back a transaction whose connection is gone
            return
        self._end()

    def _end(self) -> None:
        self._done = True
        self._store._release(self, self._conn, broken=False)

    def _park(self) -> None:
        """End a read transaction without a round trip: its ``COMMIT`` goes out with the next
        ``begin`` on the connection (see :class:`~tierd.meta.pg_park.Parking`)."""
        self._done = True
        self._store._parking.park(self._conn)

    def _fail(self) -> None:
        """An error ends the transaction: roll back (best effort) and hand the connection
        back, closed when it is broken."""
        if self._done:
            return
        self._done = True
        self._unsent = {}
        broken = self._conn.broken or self._conn.closed
        if not broken:
            try:
                self._conn.execute(b"ROLLBACK")
            except psycopg.Error:
                broken = True
        self._store._release(self, self._conn, broken=broken)


class PgStore(KVStore):
    """Metadata in a PostgreSQL database reached at ``url``; ``node`` names this node in the
    change log (other nodes' feeds report its commits; its own feed skips them)."""

    name = "pg"
    remote = True  # begins and commits wait on the network: MetaStore runs them in threads
    space_hint = "delete something, or give the metadata database more space"

    def __init__(self, url: str, *, node: str = "", pool_size: int = 16,
                 timeout: float = 30.0, cache_entries: int = 200_000,
                 log_keep: int = DEFAULT_LOG_KEEP, hot: Iterable[bytes] = ()) -> None:
        if not NODE.fullmatch(node):
            raise ValueError(f"node name {node!r}: at most 64 of A-Z, a-z, 0-9, '_', '.', '-'")
        self.url = url
        self.node = node
        self.cache = ReadCache(cache_entries)
        #: keys nearly every writer reads (the metadata's counters): a writer's begin also
        #: fetches them as they are after the lock, in the same message, instead of its
        #: body's first read fetching them under the lock in a round trip of its own --
        #: on several nodes every create paid one
        self._hot = b",".join(b"'\\x%s'" % k.hex().encode() for k in hot)
        self.log_keep = max(1, log_keep)
        #: a writer trims the log when its seq is a multiple of this (about 1 in 1000)
        self.trim_every = max(1, min(1000, self.log_keep // 10))
        # this process's writers queue here, not in a socket
        self._writers: WriterLock[PgTxn] = WriterLock()
        self._feeds: list[ChangeFeed] = []
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url, min_size=1, max_size=pool_size, timeout=timeout, open=False,
            # psycopg's own automatic preparing is off: it answers a ROLLBACK with
            # DEALLOCATE ALL, which would drop the statements _prepare made
            kwargs={"autocommit": True, "prepare_threshold": None}, configure=prepare,
            name="tierd-meta")
        # first one connection of our own: an unreachable server or a refused login is
        # psycopg's own message ("connection refused", "password authentication failed")
        # rather than the pool's "initialization incomplete"
        with psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout))) as c:
            migrate(c)
        self._pool.open(wait=True, timeout=timeout)
        # connections whose read transaction ended without its COMMIT (PgTxn._park)
        self._parking = Parking(self._pool)
        self._async = AsyncGate(self, pool_size)
        #: the async write commit in flight, if any (:mod:`tierd.meta.pg_async`), and the
        #: seq of this process's last write commit (atxn.behind)
        self.committing: Future[None] | None = None
        self.local_seq = 0
        self.cache_only_reads = self.cache_only_misses = self.bounded_fetches = 0  # pg_quiet

    def begin(self, write: bool = False) -> KVTxn:
        """A transaction begun here, in the caller's thread.  A writer takes over a write
        transaction begun for a coroutine that has not resumed yet (:meth:`begin_offered`):
        on the loop thread it could not wait for it."""
        ready = None if write else self._writers.ready
        # a group of async writers between two members (pg_group): it commits now
        if (ready is not None and ready.finish is not None and self._writers.claim(ready)
                and not finish_pending(ready)):
            self._writers.offer(ready)
        committing = self.committing
        if not write and committing is not None:
            wait([committing])  # (see pg_async: a read sees the writes begun before it)
        while write and (offered := self._writers.acquire(steal=True)) is not None:
            if not finish_pending(offered):  # (a group: committed here; wait again)
                return offered
        try:
            return self._begin(write)
        except BaseException:
            if write:
                self._writers.release()
            raise

    def begin_read(self, warm: Warm | None = None) -> PgTxn:
        """A read transaction (run in a thread of :mod:`tierd.meta.pg_async`), its body's
        reads prefetched (:mod:`tierd.meta.pg_warm`)."""
        txn = self._begin(False)
        warm_txn(txn, warm)
        return txn

    def begin_offered(self, warm: Warm | None = None) -> PgTxn:
        """A write transaction for a coroutine (in a thread of :mod:`tierd.meta.pg_async`):
        it waits for this process's writers without taking over theirs, prefetches (before
        anyone else may take it), and is offered to a synchronous :meth:`begin` until the
        coroutine :meth:`claim` s it."""
        self._writers.acquire(steal=False)
        try:
            txn = self._begin(True)
        except BaseException:
            self._writers.release()
            raise
        warm_txn(txn, warm)  # (a database error ended txn, and released the lock)
        self._writers.offer(txn)
        return txn

    def claim(self, txn: PgTxn) -> bool:
        """Take ``txn`` (from :meth:`begin_offered`) for its coroutine; False when a
        synchronous writer took it over (the coroutine begins again)."""
        return self._writers.claim(txn)

    async def abegin(self, write: bool = False, *, fresh: bool = False,
                     warm: Warm | None = None, bounded: bool = False) -> PgTxn:
        """:meth:`begin` off the event loop (:mod:`tierd.meta.pg_async`), with the body's
        reads ``warm`` prefetched (:mod:`tierd.meta.pg_warm`); ``bounded``: a read the
        cache may answer while the change feed is current (:mod:`tierd.meta.pg_quiet`)."""
        return await self._async.begin(write, fresh, warm, bounded)

    async def aend(self, txn: KVTxn, commit: bool) -> None:
        """End a transaction of :meth:`abegin`: commit it, or abort it."""
        assert isinstance(txn, PgTxn)
        await self._async.end(txn, commit)

    def _begin(self, write: bool) -> PgTxn:
        # after a database restart every pooled connection is broken: try them all
        tries = self._pool.max_size + 1
        for attempt in range(tries):
            conn = self._parking.take()
            parked = conn is not None
            if conn is None:
                conn = self._pool.getconn()
            frm = self.cache.since()
            hot = write and frm is not None and bool(self._hot)
            if write:
                query = _BEGIN_WRITE + (b"" if frm is None else
                                        _LOG_SINCE % (frm, _LOG_FETCH_MAX))
                if hot:
                    query += _HOT % self._hot
            else:
                query = _BEGIN_READ + (_SEQ_READ if frm is None else
                                       _SEQ_LOG_READ % (frm, _LOG_FETCH_MAX))
            if parked:  # the previous read transaction's end
                query = b"COMMIT; " + query
            try:
                sets = results(conn.execute(query))
                if not sets or not sets[0]:
                    raise psycopg.DataError("meta_schema has no row")
                seq = int(sets[0][0][0])
                fresh = sets[2] if hot else []
                if write:
                    rows = sets[1] if frm is not None else None
                else:
                    rows = [(r[1], r[2]) for r in sets[0] if r[1] is not None]
            except psycopg.OperationalError as e:
                # most often a connection the server closed while it idled (a restart)
                conn.close()
                self._pool.putconn(conn)
                if attempt + 1 == tries:
                    raise _io_error(e, "starting a transaction") from e
                log.info("metadata database connection failed at BEGIN, retrying: %s", e)
                continue
            except psycopg.Error as e:
                if not conn.closed:
                    try:
                        conn.execute(b"ROLLBACK")
                    except psycopg.Error:
                        conn.close()
                self._pool.putconn(conn)
                raise _io_error(e, "starting a transaction") from e
            cached = self.cache.advance(frm, seq, contiguous(frm, seq, rows))
            for k, v in fresh:  # read after the lock: what the keys hold at seq
                self.cache.fill(seq, bytes(k), bytes(v))
            return PgTxn(self, write, conn, seq, cached)
        raise AssertionError("unreachable")

    def _release(self, txn: PgTxn, conn: psycopg.Connection[Any], *, broken: bool) -> None:
        if broken and not conn.closed:
            conn.close()
        self._pool.putconn(conn)  # the pool replaces a closed connection
        if txn.write:
            self._writers.release()

    def watch(self, callback: FeedCallback, *, poll: float = 1.0) -> Callable[[], None]:
        """Start a change feed (:class:`~tierd.meta.pg_changes.ChangeFeed`): ``callback(seq,
        keys)`` in a thread of its own for every later commit of another node (``keys``
        None: everything may have changed).  It also keeps this store's cache current.
        Returns the function that stops it (close() stops it too)."""
        return start_feed(ChangeFeed(self.url, self.node, self.cache, callback, poll=poll),
                          self._feeds)

    def sync(self) -> None:
        return None  # every commit is durable when it returns

    async def sync_async(self, upto: int | None = None, *, urgent: bool = True) -> None:
        """:meth:`sync` for MetaStore.flush: nothing to wait for, no thread to start."""
        return None

    def close(self) -> None:
        for feed in list(self._feeds):
            feed.close()
        self._feeds.clear()
        self._parking.close()
        self._async.close()
        self._pool.close()

    def stat(self) -> dict[str, int]:
        cache = {"cache_entries": len(self.cache), "cache_hits": self.cache.hits,
                 "cache_misses": self.cache.misses, "cache_only_reads": self.cache_only_reads,
                 **self._async.stat()}
        try:
            with self._pool.connection() as conn:
                row = conn.execute("SELECT (SELECT count(*) FROM kv), "
                                   "pg_total_relation_size('kv'), "
                                   "(SELECT seq FROM meta_schema)").fetchone()
        except psycopg.Error:
            return cache
        if row is None:
            return cache
        return {"entries": int(row[0]), "used_bytes": int(row[1]), "seq": int(row[2]), **cache}

    def headroom(self) -> int:
        return _HEADROOM
