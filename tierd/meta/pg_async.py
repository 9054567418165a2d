"""Begin and commit of PostgreSQL transactions off the event loop.

Over PostgreSQL a transaction's begin is a round trip, and a writer's begin also waits for
the ``meta_schema`` row lock, that is for the whole of any other node's write transaction; a
writing commit is another round trip (:mod:`tierd.meta.pg_engine`).  Run on the event loop,
each would stall every request of the node for that long.  :class:`AsyncGate` runs them in
threads of its own, for :meth:`tierd.meta.store.MetaStore.awrite` and
:meth:`~tierd.meta.store.MetaStore.asnapshot`; the body between them stays on the loop,
synchronous, as with the embedded engines (which never come here: no thread hop for them).

Sizes (the engine's pool holds ``pool_size`` connections, 16 by default):

* at most ``pool_size - RESERVE`` async read transactions are open at once (an asyncio
  semaphore; begun, their bodies wait for the loop while they hold a connection), and one
  async writer.  The rest of the pool is for the transactions still begun synchronously: on
  the loop they must always find a connection that frees itself without the loop (a worker
  thread's transaction, a committing writer), or the loop would wait for readers that only
  the loop can finish.
* begins run in ``pool_size - RESERVE + 1`` threads (every admitted transaction a thread,
  so none waits behind another's round trip); write commits and rollbacks run in a thread
  of their own (one writer at a time holds the lock, and a commit must never queue behind
  begins that wait for that very lock).  A group's commit that fits one message is sent
  by the loop as the group closes (``PgTxn.send_commit``: a send on the non-blocking
  connection, no wait), and the commit thread only waits for its outcome: the server
  starts on it without waiting for that thread to wake, while the lock is held.

A ``fresh`` read transaction begun while a write commit is in flight waits for it (a
synchronous one always does, in ``PgStore.begin``): a coroutine that saw the in-memory
effects of a writer's body (a handle, a queued file) must not then read the metadata from
before it.  A read waits for a commit, never for the lock.  The others do not wait: reads
are not held up by the stream of commits of a node that writes.

Async writers of one loop take turns (:class:`_LoopGate`), from before their begin until
their commit is sent (the next writer's begin then waits for the lock in its thread while the
commit runs: the two round trips overlap).  A writer whose turn comes while the previous
writer's transaction is still open joins it instead of beginning: group commit
(:mod:`tierd.meta.pg_group`).  A writer begun in a thread may be taken over by
a synchronous writer before its coroutine resumes (``PgStore.begin`` steals it): a
synchronous writer on the loop thread would otherwise wait for a lock that only the loop can
release.  The coroutine then begins again.

A commit, once sent, is waited for even when the task is cancelled (the cancellation is
delivered at the caller's next await): the caller's code after the commit -- its in-memory
state, notifications -- must see the outcome.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Generic, TypeVar

from tierd.meta.pg_group import (
    Group,
    end_member,
    finish_pending,
    rollback_member,
    start_member,
)
from tierd.meta.pg_warm import ROUNDS, Warm, absorb, warm_member

if TYPE_CHECKING:
    from tierd.meta.pg_engine import PgStore, PgTxn

T = TypeVar("T")
Txn = TypeVar("Txn")

#: connections of the pool kept for the transactions begun synchronously (on the loop or in
#: worker threads), out of reach of the async readers
RESERVE = 4


class WriterLock(Generic[Txn]):
    """The process's write lock of a PgStore, and the write transaction begun for a
    coroutine that has not taken it yet (:meth:`offer`, :meth:`claim`), which a synchronous
    writer takes over instead of waiting (see the module doc)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self.ready: Txn | None = None

    def acquire(self, steal: bool) -> Txn | None:
        """Wait for the lock; with ``steal``, return an offered transaction instead (its
        lock passes to the caller) when there is one."""
        with self._cond:
            while self._busy:
                if steal and self.ready is not None:
                    txn, self.ready = self.ready, None
                    return txn
                self._cond.wait()
            self._busy = True
            return None

    def offer(self, txn: Txn) -> None:
        with self._cond:
            self.ready = txn
            self._cond.notify_all()

    def claim(self, txn: Txn) -> bool:
        with self._cond:
            if self.ready is txn:
                self.ready = None
                return True
            return False

    def release(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()


class _LoopGate:
    """The async primitives of one event loop (asyncio's are bound to the loop they are
    first used on)."""

    def __init__(self, readers: int) -> None:
        self.readers = asyncio.Semaphore(readers)
        #: the write commit in flight or the group not yet committed (what a fresh read
        #: waits for)
        self.commit: asyncio.Future[None] | None = None
        #: the writers' turn: held by one writer coroutine; the others wait in order, and
        #: each is handed the open group to join or None (begin a transaction)
        self.busy = False
        self.waiters: deque[asyncio.Future[Group | None]] = deque()
        self.group: Group | None = None  # the open group of the writer holding the turn
        self.fresh = 0  # fresh reads waiting for a commit (a group then stops growing)

    async def take(self, pass_on: Callable[[Group | None], None]) -> Group | None:
        """Wait for the writers' turn; the open group it comes with, if any.  A turn that
        came with a cancellation goes to ``pass_on``."""
        if not self.busy and not self.waiters:
            self.busy = True
            return None
        fut: asyncio.Future[Group | None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if not fut.done() or fut.cancelled():
                self.waiters.remove(fut)
            else:
                pass_on(fut.result())
            raise

    def waiting(self) -> bool:
        return any(not f.done() for f in self.waiters)

    def hand_on(self, group: Group | None) -> bool:
        """Pass the turn (and ``group``, to join) to the next waiter; False when none
        waits (the turn is free: the caller must end the group)."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(group)
                return True
        self.busy = False
        return False


async def wait_out(fut: asyncio.Future[T]) -> T:
    """The result of ``fut``, waited for even if the task is cancelled meanwhile; the
    cancellation is then delivered at the task's next await."""
    cancelled = False
    task = asyncio.current_task()
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            # (also when fut is done by now: the cancellation was taken from the task
            # here, so it must be delivered again below, or it is lost)
            cancelled = True
            if task is not None:
                task.uncancel()
        except BaseException:  # fut's own error: result() raises it
            break
    if cancelled and task is not None:
        task.cancel()
    return fut.result()


class AsyncGate:
    """Begin, commit and abort of ``store``'s transactions in threads (see the module doc)."""

    def __init__(self, store: PgStore, pool_size: int) -> None:
        self.store = store
        #: async read transactions open at once (the rest of the pool: RESERVE, a writer)
        self.readers = max(1, pool_size - RESERVE)
        self.threads = self.readers + 1
        self._begins = ThreadPoolExecutor(self.threads, thread_name_prefix="tierd-pg-begin")
        self._commits = ThreadPoolExecutor(1, thread_name_prefix="tierd-pg-commit")
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopGate] = (
            weakref.WeakKeyDictionary())
        self.reading = 0  # async read transactions open now, and at most so far
        self.reading_peak = 0
        self.groups = 0  # write groups committed or rolled back, and their members
        self.grouped = 0
        #: members whose prefetch the group's answers and the cache gave on the loop
        self.members_cached = 0

    def _gate(self, loop: asyncio.AbstractEventLoop) -> _LoopGate:
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = _LoopGate(self.readers)
        return gate

    async def _begun(self, loop: asyncio.AbstractEventLoop, write: bool,
                     warm: Warm | None) -> PgTxn:
        """One begin in a thread; a task cancelled meanwhile leaves the transaction to a
        callback that ends it once begun."""
        begin = self.store.begin_offered if write else self.store.begin_read
        fut = (loop.run_in_executor(self._begins, begin) if warm is None
               else loop.run_in_executor(self._begins, begin, warm))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(self._drop_begun)
            raise

    def _drop_begun(self, fut: asyncio.Future[PgTxn]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        txn = fut.result()
        if not txn.write:
            txn.abort()  # ends without a round trip (parks its connection)
        elif self.store.claim(txn):  # (else a synchronous writer took it over)
            self._commits.submit(txn.abort)

    async def begin(self, write: bool, fresh: bool = False,
                    warm: Warm | None = None, bounded: bool = False) -> PgTxn:
        loop = asyncio.get_running_loop()
        gate = self._gate(loop)
        if bounded and not write and not fresh:  # the cache may answer: no transaction
            cached = await self._bounded(loop, gate, warm)
            if cached is not None:
                return cached
        if not write:
            commit = gate.commit
            if fresh and commit is not None and not commit.done():
                # a read begun after a writer's body sees its commit, as when the commit
                # returned before anything else ran: the caller may have seen in-memory
                # state that body changed (an open file, a handle's size); meanwhile the
                # group it waits for takes no further member
                gate.fresh += 1
                try:
                    await asyncio.wait([commit])
                finally:
                    gate.fresh -= 1
            await gate.readers.acquire()
            try:
                txn = await self._begun(loop, False, warm)
            except BaseException:
                gate.readers.release()
                raise
            self.reading += 1
            self.reading_peak = max(self.reading_peak, self.reading)
            txn.on_end = functools.partial(self._read_done, gate)
            return txn
        group = await gate.take(functools.partial(self._pass, gate))
        if group is not None and self.store.claim(group.txn):
            if warm is not None:
                await self._warm_member(loop, gate, group, warm)
            start_member(group.txn, prior=True)  # join the open group (pg_group)
            return group.txn
        # (a group handed on but claimed by a synchronous begin meanwhile was committed
        # there: its members have their outcome; begin anew)
        try:
            while True:
                txn = await self._begun(loop, True, warm)
                if self.store.claim(txn):
                    break  # (else a synchronous writer took it over: begin again)
        except BaseException:
            self._pass(gate, None)
            raise
        gate.group = Group(txn, loop)
        start_member(txn, prior=False)
        return txn

    async def _bounded(self, loop: asyncio.AbstractEventLoop, gate: _LoopGate,
                       warm: Warm | None) -> PgTxn | None:
        """A bounded read (:mod:`tierd.meta.pg_quiet`): answered by the cache, with what
        it lacks read in one statement per link of the pass's chain; None: begin one."""
        from tierd.meta.pg_quiet import begin_cached, fetch, settle
        got = begin_cached(self.store, warm)
        if got is None:
            return None
        txn, missed = got
        for _ in range(ROUNDS):
            if not missed:
                return txn
            assert warm is not None
            async with gate.readers:  # (a pooled connection, as an async reader's)
                found = await loop.run_in_executor(self._begins, fetch, self.store, missed)
            if found is None:
                break
            got_missed = settle(txn, warm, missed, found)
            if got_missed is None:
                return None
            missed = got_missed
        txn.abort()
        return None

    async def _warm_member(self, loop: asyncio.AbstractEventLoop, gate: _LoopGate,
                           group: Group, warm: Warm) -> None:
        """Prefetch for a writer joining ``group``: on the loop when the group's answers and
        the node's cache at exactly its seq answer the whole pass (``member_reads``
        without fetching: what the thread would read first, in memory) -- no thread hop
        and no statement while the group holds the cluster's writer lock; else in a thread
        (:func:`~tierd.meta.pg_quiet.member_reads`, or a read transaction of its own,
        :func:`~tierd.meta.pg_warm.warm_member`), counted as an async reader.  Cancelled
        meanwhile, the writer hands the group on as a writer that ended its body does."""
        txn = group.txn
        from tierd.meta.pg_quiet import member_reads
        answers = member_reads(self.store, txn, warm, fetching=False)
        if answers is not None:  # the group and the cache answered: no hop, no statement
            self.members_cached += 1
            absorb(txn, answers)
            return
        try:
            await gate.readers.acquire()
        except asyncio.CancelledError:
            self._hand_over(gate, group)
            raise
        fut = loop.run_in_executor(self._begins, _member_reads, self.store, txn, warm)
        fut.add_done_callback(lambda _: gate.readers.release())
        try:
            answers = await asyncio.shield(fut)
        except asyncio.CancelledError:
            self._hand_over(gate, group)
            raise
        absorb(txn, answers)

    def _hand_over(self, gate: _LoopGate, group: Group) -> None:
        """Offer ``group``'s transaction again, between members, and pass the turn on."""
        group.txn.finish = group.run_commit
        self.store._writers.offer(group.txn)
        self._pass(gate, group)

    def _read_done(self, gate: _LoopGate) -> None:
        self.reading -= 1
        gate.readers.release()

    def stat(self) -> dict[str, int]:
        """The sizes (module doc) and how many async readers were open at most."""
        return {"async_readers_max": self.readers, "async_readers_peak": self.reading_peak,
                "begin_threads": self.threads, "write_groups": self.groups,
                "write_group_members": self.grouped,
                "write_members_cached": self.members_cached}

    async def end(self, txn: PgTxn, commit: bool) -> None:
        """Commit (or abort) ``txn``: a reader's end sends nothing and stays on the loop; a
        writer's runs in the commit thread and is waited for (see the module doc)."""
        release: Callable[[], None] | None = txn.on_end
        txn.on_end = None
        if not txn.write:
            try:
                txn.commit() if commit else txn.abort()
            finally:
                if release is not None:
                    release()
            return
        loop = asyncio.get_running_loop()
        gate = self._gate(loop)
        group = gate.group
        assert group is not None and group.txn is txn, "not the open group's transaction"
        if commit:
            end_member(txn)
            group.members += 1
            gate.commit = group.done  # a fresh read now waits for the group
        elif group.members == 0 or not rollback_member(txn):
            # the leader's writes are the whole transaction, or the database failed it
            # (then every member fails): the group ends, rolled back
            self._close(gate, group)
            return
        if not txn._done and not group.full() and not gate.fresh and gate.waiting():
            txn.finish = group.run_commit  # (a synchronous begin may commit it meanwhile)
            self.store._writers.offer(txn)
            self._pass(gate, group)
        else:
            self._close(gate, group)
        if commit:
            await wait_out(group.done)

    def _pass(self, gate: _LoopGate, group: Group | None) -> None:
        """Hand the turn, and ``group`` to join, to the next waiting writer; with none
        left, the group (unless a synchronous begin took it) ends."""
        if not gate.hand_on(group) and group is not None and self.store.claim(group.txn):
            group.txn.finish = None
            self._close(gate, group)

    def _close(self, gate: _LoopGate, group: Group) -> None:
        """End ``group``: its commit (or rollback) goes to the commit thread, and the turn
        to the next writer, whose begin waits for the lock meanwhile."""
        if gate.group is group:
            gate.group = None
        self.groups += 1
        self.grouped += group.members
        if group.members:
            group.txn.send_commit()  # (the server starts now; the thread waits for it)
        cf = self._commits.submit(group.run_commit)
        self.store.committing = cf  # what a synchronous reader waits for (PgStore.begin)
        group.done.add_done_callback(functools.partial(self._committed, gate))
        gate.hand_on(None)

    @staticmethod
    def _committed(gate: _LoopGate, fut: asyncio.Future[None]) -> None:
        if gate.commit is fut:
            gate.commit = None
        if not fut.cancelled():
            fut.exception()  # (retrieved: a group no member waits for logs nothing)

    def close(self) -> None:
        """Stop the threads; a write transaction begun for a coroutine that never took it
        (its loop is gone) is rolled back, so no begin waits for its lock."""
        ready = self.store._writers.ready
        if ready is not None and self.store.claim(ready) and not finish_pending(ready):
            ready.abort()
        self._begins.shutdown(wait=False, cancel_futures=True)
        self._commits.shutdown(wait=True)


def _member_reads(store: PgStore, txn: PgTxn, warm: Warm) -> dict[bytes, bytes | None]:
    """A joining writer's prefetch without a read transaction when its pass allows
    (:func:`tierd.meta.pg_quiet.member_reads`), else on one (``warm_member``)."""
    from tierd.meta.pg_quiet import member_reads
    answers = member_reads(store, txn, warm)
    return warm_member(store, txn, warm) if answers is None else answers
