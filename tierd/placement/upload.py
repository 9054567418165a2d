"""Reconciling one inode with cold: uploads and copies under the keys' gates, each behind a
durable put-intention, and one transaction that records what cold now holds.

* A file's keys are the paths of its names.  Content whose version cold lacks is uploaded
  once (``put_file``, MD5 checked by the store) to the first, and copied server-side to the
  others; keys it is no longer named by become pending deletes (``intents``).
* **Before a put** (holding the key's gate): the key must still name the file and the
  version be current -- a version superseded or a file deleted meanwhile is not uploaded;
  another live file that still needs the object there is rescued first (``deletes.py``);
  then the put-intention ``Z<key>`` is committed **and flushed** (with it every namespace
  change before it), so no put lands for a metadata state a crash could roll back, and an
  upload a crash interrupts leaves a pending delete rather than an untracked object.
* **During an upload**, deleting the file cancels it (:meth:`Uploading.gone`).
* **After** (one transaction): the record (``R``) lists the keys put that still name the
  file, the put-intentions of those keys are cleared (if unchanged: a rename meanwhile left
  its own), every other key cold may hold for it becomes a pending delete, and only if the
  queue token is unchanged and the file has no unflushed writes it leaves the queue CLEAN.
  A reconcile that failed part-way records the puts that succeeded the same way (not
  dequeued), so the next round does not upload them again.
* **The ETag:** content written through FUSE leaves the namespace's MD5 unknown (hashing
  behind the writer halved its speed).  An upload of such a version hashes the file in a
  thread while it is sent, and the record transaction stores that MD5 as the inode's ETag
  if the version is still the one uploaded and nothing wrote to it since.
* An empty file is uploaded without its hot file (nothing to read: no open on the loop).
* **Batched transactions** (:class:`TxnBatch`).  The put-intention and the record are
  written through one batch: the bodies that concurrent reconciles hand it in the same
  turn of the event loop run in one write transaction (a create burst persisted 64 files
  at a time paid two transactions per file, each one a group-commit commit over lmdb and a
  server round trip over PostgreSQL).  Each body is the same code its own transaction
  ran, and raises only before it writes, so merging changes no outcome: a body that raises
  leaves nothing in the shared transaction; one that fails unexpectedly aborts the batch,
  and its bodies run again one transaction each, so the failure stays its own.  What must
  follow the commit (the in-flight guard of the keys put, :attr:`putting`) runs after it,
  in the batch, whatever became of the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tierd.meta import EMPTY_MD5, STATE_CLEAN, ColdRecord, Inode, MetaStore, MetaTxn
from tierd.placement import intents, putting
from tierd.placement.deletes import Deleting
from tierd.placement.engine import WARM
from tierd.placement.memtier import MEM
from tierd.placement.paths import file_keys, keys_policy, resolve
from tierd.tiers import KeyConflict, KeyRejected, ObjectInfo, ObjectNotFound


class Superseded(Exception):
    """The version being uploaded was deleted or replaced: the upload was skipped or
    cancelled (the change that superseded it queued the file again)."""


@dataclass
class Round:
    """One reconcile's progress: the keys put (key -> ETag), their intention tokens, and
    the MD5 of the uploaded version when the namespace did not know it (``md5``, for the
    version ``md5_version``)."""

    ino: int
    new: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, bytes] = field(default_factory=dict)
    md5: str = ""
    md5_version: int = 0
    deletes: bool = False  # its record left cold deletes pending
    #: the queue token the round began with, and the file's cold keys then (its names
    #: can differ from these only once the token did: every change of them queues it anew)
    token: bytes = b""
    names: tuple[str, ...] = ()


T = TypeVar("T")
log = logging.getLogger(__name__)
#: a batched transaction waits for more bodies in steps of GATHER seconds while they keep
#: coming, at most GATHER_MAX
GATHER = 0.005
GATHER_MAX = 0.05


@dataclass
class _Body(Generic[T]):
    """One caller's part of a batched transaction."""

    run: Callable[[MetaTxn], T]
    fut: asyncio.Future[T]
    after: Callable[[], None] | None  # once the transaction is over (committed or not)
    must: bool  # run even when its caller went away (cancelled)
    warm: Callable[[MetaTxn], object] | None = None  # its reads, made off the loop first


