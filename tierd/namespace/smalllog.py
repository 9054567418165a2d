"""The small-write log: small PUTs durable through the metadata commit, not their own fsyncs.

A PUT is acknowledged only once its bytes survive a crash.  For a small object the cost of
that was almost all kernel work: a data file created, written, ``fdatasync``-ed and its
directory ``fsync``-ed -- two journal commits per object, besides the metadata commit the
PUT needs anyway (docs/s3.md has the measurements).  So, as ZFS's intent log and the
write-ahead logs of databases do, a small body (one that
:func:`~tierd.namespace.staging.stage_body` takes whole: at most 64 KiB) is also written
into the metadata transaction that publishes the object (a ``W`` record: inode, content
version, bytes), and its data file is written to the page cache only.  The group commit
that makes the metadata durable makes the bytes durable with it, for many PUTs at once.

The log is trimmed in the background: every :data:`TRIM_DELAY` seconds (at once past half
of :data:`LOG_BUDGET`) one ``syncfs`` of the hot tier makes every logged data file durable
-- contents and names -- and one transaction removes their records.  Past the budget (a
trim that cannot keep up, or fails), small PUTs make their own files durable as before.

At start, :meth:`SmallLog.replay` writes every record whose inode still has the logged
version back into its data file (fsynced) and removes the records: after a crash that lost
the page cache, the data files hold exactly what was acknowledged.  A record whose inode is
gone or has newer content (a later write changed the version, and made itself durable) is
only removed.
"""

from __future__ import annotations

import asyncio
import logging
import os

from tierd.meta import MetaStore
from tierd.tiers.fileio import pwrite_all
from tierd.tiers.hotdir import HotDir

log = logging.getLogger("tierd.namespace")

LOG_BUDGET = 64 << 20  # logged bytes not yet trimmed; past it small PUTs sync their own file
TRIM_DELAY = 0.5  # seconds between a first logged PUT and the trim that covers it
RETRY_DELAY = 2.0  # after a failed syncfs


class SmallLog:
    """Which small data files are only in the page cache, and their trimming."""

    def __init__(self, meta: MetaStore, hot: HotDir) -> None:
        self.meta = meta
        self.hot = hot
        self._pending: dict[int, int] = {}  # ino -> bytes logged, not yet covered by a trim
        self.bytes = 0  # logged bytes whose records still exist (pending or being trimmed)
        self.trims = 0
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def admits(self, nbytes: int) -> bool:
        """Whether a small body of ``nbytes`` may be logged instead of synced."""
        return not self._closed and self.bytes + nbytes <= LOG_BUDGET

    def logged(self, ino: int, nbytes: int) -> None:
        """The transaction holding ``ino``'s record committed: trim it in a while."""
        self._pending[ino] = self._pending.get(ino, 0) + nbytes
        self.bytes += nbytes
        self._schedule(0.0 if self.bytes > LOG_BUDGET // 2 else TRIM_DELAY)

    def _schedule(self, delay: float) -> None:
        if self._task is not None or self._closed:
            return  # the running trim reschedules when it ends
        if self._timer is not None:
            if delay > 0:
                return
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._start)

    def _start(self) -> None:
        self._timer = None
        self._task = asyncio.create_task(self._trim_loop_once(), name="tierd-small-log-trim")

    async def _trim_loop_once(self) -> None:
        ok = False
        try:
            ok = await self.trim()
        except Exception:  # e.g. the store closed under an abandoned namespace
            log.exception("trimming the small-write log failed (its records stay)")
        finally:
            self._task = None
            if self._pending:
                self._schedule(TRIM_DELAY if ok else RETRY_DELAY)

    async def trim(self) -> bool:
        """Make the data files logged so far durable and drop their records; False when
        the sync failed (the records stay: they are still the durable copy)."""
        batch, self._pending = self._pending, {}
        if not batch:
            return True
        try:
            await asyncio.to_thread(self.hot.sync_all)
        except OSError as e:
            log.warning("syncing the hot tier failed (%s): %d small files stay in the "
                        "metadata log, retrying in %.0f s", e, len(batch), RETRY_DELAY)
            for ino, n in batch.items():
                self._pending[ino] = self._pending.get(ino, 0) + n
            return False
        async with self.meta.awrite() as tx:
            for ino in batch:
                tx.delete_logged(ino)
        self.bytes -= sum(batch.values())
        self.trims += 1
        return True

    async def close(self) -> None:
        """Trim what is logged (a clean stop leaves no record to replay)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        await self.trim()

    def replay(self) -> int:
        """At start, before any request: logged content back into data files that may
        have lost it; returns how many were rewritten (blocking; start-up only)."""
        rewritten = 0
        seen: list[int] = []
        with self.meta.snapshot() as tx:
            for ino, version, data in tx.list_logged():
                seen.append(ino)
                inode = tx.get_inode(ino)
                if inode is None or not inode.is_reg or inode.version != version:
                    continue
                fd = self.hot.open_new(ino)
                try:
                    pwrite_all(fd, data, 0)
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                self.hot.fsync_dir(ino)
                rewritten += 1
        if seen:
            with self.meta.write() as tx:
                for ino in seen:
                    tx.delete_logged(ino)
            log.info("small-write log: %d of %d logged files written back into the hot "
                     "tier after an unclean stop", rewritten, len(seen))
        return rewritten
