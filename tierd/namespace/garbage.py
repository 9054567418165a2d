"""The durable garbage list: data files of dropped inodes, reclaimed once the drop is durable.

With group commit a committed transaction reaches the disk a few milliseconds later, when
a durability point waits for it or the flusher's interval ends.  A data file removed in
that window is lost if the daemon dies: the metadata rolls back to the inode that names
it.  So the transaction that makes a data file unreachable (the last name of an inode
removed, an S3 PUT or DELETE over an object, an open-unlinked file released) also writes
a ``G<ino>`` key (:meth:`~tierd.meta.MetaTxn.add_garbage`), and :class:`Garbage` removes
the file only after a metadata flush that began after that commit returned, then deletes
the key.  A crash before the flush rolls back both the drop and the key (the file is still
there); a crash after it leaves the key, and :meth:`Garbage.recover` reclaims it at the
next start.  Inode numbers are never handed out twice (``Namespace._recover`` skips the
counter past numbers a crash may have lost), so a ``G`` key never names a live file.

The flush is waited for in the background, never on a client's path, a little after the
commit (:data:`SETTLE`), only for the commits that dropped files and without cutting the
group short (``MetaStore.flush(upto=..., urgent=False)``): the group commit or the client's
own durability point covers them, and reclaiming adds no disk flush of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from tierd.meta import MetaStore
from tierd.namespace.crashpoint import crashpoint
from tierd.tiers.hotdir import HotDir

log = logging.getLogger("tierd.namespace")

SETTLE = 0.01  # seconds before asking for the flush (group commit's interval is 5 ms)
RETRY_DELAY = 1.0  # after a failed flush or removal (a full disk: doubling, up to...)
MAX_RETRY_DELAY = 30.0


class Garbage:
    """Reclaims dropped inodes' data files once the dropping commit is durable."""

    def __init__(self, meta: MetaStore, hot: HotDir, forget: Callable[[int], None]) -> None:
        self.meta = meta
        self.hot = hot
        self._forget = forget  # placement's view of the inode (fds, caches, warm copy)
        self._pending: list[int] = []
        self._upto: int | None = None  # the last commit that dropped a pending file
        self._task: asyncio.Task[None] | None = None
        self._closing = False  # shutdown: a failure leaves the keys for the next start
        self._kick = asyncio.Event()  # ends a retry's wait (shutdown)
        self.reclaimed = 0

    def add(self, ino: int) -> None:
        """The transaction holding ``ino``'s ``G`` key has committed (call after it)."""
        crashpoint("gc.committed")
        self._pending.append(ino)
        self._upto = self.meta.last_commit()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="tierd-garbage")

    async def _run(self) -> None:
        delay = RETRY_DELAY
        try:
            while self._pending:
                await asyncio.sleep(SETTLE)
                batch, upto, self._pending = self._pending, self._upto, []
                try:
                    # covers every commit of the batch; background work: the group's
                    # own flush answers it (urgent, it would cut groups short: more syncs)
                    await self.meta.flush(upto, urgent=False)
                    crashpoint("gc.durable")
                    await self._reclaim(batch)
                    delay = RETRY_DELAY
                except Exception as e:  # the keys stay: retried here, or at the next start
                    if self._closing:
                        log.warning("reclaiming %d dropped data files failed at shutdown "
                                    "(%s: %s); the next start does it", len(batch),
                                    type(e).__name__, e)
                        return
                    log.warning("reclaiming %d dropped data files failed (%s: %s); "
                                "retrying in %.0f s", len(batch), type(e).__name__, e, delay)
                    self._pending = batch + self._pending
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._kick.wait(), delay)
                    delay = min(delay * 2, MAX_RETRY_DELAY)
        finally:
            self._task = None

    async def _reclaim(self, inos: list[int]) -> None:
        for ino in inos:
            self._forget(ino)
        await asyncio.to_thread(self._remove_files, inos)
        crashpoint("gc.removed")
        async with self.meta.awrite() as tx:
            for ino in inos:
                tx.remove_garbage(ino)
        self.reclaimed += len(inos)

    def _remove_files(self, inos: list[int]) -> None:
        """Blocking (a thread): freeing a large file's extents can take milliseconds."""
        for ino in inos:
            self.hot.remove(ino)

    async def drain(self, closing: bool = False) -> None:
        """Reclaim everything dropped so far (tests; shutdown with ``closing``: one try,
        what fails is left to the next start)."""
        if closing:
            self._closing = True
            self._kick.set()
        while self._task is not None:
            await asyncio.shield(self._task)

    def recover(self) -> int:
        """At start, before any request: reclaim every ``G`` key (each is durable: it was
        read from the store) and return how many (blocking; start-up only)."""
        with self.meta.snapshot() as tx:
            inos = tx.list_garbage()
            alive = [ino for ino in inos if tx.get_inode(ino) is not None]
        for ino in alive:  # never expected: a dropped inode is deleted in the same commit
            log.error("inode %d is on the garbage list but still exists: its data file "
                      "is kept", ino)
        for ino in inos:
            if ino not in alive:
                self._forget(ino)
                self.hot.remove(ino)
        if inos:
            with self.meta.write() as tx:
                for ino in inos:
                    tx.remove_garbage(ino)
        return len(inos) - len(alive)

    def remove_unnamed(self, below: int) -> int:
        """After an unclean stop: remove hot data files of inode numbers under ``below``
        that the metadata does not hold (numbers handed out to a PUT whose commit never
        became durable).  Only numbers under ``below`` (the counter before this start
        skipped it) are considered, so nothing created since can be taken.  Blocking: a
        thread, before the doors open."""
        unnamed: list[int] = []
        files = sorted(ino for ino in self.hot.inventory() if ino < below)
        for i in range(0, len(files), 1024):  # short read transactions
            with self.meta.snapshot() as tx:
                unnamed.extend(ino for ino in files[i:i + 1024] if tx.get_inode(ino) is None)
        for ino in unnamed:
            self.hot.remove(ino)
        return len(unnamed)