class TxnBatch:
    """Write transactions of concurrent callers merged into one (module docstring).

    ``await batch.run(body)`` returns ``body(tx)``'s value once the transaction it ran in
    committed, or raises what the body raised (:class:`Superseded`, before any write) or
    what failed its own transaction.  Bodies handed in during one turn of the loop share
    a transaction; the commit runs in a task of the batch, not in the callers."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self._bodies: list[_Body[Any]] = []
        self._task: asyncio.Task[None] | None = None
        #: write transactions committed, and the bodies they carried (tests, benches)
        self.transactions = 0
        self.bodies = 0

    async def run(self, body: Callable[[MetaTxn], T], *,
                  after: Callable[[], None] | None = None, must: bool = False,
                  warm: Callable[[MetaTxn], object] | None = None) -> T:
        """``warm``: the body's reads, without its writes -- over PostgreSQL made in the
        begin's thread for every body of the transaction (:mod:`tierd.meta.pg_warm`), so
        the bodies on the loop find them answered."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._bodies.append(_Body(body, fut, after, must, warm))
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name="tierd-persist-txn")
        return await fut

    async def finish(self) -> None:
        """Wait until the bodies handed in so far have committed (or failed): at close,
        after the uploads stopped, the records and intention drops they left still go in,
        and no task of the batch outlives its loop."""
        task = self._task
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def _drain(self) -> None:
        try:
            # reconciles reach a transaction as their uploads finish, rarely in the same
            # turn of the loop: gathering while more keep coming merges a burst (a put's
            # intention waits for the next group flush, <= 5 ms, anyway; a record only
            # tells that a file already persisted is clean)
            waited, seen = 0.0, 0
            while len(self._bodies) > seen and waited < GATHER_MAX:
                seen = len(self._bodies)
                await asyncio.sleep(GATHER)
                waited += GATHER
            while self._bodies:
                batch, self._bodies = self._bodies, []
                await self._commit([b for b in batch if b.must or not b.fut.cancelled()])
        finally:
            self._task = None

    async def _commit(self, batch: list[_Body[Any]]) -> None:
        """Run ``batch`` in one transaction (begun and committed off the loop over
        PostgreSQL: ``awrite``); after an unexpected failure, each body alone."""
        if not batch:
            return
        done: list[tuple[_Body[Any], Any, BaseException | None]] = []
        warms = [b.warm for b in batch if b.warm is not None]

        def reads(tx: MetaTxn) -> None:
            for w in warms:
                w(tx)
        try:
            async with self.meta.awrite(warm=reads if warms else None) as tx:
                for b in batch:
                    try:
                        done.append((b, b.run(tx), None))
                    except Superseded as e:  # raised before the body wrote anything
                        done.append((b, None, e))
        except Exception as e:
            if len(batch) > 1:
                for b in batch:
                    # a caller that went away meanwhile would leave an intention (and its
                    # key guard) that no finish of its own ever drops
                    if b.must or not b.fut.cancelled():
                        await self._commit([b])
                return
            done = [(batch[0], None, e)]
        else:
            self.transactions += 1
            self.bodies += len(batch)
        for b, value, exc in done:
            if b.after is not None:
                try:
                    b.after()
                except Exception:  # a bug: the other callers must still get their answer
                    log.exception("after a persister transaction")
            if b.fut.done():
                continue  # its caller went away
            if exc is not None:
                b.fut.set_exception(exc)
            else:
                b.fut.set_result(value)


