"""The pending deletes' worker, the per-key gates that order puts and deletes of one cold
key, and the rescue of a file whose only copy is an object another upload will replace.

**Deletes** (``intents``) are carried out by a pass over the ``Z`` keys, run when the hooks
added some, when an upload finished (a deferred delete may be due) and with every full
scan of the queue, a batch of keys at a time.  Under the gates of the batch's keys, with
their records read again in one snapshot, a delete is

* **obsolete** when the key names a live regular file whose cold record lists it: the
  object is that file's (it replaced what was to be deleted) -- the intention is dropped;
* **deferred** while the inode whose object it is still needs it: alive, queued, and its
  record's version is its current one (its bytes may exist only there; its upload copies
  them to its new names first, then the delete runs);
* otherwise **done**, once the metadata that asked for it is durable (one flush for the
  batch): ``cold.delete_many`` of the batch's doomed keys (idempotent; a key the store
  cannot hold needs no delete; a key whose delete failed stays pending, its failures
  counted), each key gone noted in ``recent`` for listings in flight, and the intentions
  done removed in one transaction, each only if its token is unchanged (one written
  meanwhile is carried out by the next pass).  On a cluster a done delete leaves a
  tombstone instead (see ``intents.tombstone``).

**Gates**: a put (upload or copy) of key ``k`` holds ``k``'s gate from before it writes its
put-intention until its inode's record is written; a delete pass holds the gates of its
batch's keys for their check and call.  So a delete never lands after an upload it should
not undo, and two files never write one key at once.  A reconcile takes its keys in sorted
order (the upload goes to the first name), and so does a delete pass: none of them can
deadlock another.

**Rescue**: before a put replaces an object that another live file still needs (a pending
delete says whose it is), that file's bytes are fetched onto hot and held there until its
own upload is done -- checkpoint rotation (``mv ckpt ckpt.old; mv new ckpt``) of an evicted
file must not lose ``ckpt.old``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator

from tierd.meta import MetaTxn
from tierd.placement import intents
from tierd.placement.intents import Intent
from tierd.placement.paths import resolve
from tierd.placement.reads import Reading
from tierd.tiers import InvalidKey, KeyRejected, TierError, TierUnavailable

log = logging.getLogger("tierd.placement")
BATCH = 256


class KeyGates:
    """One asyncio lock per cold key in use, forgotten when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, n = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, n + 1)
        try:
            async with lock:
                yield
        finally:
            lock, n = self._locks[key]
            if n <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, n - 1)


