"""Group commit of a node's async writers over PostgreSQL: several ``async with
meta.awrite()`` bodies in one database transaction, made durable by one commit.

Every write transaction of every node holds the cluster's writer lock (the ``meta_schema``
row, :mod:`tierd.meta.pg_engine`) from its begin to the end of its commit, and the commit
waits for the server's WAL flush while holding it.  One transaction per writer caps the whole
cluster at about one write per (begin + body + commit + flush), however many clients there
are.  Every awrite body is synchronous (it runs within one turn of the loop), and a PgTxn
buffers its writes on the client until the commit, so when a writer's body ends while other
writers of the same loop wait for their turn, its transaction need not commit yet: the next
waiter's body runs on the same transaction (seeing the writes before it, with no begin of
its own), then the next, and one commit -- one seq, one ``kv_log`` row with every key, one
flush -- makes them all durable.  Each member waits for that commit and gets its outcome,
error included.  A group ends when no writer waits, or after :data:`GROUP_MAX` members or
:data:`GROUP_S` seconds, so no member waits long for the others.

Rules kept:

* A member whose body raises loses its own writes and only those: the transaction keeps, per
  member, what each key it wrote held before (:func:`start_member`); if its writes had to
  reach the server before its body ended (a scan sends the buffered writes, a huge
  transaction streams), a ``SAVEPOINT`` taken just before its first send is rolled back to.
  A database error ends the whole transaction: then every member fails.
* Between two members the transaction is offered to synchronous code, as a writer's begun
  transaction is (``WriterLock.offer``): a synchronous writer or reader (on the loop thread,
  it could not wait for a group that needs the loop) claims it and commits it on the spot
  (:func:`finish_pending`), the members get that commit's outcome, and the waiter that was to
  join begins a transaction of its own.
* The effects of a commit -- the read cache, ``local_seq``, each member's ``after_commit``
  callbacks -- follow the group's commit, in the members' order, never an abort.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg

from tierd.errors import FsError

if TYPE_CHECKING:
    from tierd.meta.pg_engine import PgTxn

#: members of one group at most, and seconds from its leader's body on after which no
#: further member joins (measured with bench/cluster_meta.py: see docs/metadata.md)
GROUP_MAX = 32
GROUP_S = 0.010

_SAVEPOINT = b"SAVEPOINT tierd_member"
_ROLLBACK_TO = b"ROLLBACK TO SAVEPOINT tierd_member"

#: for one key a member wrote: (in the unsent buffer before, its value there, in the
#: written record before, its value there)
Undo = tuple[bool, "bytes | None", bool, "bytes | None"]


class Group:
    """One open group: its transaction, its members so far, and the future of its commit's
    outcome that every member waits for."""

    __slots__ = ("done", "loop", "members", "started", "txn")

    def __init__(self, txn: PgTxn, loop: asyncio.AbstractEventLoop) -> None:
        self.txn = txn
        self.loop = loop
        self.members = 0  # bodies that ended well (their writes are in txn)
        self.started = time.monotonic()
        self.done: asyncio.Future[None] = loop.create_future()

    def full(self) -> bool:
        return self.members >= GROUP_MAX or time.monotonic() - self.started >= GROUP_S

    def resolve(self, error: BaseException | None) -> None:
        """The outcome, from any thread; a loop already closed has no one to tell."""
        def set_outcome() -> None:
            if not self.done.done():
                if error is None:
                    self.done.set_result(None)
                else:
                    self.done.set_exception(error)
        with contextlib.suppress(RuntimeError):  # (its loop is closed: no one to tell)
            self.loop.call_soon_threadsafe(set_outcome)

    def run_commit(self) -> None:
        """Commit the group (in the caller's thread) and tell the members: the commit thread
        of :mod:`tierd.meta.pg_async`, or a synchronous begin that claimed it."""
        error: BaseException | None = None
        try:
            if self.txn._done:
                raise group_failed()
            if self.members:
                self.txn.commit()
            else:
                self.txn.abort()
        except BaseException as e:
            error = e
        self.resolve(error)


def group_failed() -> FsError:
    return FsError(errno.EIO, "metadata database error in a transaction shared by several "
                   "writers (group commit): it was rolled back")


def start_member(txn: PgTxn, prior: bool) -> None:
    """A body begins on ``txn``; ``prior``: earlier members' writes are in it, so this
    member's must be undoable apart from theirs."""
    txn.finish = None
    if not prior:
        txn.undo = None
        txn.before_send = None
        return
    txn.undo = {}
    txn.member_sent = False
    txn.before_send = lambda: _savepoint(txn)


def end_member(txn: PgTxn) -> None:
    """The member's body ended well: its writes now belong to the group."""
    txn.undo = None
    txn.before_send = None


def _savepoint(txn: PgTxn) -> None:
    """Before a member's first send: send the earlier members' buffered writes (the buffer
    with this member's changes undone), then mark the point a failure rolls back to."""
    undo = txn.undo
    assert undo is not None
    mine = txn._unsent
    earlier = dict(mine)
    for key, (had, value, _, _) in undo.items():
        if had:
            earlier[key] = value
        else:
            earlier.pop(key, None)
    txn._unsent = earlier
    txn._send_writes()
    txn._conn.execute(_SAVEPOINT)
    txn._unsent = mine
    txn.member_sent = True


def rollback_member(txn: PgTxn) -> bool:
    """Undo the writes of the member whose body raised; False when the transaction is gone
    (a database error ended it: the whole group fails)."""
    undo = txn.undo
    txn.undo = None
    txn.before_send = None
    if txn._done or undo is None:
        return False
    if txn.member_sent:
        try:
            txn._conn.execute(_ROLLBACK_TO)
        except psycopg.Error:
            txn._fail()
            return False
        txn._unsent = {}  # what came before the savepoint was sent before it
    else:
        for key, (had, value, _, _) in undo.items():
            if had:
                txn._unsent[key] = value
            else:
                txn._unsent.pop(key, None)
    written = txn._written
    if written is not None:  # (None: too many keys to list; the log says "everything")
        for key, (_, _, had, value) in undo.items():
            if had:
                written[key] = value
            else:
                written.pop(key, None)
    return True


def finish_pending(txn: PgTxn) -> bool:
    """Commit a group offered between two members, claimed by a synchronous begin (see
    the module doc); False when ``txn`` is not a group's."""
    finish: Callable[[], None] | None = txn.finish
    if finish is None:
        return False
    txn.finish = None
    finish()
    return True