class Uploading(Deleting):
    """Adds :meth:`reconcile` (and the cancellation of uploads of deleted files)."""

    #: uploads, copies and the fetches they need at once (``persist_parallel``)
    transfers: asyncio.Semaphore

    def init_uploads(self) -> None:
        self._uploads: dict[int, asyncio.Future[ObjectInfo]] = {}
        self.txns = TxnBatch(self.meta)
        # the source of every empty file's upload, opened once: an open per file on the
        # loop (the store dups a descriptor) also waited for the GIL behind the upload
        # threads, ~170 us a file in a profile of a create burst
        self._empty = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self._empty)

    def gone(self, ino: int) -> None:
        """Inside the transaction that deleted ``ino``: cancel its upload in flight (if
        that transaction aborts, the upload is simply tried again)."""
        task = self._uploads.get(ino)
        if task is not None and not task.done():
            task.cancel()
            self.stats.uploads_cancelled += 1

    async def reconcile(self, ino: int) -> bool:
        """Bring cold in line with inode ``ino``; True when it left the queue."""
        # synchronous, on every engine: over lmdb the coroutine's begin and end cost 10%
        # of a persist; over PostgreSQL its reads (about 4 queries a file, most of them
        # the scans of its path's links) stay on the loop, since an asnapshot with them
        # warmed, fresh or not, cost a one-node cluster 15% of its creates and half its
        # unlinks (bench/cluster_meta.py --persist-delay 5, A/B, two rounds each)
        with self.meta.snapshot() as tx:
            token = tx.queued(ino)
            if token is None:
                return True
            inode = tx.get_inode(ino)
            rec = tx.get_cold(ino)
            live = inode is not None and inode.is_reg and inode.nlink > 0
            names = file_keys(tx, ino) if live else []
            old = dict(rec.keys) if rec is not None else {}
            reusable = {k: e for k, e in old.items() if not intents.pending(tx, k)}
        policy = keys_policy(names, self.policy_for)
        targets = [] if policy is not None and policy.mode == "cache-only" else names
        version = rec.version if rec is not None else 0
        size = rec.size if rec is not None else 0
        r = Round(ino, token=token, names=tuple(names))
        complete = False
        async with contextlib.AsyncExitStack() as gates:
            try:
                if inode is not None and targets:
                    if self.unsettled(ino):  # unflushed writes: the commit re-queues it
                        return False
                    if self.unpublished(targets):  # renamed into place soon: upload it then
                        self.held_back.add(ino)
                        return False
                    fresh = rec is None or rec.version != inode.version
                    if fresh:
                        await self._put(gates, r, targets[0], inode, {})
                        version, size = inode.version, inode.size
                    for k in targets:
                        if k in r.new:
                            continue
                        if not fresh and k in reusable:
                            r.new[k] = reusable[k]  # cold has this version there already
                            continue
                        await self._put(gates, r, k, inode, r.new or reusable)
                complete = True
            except Superseded:
                pass  # the change that superseded it queued the file again
            finally:
                if complete or r.tokens:
                    done = complete
                    complete = await self.txns.run(
                        lambda tx: self._finish(tx, r, old, version, size, token, done),
                        after=lambda: self._unguard(r), must=True,
                        warm=lambda tx: self._finish_reads(tx, r, old))
        if not complete:
            return False
        self._set_dirty(ino, 0)
        self.stats.persisted += 1
        if r.new and policy is not None and policy.tier == WARM and self.warmc is not None:
            # the prefix's data belongs on warm: writes land on hot (the namespace's open
            # files, staging and S3 sendfile use the hot file) and move down once clean
            await self.demote_file(ino)
        elif r.new and policy is not None and policy.tier == MEM:
            self.admit_mem_later(ino)  # kept in pool memory (a no-op when it has its copy)
        return True

    def _finish(self, tx: MetaTxn, r: Round, old: dict[str, str], version: int, size: int,
                token: bytes, complete: bool) -> bool:
        """The record transaction's body: what cold holds, the ETag learned, and -- for a
        complete round whose queue token is unchanged and no write pending -- the file
        leaves the queue CLEAN.  True when it left."""
        cur = tx.get_inode(r.ino)  # read once: the record, the ETag and the state
        self._record(tx, r, old, version, size, cur)
        changed = self._learned(r, cur)
        left = complete and tx.queued(r.ino) == token and not self.unsettled(r.ino)
        if left:
            tx.dequeue(r.ino)
            changed |= _cleaned(cur, version, bool(r.new))
        if changed and cur is not None:
            tx.put_inode(cur)
        return left

    @staticmethod
    def _finish_reads(tx: MetaTxn, r: Round, old: dict[str, str]) -> None:
        """What :meth:`_finish` reads, without its writes (its ``warm``)."""
        tx.get_inode(r.ino)
        if tx.queued(r.ino) != r.token:
            file_keys(tx, r.ino)
        for k in (*r.tokens, *old):
            intents.pending(tx, k)

    def _unguard(self, r: Round) -> None:
        """The keys ``r`` put are no longer in flight (once their record is written), and
        the deletes it left pending may run."""
        for k in r.tokens:
            if self.putting.get(k) == r.ino:
                del self.putting[k]
        if r.deletes:
            self.deletes_hint = True

    def _record(self, tx: MetaTxn, r: Round, old: dict[str, str], version: int,
                size: int, inode: Inode | None) -> None:
        """What cold holds for ``r.ino`` (its inode now: ``inode``), see the module
        docstring."""
        if tx.queued(r.ino) == r.token:  # no change since the round began: its names
            names = set(r.names)
        else:
            live = inode is not None and inode.is_reg and inode.nlink > 0
            names = set(file_keys(tx, r.ino)) if live else set()
        kept = {k: e for k, e in r.new.items() if k in names}
        for k, tok in r.tokens.items():
            if self.node:
                putting.unmark(tx, k, self.node)  # this node's upload to k is over
            if k in kept:
                intents.clear(tx, k, tok)
        for k in old:
            if k not in kept and not intents.pending(tx, k):
                intents.intend(tx, k, r.ino)
        if kept:
            tx.put_cold(r.ino, ColdRecord(version, size, kept, time.time_ns()))
        else:
            tx.delete_cold(r.ino)
        # a delete to carry out once the keys' guard drops after this commit (an old
        # key, a put that was not kept, one the namespace intended while it was in
        # flight): the delete worker is kicked then.  A new file's record leaves none: no
        # pass over every pending delete per persisted file (0.27 ms a file in a burst)
        r.deletes = any(intents.pending(tx, k) for k in (*r.tokens, *old))

    def _learn_etag(self, tx: MetaTxn, r: Round) -> None:
        """:meth:`_learned` in a transaction of its own."""
        cur = tx.get_inode(r.ino)
        if self._learned(r, cur) and cur is not None:
            tx.put_inode(cur)

    def _learned(self, r: Round, cur: Inode | None) -> bool:
        """The MD5 an upload computed becomes the inode's ETag (``cur`` changed: True) if
        that version is current, its ETag still unknown and no write is pending on it."""
        if (not r.md5 or cur is None or cur.version != r.md5_version or cur.etag != ""
                or self.unsettled(r.ino)):
            return False
        cur.etag = r.md5
        return True

    def _still_wanted(self, tx: MetaTxn, key: str, inode: Inode, r: Round) -> bool:
        """Whether ``key`` still names ``inode`` at its version (a put to it is right).
        While the queue token is the one the round read ``inode`` and its keys with, yes
        without a look: a change of the file's names or content (or of a directory above
        it, or a file put in its place) queues it anew in the transaction that makes it --
        the rule the persister's dequeue relies on -- so only a changed token costs the
        walk down the key (twice a persisted file, 7% of the loop in a create burst)."""
        if r.token and tx.queued(inode.ino) == r.token:
            return True
        cur = tx.get_inode(inode.ino)
        return (cur is not None and cur.nlink > 0 and cur.version == inode.version
                and resolve(tx, key) == inode.ino)

    async def _put(self, gates: contextlib.AsyncExitStack, r: Round, key: str, inode: Inode,
                   have: dict[str, str]) -> None:
        """Put ``inode``'s content under ``key`` (a server-side copy from ``have`` where
        cold has it, else an upload); raises :class:`Superseded` when the key no longer
        names this version."""
        await gates.enter_async_context(self.gates.hold(key))
        for _ in range(2):
            needy = await self.txns.run(lambda tx: self._intend_put(tx, r, key, inode),
                                        warm=lambda tx: self._intend_reads(tx, r, key, inode))
            if not needy:
                break
            await self.rescue(needy)  # then check again
        else:
            raise Superseded(key)
        # The namespace state that makes this put right (the name, the version) and the
        # put-intention must be durable before the object lands: else a crash could roll
        # the metadata back to a version whose only copy this put replaced, or to before
        # a create whose object would then be left in cold, untracked.  Concurrent
        # reconciles share one group-commit flush.
        await self.meta.flush(urgent=False)
        async with self.transfers:  # taken after the gate: a holder waits for no gate
            etag = None
            if have:
                etag = await self._copy(key, have)
            if etag is None:
                etag = await self._upload(r, inode, key)
        r.new[key] = etag

    def _intend_reads(self, tx: MetaTxn, r: Round, key: str, inode: Inode) -> None:
        """What :meth:`_intend_put` reads, without its writes (its ``warm``)."""
        self._still_wanted(tx, key, inode, r)
        prior = intents.get(tx, key)
        if prior is not None and prior.ino != inode.ino:
            self.needs_source(tx, prior.ino, key)
        if self.node:
            putting.held_by(tx, key, self.node, self.home_alive)

    def _intend_put(self, tx: MetaTxn, r: Round, key: str, inode: Inode) -> int:
        """The put-intention's body: raises :class:`Superseded` (before writing) when the
        key no longer names this version or another node's upload to it may be in
        flight; returns the inode whose object at ``key`` must be rescued first, or 0 once
        the intention is written and the key guarded as in flight."""
        if not self._still_wanted(tx, key, inode, r):
            raise Superseded(key)
        prior = intents.get(tx, key)
        needy = (prior.ino if prior is not None and prior.ino != inode.ino
                 and self.needs_source(tx, prior.ino, key) else 0)
        if self.node and putting.held_by(tx, key, self.node, self.home_alive):
            # another node's upload to this key may be in flight: after it lands (the
            # file stays queued and is tried again), so the newest lands last
            raise Superseded(key)
        if not needy:
            r.tokens[key] = intents.intend(tx, key, inode.ino)
            self.putting[key] = inode.ino
            if self.node:
                putting.mark(tx, key, self.node, inode.ino)
        return needy

    async def _upload(self, r: Round, inode: Inode, key: str) -> str:
        ino, size = inode.ino, inode.size
        md5 = inode.etag if len(inode.etag) == 32 and "-" not in inode.etag else None
        if size == 0:  # nothing to read: no hot file to open (a create burst's cost)
            info = await self._send(r, key, inode, self._empty, 0, md5 or EMPTY_MD5)
        else:
            await self.ensure(ino, 0, size, touch=False)  # the whole content must be local
            with self.hold(ino):
                async with self.hot.fd(ino, create=True) as fd:
                    if md5 is not None:
                        info = await self._send(r, key, inode, fd, size, md5)
                    else:  # FUSE-written: hashed alongside the upload, kept as the ETag
                        info = await self._send_hashing(r, inode, key, fd)
        self.stats.uploaded_bytes += size
        return info.etag

    async def _send_hashing(self, r: Round, inode: Inode, key: str, fd: int) -> ObjectInfo:
        """Upload ``fd`` and hash it in a thread at the same time (both read the same page
        cache; the upload is not held back, and a delete still cancels it at once).  The
        MD5 goes to ``r`` for the record transaction; a failed hash only leaves the ETag
        to be computed on demand."""
        stop = threading.Event()
        hashing = asyncio.ensure_future(asyncio.to_thread(_md5_of, fd, inode.size, stop))
        try:
            info = await self._send(r, key, inode, fd, inode.size, None)
            with contextlib.suppress(OSError):
                r.md5, r.md5_version = await hashing, inode.version
            return info
        finally:
            stop.set()  # the thread reads ``fd``: it must be done before the fd closes
            await asyncio.wait({hashing})

    async def _send(self, r: Round, key: str, inode: Inode, source: int | str, size: int,
                    md5: str | None) -> ObjectInfo:
        """``cold.put_file`` as a task a delete of the file cancels (:meth:`gone`)."""
        ino = r.ino
        with self.meta.snapshot() as tx:  # no await from this check to the task
            if not self._still_wanted(tx, key, inode, r):
                raise Superseded(key)
        task = asyncio.ensure_future(self.cold.put_file(key, source, size, md5_hex=md5))
        self._uploads[ino] = task
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if task.cancelled() and (me is None or not me.cancelling()):
                raise Superseded(key) from None  # the file was deleted
            raise
        finally:
            self._uploads.pop(ino, None)

    async def _copy(self, key: str, have: dict[str, str]) -> str | None:
        """Another name of the same content: a server-side copy from a key cold holds at
        this version (checked by ETag first); None when none is usable."""
        for src, src_etag in have.items():
            try:
                info = await self.cold.head(src)
                if info is not None and info.etag == src_etag:
                    return (await self.cold.copy(src, key)).etag
            except (ObjectNotFound, KeyConflict, KeyRejected):
                continue
        return None


def _cleaned(cur: Inode | None, version: int, stored: bool) -> bool:
    """Mark ``cur`` CLEAN (True: changed) when cold now stores its current version."""
    if cur is None or not stored or cur.version != version or cur.state == STATE_CLEAN:
        return False
    cur.state = STATE_CLEAN
    return True


def _md5_of(fd: int, size: int, stop: threading.Event) -> str:
    """MD5 of the first ``size`` bytes of ``fd`` (a short tail reads as zeros, as the
    namespace's on-demand hash reads it); ``""`` once ``stop`` is set."""
    h = hashlib.md5(usedforsecurity=False)
    pos = 0
    while pos < size:
        if stop.is_set():
            return ""
        n = min(4 << 20, size - pos)
        chunk = os.pread(fd, n, pos) or bytes(n)
        h.update(chunk)
        pos += len(chunk)
    return h.hexdigest()
