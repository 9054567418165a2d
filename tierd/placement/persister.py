"""Write-back: the persister task that makes cold match the namespace, inode by inode.

Each queued inode (``Q`` key) is reconciled: its keys are the paths of its names; content
whose version cold lacks is uploaded once (``put_file``, MD5 checked by the store) and copied
server-side to its other names; keys it is no longer named by are deleted (unless another
file owns that key now); then, in one transaction, the cold record is updated and the inode
marked CLEAN **only if** the queue token is unchanged -- a file changed while uploading stays
queued and the next round uploads the newer version over the older one.  Cold being down
backs off (``probe()``) and resumes by itself; the queue survives restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time

from tierd.meta import STATE_CLEAN, ColdRecord, MetaTxn
from tierd.placement.engine import WARM
from tierd.placement.memtier import MEM
from tierd.placement.paths import file_keys, files_under, resolve
from tierd.placement.reads import Reading
from tierd.tiers import KeyConflict, ObjectNotFound, TierError, TierUnavailable

log = logging.getLogger("tierd.placement")

FULL_SCAN_INTERVAL = 5.0  # seconds; in between, only newly queued inodes are looked at
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


class Placement(Reading):
    """The placement engine with its persister; ``start()``/``close()`` run the task."""

    _task: asyncio.Task[None] | None = None
    _wake_ev: asyncio.Event | None = None

    async def start(self) -> None:
        hot = await asyncio.to_thread(self.hot.inventory)
        warm = await asyncio.to_thread(self.warm.inventory) if self.warm is not None else None
        self.load_state(hot, warm)
        self._wake_ev = asyncio.Event()
        self._active: dict[int, asyncio.Task[None]] = {}
        self._not_before = Deadlines()  # ino -> no retry before (back-off)
        self._failures: dict[int, int] = {}
        self._deferred: set[int] = set()  # still queued after a round (open for writing)
        self._later = Deadlines()  # ino -> when its persist delay is over
        self._hurry = 0  # waiters for persistence (drain, write-through): no delay meanwhile
        self._sem = asyncio.Semaphore(self.settings.persist_parallel)
        self.cold_down = False
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

    # -- the loop ----------------------------------------------------------------------
    async def _loop(self) -> None:
        assert self._wake_ev is not None
        delay = self.settings.retry_delay
        full_at = 0.0  # the next full scan of the queue
        while not self._closing:
            self._wake_ev.clear()
            if self.cold_down:
                try:
                    await self.cold.probe()
                except TierError as e:
                    log.info("cold store still unavailable (%s); retrying in %.1fs", e, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)
                    continue
                log.warning("cold store is back: resuming persistence")
                self.cold_down = False
                self._not_before.clear()
                delay = self.settings.retry_delay
                full_at = 0.0
            now = time.monotonic()
            if now >= full_at:
                self.hints.clear()
                with self.meta.snapshot() as tx:
                    queue = tx.list_queue()
                live = set(queue)
                for ino in list(self.dirty):  # a queue entry dropped by an aborted txn
                    if ino not in live and ino not in self._active:
                        self._set_dirty(ino, 0)
                full_at = now + FULL_SCAN_INTERVAL
                self._later.clear()
            else:  # queued since, waited out a back-off or its delay, no longer written
                idle = {i for i in self._deferred if not self.busy(i)}
                self._deferred -= idle
                due = self._later.take_all() if self._hurrying() else self._later.take_due(now)
                queue = sorted(self.hints | idle | due | self._not_before.take_due(now))
                self.hints.clear()
            queue = self._past_delay(queue, now)
            for ino in queue:
                if ino in self._active:
                    self.hints.add(ino)  # queued again while being persisted: once more after
                    continue
                if self._not_before.get(ino, 0) > now:
                    continue
                self._active[ino] = asyncio.create_task(self._one(ino))
            waits = [t - now for t in (self._not_before.earliest(), self._later.earliest())
                     if t is not None]
            if self._deferred:  # a writer's close does not always queue the file again
                waits.append(DEFERRED_POLL)
            timeout = min([*waits, 5.0])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_ev.wait(), timeout=max(timeout, 0.01))

    def _hurrying(self) -> bool:
        return bool(self._hurry) or self.dirty_bytes > self.settings.dirty_limit // 2

    def _past_delay(self, queue: list[int], now: float) -> list[int]:
        """The queued inodes whose persist delay is over (the rest wait in ``_later``).

        The delay runs from when a file was first queued (the queue token starts with that
        time and keeps it while the file changes again), like the kernel's dirty expiry:
        a file created and removed or rewritten within it (temporary files, write-then-
        rename) never costs the cold store anything, and a file written without pause is
        still persisted.  No delay while someone waits for persistence or dirty data
        passes half its limit."""
        delay = self.settings.persist_delay
        if delay <= 0 or not queue or self._hurrying():
            return queue
        wall = time.time_ns()
        ready: list[int] = []
        with self.meta.snapshot() as tx:
            for ino in queue:
                token = tx.queued(ino)
                if token is None:
                    continue
                left = delay - (wall - int.from_bytes(token[:8], "big")) / 1e9
                if left > 0:
                    self._later.put(ino, now + left)
                else:
                    ready.append(ino)
        return ready

    async def _one(self, ino: int) -> None:
        try:
            async with self._sem:
                if not await self.reconcile(ino):
                    self._deferred.add(ino)
            self._failures.pop(ino, None)
            self._not_before.pop(ino)
        except TierUnavailable as e:
            self.stats["persist_failures"] += 1  # tierd_cold_store_errors_total
            if not self.cold_down:
                log.warning("persisting inode %d failed: cold store unavailable: %s "
                            "(dirty data stays local; retrying)", ino, e)
            self.cold_down = True
            self._backoff(ino)
        except (TierError, OSError) as e:  # KeyConflict until a pending delete ran, ...
            log.warning("persisting inode %d failed, will retry: %s", ino, e)
            self.stats["persist_failures"] += 1
            self._backoff(ino)
        except Exception:
            log.exception("persisting inode %d failed", ino)
            self.stats["persist_failures"] += 1
            self._backoff(ino)
        finally:
            self._active.pop(ino, None)
            self._signal()
            self.wake()

    def _backoff(self, ino: int) -> None:
        n = self._failures.get(ino, 0) + 1
        self._failures[ino] = n
        self._not_before.put(ino, time.monotonic() + min(
            self.settings.retry_delay * 2 ** (n - 1), 30.0))

    # -- one inode ---------------------------------------------------------------------
    async def reconcile(self, ino: int) -> bool:
        """Bring cold in line with inode ``ino``; True when it left the queue."""
        with self.meta.snapshot() as tx:
            token = tx.queued(ino)
            if token is None:
                return True
            inode = tx.get_inode(ino)
            rec = tx.get_cold(ino)
            live = inode is not None and inode.is_reg and inode.nlink > 0
            targets = file_keys(tx, ino) if live else []
        policy = self.policy_for(targets[0]) if targets else None
        if policy is not None and policy.mode == "cache-only":
            targets = []
        old = dict(rec.keys) if rec is not None else {}
        new: dict[str, str] = {}
        version = rec.version if rec is not None else 0
        size = rec.size if rec is not None else 0
        if inode is not None and targets:
            if self.busy(ino):  # unflushed writes: the commit re-queues it
                return False
            if self.unpublished(targets):  # renamed into place soon: upload it then
                return False
            if rec is None or rec.version != inode.version:
                new[targets[0]] = await self._upload(ino, targets[0], inode.size, inode.etag)
                version, size = inode.version, inode.size
            for k in targets:
                if k in new:
                    continue
                if k in old:
                    new[k] = old[k]
                    continue
                new[k] = await self._copy_or_upload(ino, k, new or old, inode.size,
                                                    inode.etag)
        for k in old:
            if k not in new:
                with self.meta.snapshot() as tx:
                    owner = resolve(tx, k)
                if owner is None or owner == ino:
                    await self.cold.delete(k)
        with self.meta.write() as tx:
            if new:
                tx.put_cold(ino, ColdRecord(version, size, new, time.time_ns()))
            else:
                tx.delete_cold(ino)
            if tx.queued(ino) != token or self.busy(ino):
                return False
            tx.dequeue(ino)
            self._mark_clean(tx, ino, version, bool(new))
        self._set_dirty(ino, 0)
        self.stats["persisted"] += 1
        if new and policy is not None and policy.tier == WARM and self.warmc is not None:
            # the prefix's data belongs on warm: writes land on hot (the namespace's open
            # files, staging and S3 sendfile use the hot file) and move down once clean
            await self.demote_file(ino)
        elif new and policy is not None and policy.tier == MEM:
            self.admit_mem_later(ino)  # kept in pool memory (a no-op when it has its copy)
        return True

    @staticmethod
    def _mark_clean(tx: MetaTxn, ino: int, version: int, stored: bool) -> None:
        cur = tx.get_inode(ino)
        if cur is not None and stored and cur.version == version and cur.state != STATE_CLEAN:
            cur.state = STATE_CLEAN
            tx.put_inode(cur)

    async def _upload(self, ino: int, key: str, size: int, etag: str) -> str:
        await self.ensure(ino, 0, size, touch=False)  # the whole content must be local
        md5 = etag if len(etag) == 32 and "-" not in etag else None
        with self.hold(ino):
            async with self.hot.fd(ino, create=True) as fd:
                info = await self.cold.put_file(key, fd, size, md5_hex=md5)
        self.stats["uploaded_bytes"] += size
        return info.etag

    async def _copy_or_upload(self, ino: int, key: str, have: dict[str, str], size: int,
                              etag: str) -> str:
        """Another name of the same content: a server-side copy from a key cold holds at
        this version (checked by ETag first), else an upload."""
        for src, src_etag in have.items():
            try:
                info = await self.cold.head(src)
                if info is not None and info.etag == src_etag:
                    return (await self.cold.copy(src, key)).etag
            except (ObjectNotFound, KeyConflict):
                continue
        return await self._upload(ino, key, size, etag)

    async def wait_persisted(self, ino: int) -> None:
        """Until cold holds the inode's current content and names (write-through)."""
        self._hurry += 1
        try:
            while True:
                with self.meta.snapshot() as tx:
                    if tx.queued(ino) is None:
                        return
                ev = self._progress
                self.wake()
                await ev.wait()
        finally:
            self._hurry -= 1

    async def drain(self, prefix: str = "", timeout: float | None = None) -> bool:
        """Wait until no queued inode has a key under ``prefix`` (``persist --wait``); False
        after ``timeout`` seconds.  The deadline is checked in the loop rather than by an
        outer ``wait_for``, whose cancellation of the inner wait 3.11 can lose."""
        self._hurry += 1  # no persist delay while someone waits
        try:
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while True:
                with self.meta.snapshot() as tx:
                    if prefix:  # the prefix's subtree, not the whole queue
                        busy = any(tx.queued(f.ino) is not None for f in files_under(tx, prefix))
                    else:
                        busy = bool(tx.list_queue())
                if not busy:
                    return True
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
