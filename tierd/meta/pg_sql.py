"""The SQL of the PostgreSQL engine (:mod:`tierd.meta.pg_engine`) that is more than one
statement: the layout and its migration, the statements every pooled connection prepares, the
one-message commit, and reading the answers of a multi-statement query.

Kept apart from the engine's transaction logic so each reads on its own; the engine's module
doc says why the queries have the shape they have.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import psycopg

#: the layout this code reads; :func:`migrate` brings an older database up to it
PG_SCHEMA_VERSION = 2
#: the channel every write commit notifies (payload: its seq, node and keys, :func:`payload`)
CHANNEL = "tierd_changes"
#: a notification's payload at most (the server's limit is 8000 bytes)
PAYLOAD_MAX = 7800
#: what a node may be called (it is written into the commit query as a literal)
NODE = re.compile(r"[A-Za-z0-9_.-]{0,64}")

#: what each pooled connection prepares (see the engine's begin)
PREPARE = (
    b"PREPARE tierd_seq AS SELECT seq, NULL::bigint, NULL::bytea[] FROM meta_schema; "
    b"PREPARE tierd_seq_log(bigint, int) AS SELECT m.seq, l.seq, l.keys FROM meta_schema m "
    b"LEFT JOIN LATERAL (SELECT seq, keys FROM kv_log WHERE seq > $1 ORDER BY seq LIMIT $2) l "
    b"ON true ORDER BY 2; "
    b"PREPARE tierd_lock AS SELECT seq FROM meta_schema FOR UPDATE; "
    b"PREPARE tierd_log(bigint, int) AS "
    b"SELECT seq, keys FROM kv_log WHERE seq > $1 ORDER BY seq LIMIT $2; "
    # the keys $1 as they are now (a writer's begin, after the lock): a handful of small
    # counters, read whether or not a commit changed them -- picking the changed ones out
    # by the log rows took the server 0.15-0.24 ms, while the writer lock was held
    b"PREPARE tierd_hot(bytea[]) AS SELECT k, v FROM kv WHERE k = ANY($1)")


#: a range scan's page (pg_engine: PgTxn.scan), by (reverse, resuming after a key, bounded)
SCANS = {
    (False, False, False): b"SELECT k, v FROM kv WHERE k >= %b ORDER BY k LIMIT %s",
    (False, False, True): b"SELECT k, v FROM kv WHERE k >= %b AND k < %b ORDER BY k LIMIT %s",
    (True, False, False): b"SELECT k, v FROM kv WHERE k >= %b ORDER BY k DESC LIMIT %s",
    (True, False, True):
        b"SELECT k, v FROM kv WHERE k >= %b AND k < %b ORDER BY k DESC LIMIT %s",
    (False, True, False): b"SELECT k, v FROM kv WHERE k > %b ORDER BY k LIMIT %s",
    (False, True, True): b"SELECT k, v FROM kv WHERE k > %b AND k < %b ORDER BY k LIMIT %s",
}
#: the values of several keys at once (a prefetch: pg_warm)
GET_MANY = b"SELECT k, v FROM kv WHERE k = ANY(%b)"


def migrate(conn: psycopg.Connection[Any]) -> None:
    """Create the tables, or bring an older layout up to :data:`PG_SCHEMA_VERSION`; refuse
    a newer one (a newer tierd wrote it).  Two nodes starting at once on an empty database
    may both try to create the tables: the loser's error is retried once."""
    for attempt in range(2):
        try:
            _migrate_once(conn)
            return
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable,
                psycopg.errors.DuplicateObject):
            if attempt:
                raise


def _migrate_once(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        conn.execute("CREATE TABLE IF NOT EXISTS kv (k bytea PRIMARY KEY, v bytea NOT NULL)")
        conn.execute("CREATE TABLE IF NOT EXISTS meta_schema (version integer NOT NULL, "
                     "seq bigint NOT NULL DEFAULT 0)")
        conn.execute("CREATE TABLE IF NOT EXISTS kv_log (seq bigint PRIMARY KEY, "
                     "node text NOT NULL, keys bytea[] NOT NULL)")
        row = conn.execute("SELECT version FROM meta_schema FOR UPDATE").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta_schema (version) VALUES (%s)",
                         (PG_SCHEMA_VERSION,))
            return
        found = int(row[0])
        if found > PG_SCHEMA_VERSION:
            raise RuntimeError(f"the metadata database has layout version {found}; this tierd "
                               f"reads version {PG_SCHEMA_VERSION} (upgrade tierd)")
        # each step brings version n to n + 1, in order
        if found < 2:  # 1 -> 2: the commit counter (kv_log was created above)
            conn.execute("ALTER TABLE meta_schema "
                         "ADD COLUMN IF NOT EXISTS seq bigint NOT NULL DEFAULT 0")
        if found < PG_SCHEMA_VERSION:
            conn.execute("UPDATE meta_schema SET version = %s", (PG_SCHEMA_VERSION,))