class Deleting(Reading):
    """Adds the delete worker (:meth:`kick_deletes`) and the rescue to the read path."""

    transfers: asyncio.Semaphore  # the persister's (uploads, copies, their fetches)

    def init_deletes(self) -> None:
        self.gates = KeyGates()
        self._rescued: Counter[int] = Counter()
        self._delete_task: asyncio.Task[None] | None = None
        self._deletes_again = False
        self._delete_errors: dict[str, int] = {}

    # -- decisions (inside one snapshot) ----------------------------------------------------
    @staticmethod
    def needs_source(tx: MetaTxn, ino: int, key: str) -> bool:
        """Whether file ``ino`` may still need its object at ``key``: alive, queued, and
        cold's copy there is of its current version (its bytes may exist only there)."""
        inode = tx.get_inode(ino)
        rec = tx.get_cold(ino)
        return (inode is not None and inode.is_reg and inode.nlink > 0 and rec is not None
                and key in rec.keys and rec.version == inode.version
                and tx.queued(ino) is not None)

    @classmethod
    def decide(cls, tx: MetaTxn, it: Intent) -> str:
        """``obsolete``, ``defer`` or ``delete`` (see the module docstring)."""
        owner = resolve(tx, it.key)
        if owner is not None:
            oi = tx.get_inode(owner)
            orec = tx.get_cold(owner)
            if (oi is not None and oi.is_reg and oi.nlink > 0 and orec is not None
                    and it.key in orec.keys):
                return "obsolete"
        if it.ino and cls.needs_source(tx, it.ino, it.key):
            return "defer"
        return "delete"

    def theirs_to_delete(self, tx: MetaTxn, it: Intent) -> bool:
        """On a cluster, whether this node carries out ``it``: the node persisting a file
        is the only one that knows whether an upload to a key is in flight (its
        ``putting``), so a delete is left to the home of the intention's inode, and to the
        home of the file the key names now (whose upload replaces the object anyway)."""
        if not self.node:
            return True
        if not self.mine(tx, it.ino):
            return False
        owner = resolve(tx, it.key)
        return owner is None or self.mine(tx, owner)

    # -- the worker -------------------------------------------------------------------------
    def kick_deletes(self) -> None:
        """Run a pass over the pending deletes (or another one after the running pass)."""
        self.deletes_hint = False
        if self._delete_task is not None and not self._delete_task.done():
            self._deletes_again = True
            return
        self._delete_task = asyncio.create_task(self._delete_passes(), name="tierd-deletes")

    async def stop_deletes(self) -> None:
        task, self._delete_task = self._delete_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _delete_passes(self) -> None:
        while True:
            self._deletes_again = False
            try:
                await self._delete_pass()
            except TierUnavailable as e:
                # the persister's health check sees it (the call's failure is recorded) and
                # a full pass follows once the store answers again
                log.info("pending cold deletes wait for the cold store: %s", e)
                return
            except Exception:
                log.exception("pass over pending cold deletes failed")
                return
            self._signal()
            if not self._deletes_again:
                return

    async def _delete_pass(self) -> None:
        after = ""
        while True:
            def reads(tx: MetaTxn, after: str = after) -> None:  # off the loop (pg_warm)
                for it in intents.scan(tx, after, BATCH):
                    self._worth_a_look(tx, it)
            async with self.meta.asnapshot(warm=reads) as tx:
                batch = intents.scan(tx, after, BATCH)
                looked = [it.key for it in batch if self._worth_a_look(tx, it)]
            if not batch:
                return
            after = batch[-1].key
            todo = [k for k in looked if k not in self.putting]
            if todo:
                await self._delete_batch(todo)

    def _worth_a_look(self, tx: MetaTxn, it: Intent) -> bool:
        """Whether the pass's snapshot leaves :meth:`_delete_one` anything to do with
        ``it``: not for a tombstone still within its TTL, nor on a cluster for another
        node's delete -- each cost a read transaction of its own per pass, and a cluster
        keeps a tombstone for every delete of the last two minutes (bench/cluster_meta.py
        with write-back running: ~10 such transactions per create on every node).  What
        changes after the snapshot is seen by a later pass: a new intention hints one,
        and every full scan of the queue runs one."""
        if it.ino == intents.TOMB:
            return time.time_ns() - it.done_ns > intents.TOMB_TTL * 1e9
        return self.theirs_to_delete(tx, it)

    async def _delete_batch(self, keys: list[str]) -> None:
        """Carry out the deletes of ``keys`` as one batch: their gates (taken in sorted
        order, as a reconcile takes its keys: no deadlock), one snapshot that judges them
        all, one flush, one :meth:`~tierd.tiers.ObjectTier.delete_many` and one write
        transaction for the intentions done -- not each of these per key (48% of the event
        loop went to this worker while a process unlinked persisted files, bench/fuse_fio.py
        ``--only meta``).  Keys whose delete failed stay pending for a later pass; a
        :class:`TierUnavailable` of any key is raised once the others are recorded."""
        async with contextlib.AsyncExitStack() as gates:
            for key in sorted(set(keys)):
                await gates.enter_async_context(self.gates.hold(key))
            async with self.meta.asnapshot(
                    warm=lambda tx: [self._verdict(tx, k) for k in keys]) as tx:
                verdicts = {k: self._verdict(tx, k) for k in keys if k not in self.putting}
            doomed = [k for k, (_, v) in verdicts.items() if v == "delete"]
            unavailable: TierUnavailable | None = None
            if doomed:
                # the changes that made these objects unwanted must be durable before any of
                # them goes (rolled back by a crash, they would name objects already gone):
                # they committed before the snapshot that judged them, so one flush covers all
                await self.meta.flush(urgent=False)
                results = await self.cold.delete_many(doomed)
                for key in doomed:
                    err = results.get(key)
                    if key not in results:  # no answer for it: not known gone, left pending
                        del verdicts[key]
                    elif isinstance(err, TierUnavailable):
                        unavailable = unavailable or err
                        del verdicts[key]
                    elif err is not None and not isinstance(err, KeyRejected | InvalidKey):
                        self._delete_failed(key, err)
                        del verdicts[key]
                    else:  # gone (or a key the store cannot hold: nothing to delete)
                        self._delete_errors.pop(key, None)
                        self.recent.deleted(key)
                        self.stats.cold_deleted += 1
            done = {k: (it, v) for k, (it, v) in verdicts.items()
                    if it is not None and v != "defer"}
            if done:
                async with self.meta.awrite(
                        warm=lambda tx: [intents.get(tx, k) for k in done]) as tx:
                    for key, (it, v) in done.items():
                        if self.node and v == "delete":
                            intents.tombstone(tx, key, it.token)
                        else:
                            intents.clear(tx, key, it.token)
        if unavailable is not None:
            raise unavailable

    def _verdict(self, tx: MetaTxn, key: str) -> tuple[Intent | None, str]:
        """The intention on ``key`` now and what to do with it: ``delete``, ``obsolete``,
        ``expired`` (a tombstone past its TTL: cleared), or ``defer`` (left as it is: a
        delete still needed by its file, a live tombstone, another node's delete, or no
        intention any more)."""
        it = intents.get(tx, key)
        if it is None:
            return None, "defer"
        if it.ino == intents.TOMB:
            expired = time.time_ns() - it.done_ns > intents.TOMB_TTL * 1e9
            return it, "expired" if expired else "defer"
        if not self.theirs_to_delete(tx, it):
            return it, "defer"
        return it, self.decide(tx, it)

    def _delete_failed(self, key: str, e: TierError) -> None:
        n = self._delete_errors[key] = self._delete_errors.get(key, 0) + 1
        if n == 1 or n % 100 == 0:
            log.warning("deleting %s from the cold store failed (%d tries), will retry: %s",
                        key, n, e)

    # -- rescue -----------------------------------------------------------------------------
    async def rescue(self, ino: int) -> None:
        """Make file ``ino`` whole on hot and keep it there until its own upload is done
        (an object it needs is about to be replaced)."""
        async with self.meta.asnapshot() as tx:
            inode = tx.get_inode(ino)
        if inode is None or inode.nlink == 0:
            return
        log.info("inode %d: fetching its bytes before its cold object is replaced "
                 "(it has not been copied to its new name yet)", ino)
        async with self.transfers:
            await self.ensure(ino, 0, inode.size, touch=False)
        self.acquire(ino)
        self._rescued[ino] += 1
        self.stats.rescued += 1

    def rescue_done(self, ino: int) -> None:
        """File ``ino`` was persisted: release the holds of its rescues."""
        for _ in range(self._rescued.pop(ino, 0)):
            self.release(ino)
