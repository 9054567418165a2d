"""The assembled placement engine, :class:`Placement` (the core, eviction, reads, uploads and
deletes it inherits), and its write-back: the persister task that makes cold match the
namespace, inode by inode.

Each queued inode (``Q`` key) is reconciled (``upload.py``): content whose version cold
lacks is uploaded once and copied server-side to its other names, keys it is no longer named
by become pending deletes (``intents``, carried out by ``deletes.py``), and the inode leaves
the queue CLEAN only if it did not change meanwhile.

Failures: a failure of one file is that file's (``failures.py``: capped back-off,
unpersistable files named in the status, rate-limited logs).  The store counts as down only
when it does not answer a probe, when a call failed as unavailable, or when a call has hung
for ``call_timeout`` (:class:`~tierd.tiers.object_tier.Health`); an idle store is probed
every ``probe_interval`` seconds so a hung one is noticed.  While it is down, persisting and
listing for import pause (reads of local data go on); it is probed with back-off and
persisting resumes by itself.  The queue and the pending deletes survive restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Iterable
from typing import Any

from tierd.errors import FsError, Reason
from tierd.meta import MetaTxn
from tierd.meta.atxn import off_loop
from tierd.placement import homes, intents, putting
from tierd.placement.failures import RETRY_MAX, Failures
from tierd.placement.paths import file_keys, files_under
from tierd.placement.upload import Uploading
from tierd.tiers import InvalidKey, KeyRejected, TierError, TierThrottled, TierUnavailable

log = logging.getLogger("tierd.placement")

FULL_SCAN_INTERVAL = 5.0  # seconds; in between, only newly queued inodes are looked at
#: the namespace counts as busy while a file was queued or removed this recently: write-back
#: of files past their persist delay then waits for a pause (at most one more persist delay)
BUSY_QUIET = 0.2
DEFERRED_POLL = 0.05  # seconds between looks at files left queued because they were busy


class Deadlines:
    """Inode -> a monotonic time, with the due ones found in O(log n) each.

    The persister looks at these on every wake-up, and a burst of writes wakes it once per
    file: scanning thousands of files waiting out their delay on each wake cost a fifth of
    the event loop's time in a small-PUT burst.  Stale heap entries (re-set or removed
    inodes) are skipped when they reach the top."""

    def __init__(self) -> None:
        self._at: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []

    def get(self, ino: int, default: float = 0.0) -> float:
        return self._at.get(ino, default)

    def put(self, ino: int, at: float) -> None:
        self._at[ino] = at
        heapq.heappush(self._heap, (at, ino))

    def pop(self, ino: int) -> None:
        self._at.pop(ino, None)

    def clear(self) -> None:
        self._at.clear()
        self._heap.clear()

    def earliest(self) -> float | None:
        heap = self._heap
        while heap and self._at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def take_due(self, now: float) -> set[int]:
        """Remove and return the inodes due at ``now``."""
        due: set[int] = set()
        while (t := self.earliest()) is not None and t <= now:
            _, ino = heapq.heappop(self._heap)
            del self._at[ino]
            due.add(ino)
        return due

    def take_all(self) -> set[int]:
        due = set(self._at)
        self.clear()
        return due


class Placement(Uploading):
    """The placement engine with its persister; ``start()``/``close()`` run the task."""

    _task: asyncio.Task[None] | None = None
    _wake_ev: asyncio.Event | None = None
    _asleep = False  # the loop waits for a wake or its timeout (nudge)

    async def start(self) -> None:
        hot = await asyncio.to_thread(self.hot.inventory)
        warm = await asyncio.to_thread(self.warm.inventory) if self.warm is not None else None
        self.load_state(hot, warm)
        if self.node:  # marks of uploads of this node's previous run: none is in flight
            async with self.meta.awrite() as tx:
                putting.drop_own(tx, self.node)
        self.init_deletes()
        self.init_uploads()
        self._wake_ev = asyncio.Event()
        self._active: dict[int, asyncio.Task[None]] = {}
        self._not_before = Deadlines()  # ino -> no retry before (back-off)
        self.failures = Failures(self.settings.retry_delay)
        self._waiting_store: set[int] = set()  # failed because the store was down
        self._deferred: set[int] = set()  # still queued after a round (open for writing)
        self._later = Deadlines()  # ino -> when its persist delay is over
        self._again: set[int] = set()  # queued again while active: looked at after it ends
        self._held = Deadlines()  # ino -> the latest its write-back waits for a pause
        # (_queued_at, the engine's: ino -> when it was first queued, wall ns, its queue
        # token's first 8 bytes; kept while the file is queued, read once if not known)
        self._hurry = 0  # waiters for persistence (drain, write-through): no delay meanwhile
        # transfers (uploads, copies, fetches for them) at once; reconciles at once (they
        # mostly wait for a metadata flush, which concurrent ones share)
        self.transfers = asyncio.Semaphore(self.settings.persist_parallel)
        self._slots = asyncio.Semaphore(max(64, 16 * self.settings.persist_parallel))
        self.cold_down = False
        self._probe: asyncio.Task[bool] | None = None
        self._closing = False
        self._task = asyncio.create_task(self._loop(), name="tierd-persister")

    async def close(self) -> None:
        if self._task is not None:
            # the flag, not only the cancel: Python 3.11's wait_for loses a cancellation
            # that arrives as its inner wait completes (an upload's last wake() does that),
            # and the loop would then run on forever
            self._closing = True
            self.wake()
            self._task.cancel()
            for t in list(self._active.values()):
                t.cancel()
            await asyncio.gather(self._task, *self._active.values(), return_exceptions=True)
            await self.txns.finish()
            await self.stop_deletes()
            if self._probe is not None:
                self._probe.cancel()
                await asyncio.gather(self._probe, return_exceptions=True)
            self._task = None

    async def import_buckets(self) -> None:
        """Buckets cold has and the namespace lacks appear (after the root exists)."""
        try:
            await self.importer.import_buckets()
        except TierError as e:
            log.warning("cannot list the cold store for buckets at start: %s", e)

    async def shutdown(self) -> None:
        """Stop the persister and close the tiers (the queue stays for the next start)."""
        await self.close()
        await self.cold.close()
        await self.hot.close()

    def wake(self) -> None:
        if self._wake_ev is not None:
            self._wake_ev.set()

    def nudge(self) -> None:
        """A file was queued (:meth:`enqueue`): wake the persister, unless it sleeps (it
        then looks at the new hints within half the persist delay: :meth:`_loop` sleeps no
        longer, and a new file is due only a whole delay after its stamp; a file queued
        again after its delay waits at most half a delay more) and nobody waits for
        persistence nor is dirty data past half its limit.  A burst of creates woke it once
        per file, each wake a round of the loop that only filed the new hint under
        ``_later``: 11.5% of the event loop's busy time while one process created files
        through the mount."""
        if self._asleep and self.settings.persist_delay > 0 and not self._hurrying():
            return
        self.wake()

    # -- the loop ----------------------------------------------------------------------
    async def _loop(self) -> None:
        assert self._wake_ev is not None
        delay = self.settings.retry_delay
        full_at = 0.0  # the next full scan of the queue
        while not self._closing:
            self._wake_ev.clear()
            self._watch()
            if self.cold_down:
                if not await self._answers():
                    log.info("cold store still unavailable (%s); retrying in %.1fs",
                             self.cold.health.error or "no answer", delay)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake_ev.wait(), timeout=delay)
                    delay = min(delay * 2, RETRY_MAX)
                    continue
                log.warning("cold store %s is back: resuming persistence", self.cold.url)
                self.cold_down = False
                for ino in self._waiting_store:  # what failed only because it was down
                    self._not_before.put(ino, 0.0)
                self._waiting_store.clear()
                delay = self.settings.retry_delay
                full_at = 0.0
            now = time.monotonic()
            if now >= full_at:
                self.hints.clear()
                # synchronous: a transaction whose body queued a file (and counted it
                # dirty) after this began could commit after its snapshot (pg_async)
                with self.meta.snapshot() as tx:
                    queue = tx.list_queue()
                live = set(queue)
                for ino in [i for i in self._queued_at if i not in live]:
                    del self._queued_at[ino]  # left the queue (and may come back anew)
                for ino in list(self.dirty):  # a queue entry dropped by an aborted txn
                    if ino not in live and ino not in self._active:
                        self._set_dirty(ino, 0)
                full_at = now + FULL_SCAN_INTERVAL
                if self.node and self.home_alive is not None:
                    await self._sweep_homes(queue)
                self._later.clear()
                self._held.clear()
                self.kick_deletes()
            else:  # queued since, waited out a back-off or its delay, no longer written
                idle = {i for i in self._deferred if not self.unsettled(i)}
                self._deferred -= idle
                if self._hurrying():
                    due = self._later.take_all() | self._held.take_all()
                else:
                    due = self._later.take_due(now) | (
                        self._held.take_due(now) if self._busy(now) else self._held.take_all())
                queue = sorted(self.hints | idle | due | self._not_before.take_due(now))
                self.hints.clear()
                if self.deletes_hint:
                    self.kick_deletes()
            queue = await self._past_delay(queue, now)
            if self.node and queue:  # a node of a cluster persists the versions it holds
                async with self.meta.asnapshot() as tx:
                    queue = [ino for ino in queue if self.mine(tx, ino)]
            for ino in queue:
                if ino in self._active:
                    # queued again while being persisted: once more after it ends (_one),
                    # not on every wake meanwhile: a burst's thousands of files waiting
                    # for a slot were walked again on each of its creates
                    self._again.add(ino)
                    continue
                if self._not_before.get(ino, 0) > now:
                    continue
                self._active[ino] = asyncio.create_task(self._one(ino))
            held = self._held.earliest()
            waits = [t - now for t in (self._not_before.earliest(), self._later.earliest(),
                                       held) if t is not None]
            if held is not None:  # they go at the burst's first pause
                waits.append(self.changed_lately + BUSY_QUIET - now)
            if self._deferred:  # a writer's close does not always queue the file again
                waits.append(DEFERRED_POLL)
            timeout = min([*waits, 5.0, self.settings.probe_interval / 2])
            if self.settings.persist_delay > 0:  # new hints wake it only when hurried
                timeout = min(timeout, self.settings.persist_delay / 2)
            self._asleep = True
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake_ev.wait(), timeout=max(timeout, 0.01))
            finally:
                self._asleep = False

    # -- the store's health --------------------------------------------------------------
    def _watch(self) -> None:
        """Notice a store that stopped answering (a call failed as unavailable, or hangs),
        and probe one that was idle for ``probe_interval``: a hung store must show as
        unreachable even when nothing uses it."""
        health = self.cold.health
        if not self.cold_down and not self.cold.reachable():
            reason = self.cold.describe_health()["reason"]
            self._store_down(reason or "no answer")
        elif (not self.cold_down and self._probe is None
              and time.monotonic() - health.ok_at > self.settings.probe_interval):
            self._probe = asyncio.create_task(self._probe_once())

    async def _probe_once(self) -> bool:
        try:
            await self.cold.probe()
            return True
        except TierThrottled:
            return True  # it answered "slow down": up, and busy (files back off alone)
        except TierError:
            return False
        finally:
            self._probe = None
            self.wake()

    async def _answers(self) -> bool:
        """Whether the store answers a probe now (one probe at a time)."""
        task = self._probe
        if task is None:
            task = self._probe = asyncio.create_task(self._probe_once())
        return await asyncio.shield(task)

    def _store_down(self, why: object) -> None:
        if not self.cold_down:
            log.warning("cold store %s unreachable: %s (persisting paused, dirty data stays "
                        "local, local data stays readable; retrying)", self.cold.url, why)
        self.cold_down = True
        self.wake()

    def cold_status(self) -> dict[str, Any]:
        """The cold store in the status documents: reachability and its evidence, and the
        pending deletes."""
        doc = self.cold.describe_health()
        doc["reachable"] = bool(doc["reachable"]) and not self.cold_down
        if self.cold_down and not doc.get("reason"):
            doc["reason"] = self.cold.health.error or "no answer to the last probe"
        with self.meta.snapshot() as tx:
            n, more = intents.count(tx, 2000)
        doc["pending_deletes"] = n
        doc["pending_deletes_truncated"] = more
        return doc

    def queue_summary(self, limit: int = 2000) -> dict[str, Any]:
        """The persist queue (see the engine's) with the failing and unpersistable files,
        and on a cluster the files stranded on dead nodes (:mod:`tierd.placement.homes`)."""
        doc = super().queue_summary(limit)
        doc.update(self.failures.describe())
        if self.node:
            doc["stranded"] = [s.describe() for _, s in sorted(self.stranded.items())]
        return doc

    async def _sweep_homes(self, queue: list[int]) -> None:
        """A node of a cluster takes over what dead homes queued and cold already holds,
        and lists the rest as stranded (a full scan's work: every FULL_SCAN_INTERVAL).
        In a worker thread over PostgreSQL: a read per queued file of another node, and a
        write (the cluster's writer lock) per file taken over."""
        assert self.home_alive is not None
        before = {n: len(s.inos) for n, s in self.stranded.items()}
        try:
            taken, self.stranded = await off_loop(self.meta, homes.sweep, self.meta,
                                                  self.node, queue, self.home_alive)
        except OSError as e:  # the database failing: the next full scan tries again
            log.warning("looking for files of dead nodes failed: %s", e)
            return
        if taken:
            log.warning("took over %d queued files of dead nodes (their versions are in "
                        "the cold store): their names are persisted from here", len(taken))
        for s in self.stranded.values():
            if before.get(s.node) == len(s.inos):
                continue  # said already (every full scan would repeat it)
            log.error("%d queued files of node %r, which is dead, have bytes no live node "
                      "holds (first: %s): they persist when it comes back",
                      len(s.inos), s.node, ", ".join(s.keys[:3]))

    def _hurrying(self) -> bool:
        return bool(self._hurry) or self.dirty_bytes > self.settings.dirty_limit // 2

    def _busy(self, now: float) -> bool:
        return now - self.changed_lately < BUSY_QUIET

    async def _past_delay(self, queue: list[int], now: float) -> list[int]:
        """The queued inodes whose persist delay is over (the rest wait in ``_later``).

        The delay runs from when a file was first queued (the queue token starts with that
        time and keeps it while the file changes again), like the kernel's dirty expiry:
        a file created and removed or rewritten within it (temporary files, write-then-
        rename) never costs the cold store anything, and a file written without pause is
        still persisted.  No delay while someone waits for persistence or dirty data
        passes half its limit.

        While files keep being queued or removed (a burst: the last less than
        :data:`BUSY_QUIET` ago), a file whose delay is over waits in ``_held`` for the
        burst's first pause, for at most one more delay. On two cores the uploads of a
        burst's first files halved the rate of the creates still coming (10,000 files
        through the mount: ~950 creates/s until the persister started, ~400/s after); a
        burst no longer than the delay now ends before its uploads begin, and a longer one
        still has each file sent within twice the delay.

        The stamp of each inode is read from the queue once and kept (``_queued_at``) until
        the inode leaves the queue: a burst of creates woke this for every file, and reading
        every waiting token again each time cost more of the loop than the creates."""
        delay = self.settings.persist_delay
        if delay <= 0 or not queue or self._hurrying():
            return queue
        wall = time.time_ns()
        ready: list[int] = []
        known = self._queued_at
        busy = self._busy(now)
        missing = [ino for ino in queue if ino not in known]
        if missing:
            # fresh: a hint comes from a body whose commit may still be in flight
            def tokens(tx: MetaTxn) -> None:  # read off the loop first (tierd.meta.atxn)
                for ino in missing:
                    tx.queued(ino)
            async with self.meta.asnapshot(fresh=True, warm=tokens) as tx:
                for ino in missing:
                    token = tx.queued(ino)
                    if token is not None:
                        known[ino] = int.from_bytes(token[:8], "big")
        for ino in queue:
            stamp = known.get(ino)
            if stamp is None:
                continue  # not queued (a hint for a file that left the queue meanwhile)
            left = delay - (wall - stamp) / 1e9
            if left > 0:
                self._later.put(ino, now + left)
            elif busy and left > -delay:
                self._held.put(ino, now + left + delay)
            else:
                ready.append(ino)
        return ready

    async def _one(self, ino: int) -> None:
        try:
            async with self._slots:
                if not await self.reconcile(ino):
                    if ino not in self.held_back:  # (else the publish's end hints it)
                        self._deferred.add(ino)
                    return
            self._queued_at.pop(ino, None)  # dequeued: a new queueing has a new stamp
            self.held_back.discard(ino)
            self._not_before.pop(ino)
            self._waiting_store.discard(ino)
            self.rescue_done(ino)
            f = self.failures.clear(ino)
            if f is not None and f.unpersistable:
                log.warning("inode %d (%s) was persisted after all", ino, f.key)
        except (TierUnavailable, FsError) as e:
            self.stats.persist_failures += 1  # tierd_cold_store_errors_total
            local = isinstance(e, FsError) and e.reason is not Reason.SERVICE_UNAVAILABLE
            # a throttled request is an answer (the store asked to slow down); else a
            # probe says whether the store answers: either way, this file's failure
            if local or isinstance(e, TierThrottled) or await self._answers():
                self._file_failed(ino, e, permanent=False)
            else:
                self._store_down(e)
                self._waiting_store.add(ino)
                self._not_before.put(ino, time.monotonic() + RETRY_MAX)  # until it is back
        except (InvalidKey, KeyRejected) as e:  # the store can never take this key
            self.stats.persist_failures += 1
            self._file_failed(ino, e, permanent=True)
        except (TierError, OSError) as e:  # KeyConflict until a pending delete ran, ...
            self.stats.persist_failures += 1
            self._file_failed(ino, e, permanent=False)
        except Exception as e:
            self.stats.persist_failures += 1
            if self._file_failed(ino, e, permanent=False):
                log.exception("persisting inode %d failed unexpectedly", ino)
        finally:
            self._active.pop(ino, None)
            if ino in self._again:
                self._again.discard(ino)
                self.hints.add(ino)
            self._signal()
            self.wake()

    def never_sent(self, ino: int) -> bool:
        """A single node's file that no reconcile is working on and no put of which is in
        flight: deleting it before it was sent, its unlink dequeues it (a create burst's
        temporary files cost the persister nothing); deleting it once sent, its unlink
        drops its record too (its objects are pending deletes by then).  Not on a cluster:
        another node may be persisting it (its put marks are the rule there), its
        reconcile decides."""
        if self.node or self._task is None or ino in self._active:
            return False
        return ino not in self.putting.values()

    def _dropped_unsent(self, ino: int) -> None:
        super()._dropped_unsent(ino)
        self._queued_at.pop(ino, None)
        self._later.pop(ino)
        self._held.pop(ino)
        self._not_before.pop(ino)
        self._deferred.discard(ino)
        self.held_back.discard(ino)
        self._waiting_store.discard(ino)
        self.failures.clear(ino)
        self.rescue_done(ino)
        self._signal()  # a drain or write-through waiter looks again

    def _file_failed(self, ino: int, e: BaseException, *, permanent: bool) -> bool:
        """Back off one file; True when the failure was logged."""
        key = getattr(e, "key", None)
        if not key:
            with self.meta.snapshot() as tx:
                keys = file_keys(tx, ino)
            key = keys[0] if keys else f"inode {ino}"
        delay, line = self.failures.record(ino, key, e, permanent=permanent)
        self._not_before.put(ino, time.monotonic() + delay)
        if line is not None:
            log.warning("%s", line)
        return line is not None

    def names_moved(self, ino: int) -> None:
        """A file was renamed: a key the store refused may be fine now -- try at once (and
        judge it afresh: ``persist --wait`` waits for that try)."""
        if self._task is not None:
            self._not_before.pop(ino)
            self.failures.clear(ino)

    async def wait_persisted(self, ino: int) -> None:
        """Until cold holds the inode's current content and names (write-through)."""
        self._hurry += 1
        try:
            while True:
                async with self.meta.asnapshot() as tx:
                    if tx.queued(ino) is None:
                        return
                ev = self._progress
                self.wake()
                await ev.wait()
        finally:
            self._hurry -= 1

    async def drain(self, prefix: str = "", timeout: float | None = None) -> bool:
        """Wait until no queued inode has a key under ``prefix`` and no delete under it is
        pending (``persist --wait``: cold then holds exactly the live keys); False after
        ``timeout`` seconds, or as soon as all that is left are files the store cannot take
        (unpersistable: :meth:`unpersistable_under` names them).  The deadline is checked
        in the loop rather than by an outer ``wait_for``, whose cancellation of the inner
        wait 3.11 can lose."""
        self._hurry += 1  # no persist delay while someone waits
        try:
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while True:
                async with self.meta.asnapshot() as tx:
                    left_over = self._outstanding(tx, prefix)
                if left_over != "wait":
                    return left_over == ""
                left = 1.0 if deadline is None else min(1.0, deadline - loop.time())
                if left <= 0:
                    return False
                ev = self._progress
                self.wake()
                # asyncio.wait, not wait_for: 3.11's wait_for loses a cancellation that
                # arrives as the event is set (a persist job cancelled at shutdown then
                # drained on, and the daemon did not stop)
                waiter = asyncio.ensure_future(ev.wait())
                try:
                    await asyncio.wait({waiter}, timeout=left)
                finally:
                    waiter.cancel()
        finally:
            self._hurry -= 1

    def _outstanding(self, tx: MetaTxn, prefix: str) -> str:
        """``wait`` while work under ``prefix`` can still be done, ``stuck`` when only
        unpersistable files (and deletes that wait for them) are left, else ``""``."""
        queued: Iterable[int]
        if prefix:  # the prefix's subtree, not the whole queue
            queued = [f.ino for f in files_under(tx, prefix, versions=True)
                      if tx.queued(f.ino) is not None]
        else:  # lazily: this runs after every persisted file, and stops at the first
            queued = tx.iter_queue()
        stuck = False
        judged: dict[str, bool] = {}
        for ino in queued:
            if not (self.failures.unpersistable(ino) or self._stranded(tx, ino, judged)):
                return "wait"
            stuck = True
        for it in intents.under(tx, prefix):
            if it.ino == intents.TOMB:
                continue  # carried out already (a cluster's tombstone): nothing to wait for
            if not (it.ino and self.failures.unpersistable(it.ino)):
                return "wait"
            stuck = True
        return "stuck" if stuck else ""

    def _stranded(self, tx: MetaTxn, ino: int, judged: dict[str, bool]) -> bool:
        """On a cluster: a queued file only a dead home holds (not in cold at its version)
        cannot be persisted by anyone until that node is back, so a wait stops for it as
        for an unpersistable file (``judged``: the homes looked at, alive or not)."""
        if self.home_alive is None:
            return False
        inode = tx.get_inode(ino)
        if inode is None or inode.home in ("", self.node) or inode.size == 0:
            return False
        if inode.home not in judged:
            judged[inode.home] = self.home_alive(inode.home)
        if judged[inode.home]:
            return False
        rec = tx.get_cold(ino)
        return not (rec is not None and rec.version == inode.version and rec.keys)

    def unpersistable_under(self, prefix: str) -> list[dict[str, Any]]:
        """The files under ``prefix`` the store cannot take (for ``persist --wait``)."""
        return [f for f in self.failures.describe(limit=1000)["unpersistable_files"]
                if f["key"].startswith(prefix)]