def commit_query(unsent: dict[bytes, bytes | None], written: Iterable[bytes], new: int,
                 node: str, trim_below: int | None) -> bytes:
    """A writing commit as one simple-protocol query: the ``unsent`` writes (None: delete),
    the seq bump to ``new``, the log row naming ``written``, the NOTIFY, the log trim (rows up
    to ``trim_below``, if given) and COMMIT, in one message (psycopg's pipeline mode costs
    about twice as much for a few statements).  Keys and values travel as hex literals
    (``decode('..', 'hex')``: nothing in them can end a literal, whatever the server's string
    settings); ``node`` matches :data:`NODE` (checked at open).

    The writes, the seq bump and the trim are data-modifying ``WITH`` clauses of the log
    row's ``INSERT``: one statement instead of up to five (each a round of the server's
    parse, plan and execute; ~1.3 statements per FUSE create over three nodes).  They touch
    different rows (each key once, the log's new row above the trimmed ones), so running them
    in one statement's snapshot changes nothing."""
    hexes = [k.hex().encode() for k in written]
    keys = b", ".join(b"decode('%s', 'hex')" % h for h in hexes)
    ctes = [b"w%d AS (%s)" % (i, q) for i, q in enumerate(write_statements(unsent))]
    ctes.append(b"s AS (UPDATE meta_schema SET seq = %d)" % new)
    if trim_below is not None:
        ctes.append(b"t AS (DELETE FROM kv_log WHERE seq <= %d)" % trim_below)
    return b"; ".join([
        b"WITH %s INSERT INTO kv_log (seq, node, keys) VALUES (%d, '%s', ARRAY[%s]::bytea[])"
        % (b", ".join(ctes), new, node.encode(), keys),
        b"NOTIFY %s, '%s'" % (CHANNEL.encode(), payload(new, node, hexes)),
        b"COMMIT"])


def payload(seq: int, node: str, hexes: list[bytes]) -> bytes:
    """A commit's notification: ``seq/node/keys`` (hex, comma separated), which a change
    feed that is at ``seq - 1`` delivers without reading the log
    (:meth:`tierd.meta.pg_changes.ChangeFeed._notified`); the seq alone when there are no
    keys to name (``kv_log``'s "everything") or too many for a notification."""
    body = b"%d/%s/%s" % (seq, node.encode(), b",".join(hexes))
    return body if hexes and len(body) <= PAYLOAD_MAX else b"%d" % seq


def write_statements(unsent: dict[bytes, bytes | None]) -> list[bytes]:
    """Buffered writes (None: delete) as at most two statements, an upsert of every put and
    one delete of the rest, with hex literals (see :func:`commit_query`); each key once,
    so their order does not matter."""
    parts: list[bytes] = []
    puts = [b"(%s, %s)" % (_hex(k), _hex(v)) for k, v in unsent.items() if v is not None]
    dels = [_hex(k) for k, v in unsent.items() if v is None]
    if puts:
        parts.append(b"INSERT INTO kv (k, v) VALUES " + b", ".join(puts)
                     + b" ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v")
    if dels:
        parts.append(b"DELETE FROM kv WHERE k IN (" + b", ".join(dels) + b")")
    return parts


def _hex(b: bytes) -> bytes:
    return b"decode('%s', 'hex')" % b.hex().encode()


def prepare(conn: psycopg.Connection[Any]) -> None:
    """A new pooled connection prepares the statements a begin runs."""
    conn.execute(PREPARE)


def results(cur: psycopg.Cursor[Any]) -> list[list[Any]]:
    """The rows of each statement of a multi-statement query that returned rows."""
    sets = []
    while True:
        if cur.description is not None:
            sets.append(cur.fetchall())
        if not cur.nextset():
            return sets


def contiguous(frm: int | None, to: int,
                rows: list[Any] | None) -> list[tuple[int, list[bytes]]] | None:
    """The log rows fetched at begin, if they cover every commit from ``frm + 1`` to ``to``
    (none missing to a trim or to the fetch limit); None otherwise (drop the cache)."""
    if frm is None or rows is None:
        return None if frm is not None else []
    if frm >= to:
        return []
    if not rows or int(rows[0][0]) != frm + 1 or int(rows[-1][0]) < to:
        return None
    return [(int(s), [bytes(k) for k in keys]) for s, keys in rows]
