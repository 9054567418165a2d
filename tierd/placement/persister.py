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
import logging
import time

from tierd.meta import STATE_CLEAN, ColdRecord, MetaTxn
from tierd.placement.engine import PlacementCore
from tierd.placement.paths import file_keys, resolve
from tierd.tiers import KeyConflict, ObjectNotFound, TierError, TierUnavailable

#: seconds before a file with unflushed writes is looked at again (bounds the delay a
#: write-through close can see after its commit)
BUSY_RECHECK = 0.01

log = logging.getLogger("tierd.placement")


class Placement(PlacementCore):
    """The placement engine with its persister; ``start()``/``close()`` run the task."""

    _task: asyncio.Task[None] | None = None
    _wake_ev: asyncio.Event | None = None

    async def start(self) -> None:
        self.load_state()
        self._wake_ev = asyncio.Event()
        self._active: dict[int, asyncio.Task[None]] = {}
        self._not_before: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._sem = asyncio.Semaphore(self.settings.persist_parallel)
        self.cold_down = False
        self._task = asyncio.create_task(self._loop(), name="tierd-persister")

    async def close(self) -> None:
        if self._task is not None:
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
        while True:
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
            with self.meta.snapshot() as tx:
                queue = tx.list_queue()
            live = set(queue)
            for ino in list(self.dirty):  # a queue entry dropped by an aborted txn
                if ino not in live and ino not in self._active:
                    self._set_dirty(ino, 0)
            now = time.monotonic()
            for ino in queue:
                if ino in self._active or self._not_before.get(ino, 0) > now:
                    continue
                self._active[ino] = asyncio.create_task(self._one(ino))
            waits = [t - now for t in self._not_before.values() if t > now]
            timeout = min([*waits, 5.0])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_ev.wait(), timeout=max(timeout, 0.01))

    async def _one(self, ino: int) -> None:
        try:
            async with self._sem:
                done = await self.reconcile(ino)
            self._failures.pop(ino, None)
            self._not_before.pop(ino, None)
            if not done and self.busy(ino):
                # a file being written: the wake() below would retry it at once, forever,
                # until the writer commits (a 2 GiB FUSE write spent ~40% of the loop here)
                self._not_before[ino] = time.monotonic() + BUSY_RECHECK
        except TierUnavailable as e:
            if not self.cold_down:
                log.warning("persisting inode %d failed: cold store unavailable: %s "
                            "(dirty data stays local; retrying)", ino, e)
            self.cold_down = True
            self._backoff(ino)
        except (TierError, OSError) as e:  # KeyConflict until a pending delete ran, ...
            log.warning("persisting inode %d failed, will retry: %s", ino, e)
            self._backoff(ino)
        except Exception:
            log.exception("persisting inode %d failed", ino)
            self._backoff(ino)
        finally:
            self._active.pop(ino, None)
            self._signal()
            self.wake()

    def _backoff(self, ino: int) -> None:
        n = self._failures.get(ino, 0) + 1
        self._failures[ino] = n
        self._not_before[ino] = time.monotonic() + min(
            self.settings.retry_delay * 2 ** (n - 1), 30.0)

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
        if targets and self.policy_for(targets[0]).mode == "cache-only":
            targets = []
        old = dict(rec.keys) if rec is not None else {}
        new: dict[str, str] = {}
        version = rec.version if rec is not None else 0
        size = rec.size if rec is not None else 0
        if inode is not None and targets:
            if self.busy(ino):  # unflushed writes: the commit re-queues it
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
        while True:
            with self.meta.snapshot() as tx:
                if tx.queued(ino) is None:
                    return
            ev = self._progress
            self.wake()
            await ev.wait()

    async def drain(self, prefix: str = "", timeout: float | None = None) -> bool:
        """Wait until no queued inode has a key under ``prefix`` (``persist --wait``)."""
        async def quiet() -> None:
            while True:
                with self.meta.snapshot() as tx:
                    busy = [ino for ino in tx.list_queue()
                            if not prefix or any(k.startswith(prefix) for k in
                                                 file_keys(tx, ino) or [""])]
                if not busy:
                    return
                ev = self._progress
                self.wake()
                with_timeout = asyncio.wait_for(ev.wait(), 1.0)
                with contextlib.suppress(TimeoutError):
                    await with_timeout
        try:
            await asyncio.wait_for(quiet(), timeout)
            return True
        except TimeoutError:
            return False
