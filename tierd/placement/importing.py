"""Import on the placement engine: what cold holds under a directory or key prefix becomes
namespace entries before a listing or lookup answers (the importer, ``importer.py``, does
the work; this is when and how often), and the files a listing found lost from cold are
uploaded again or dropped.  A mixin of :class:`~tierd.placement.engine.PlacementCore`,
kept apart so the engine stays one screenful of accounting and hooks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from tierd.meta import MetaStore
from tierd.placement.importer import Importer
from tierd.placement.paths import dir_path
from tierd.placement.stats import PlacementStats
from tierd.placement.tiercache import TierCache
from tierd.tiers import LocalTier, TierError

log = logging.getLogger("tierd.placement")


class Importing:
    """``refresh_key``, ``refresh`` and the handling of files lost from cold."""

    # the engine's, set in PlacementCore.__init__
    meta: MetaStore
    hot: LocalTier
    hotc: TierCache
    importer: Importer
    stats: PlacementStats
    hints: set[int]
    cold_down: bool
    _prefix_imports: PrefixImports
    _refreshing: dict[int, asyncio.Task[int]]
    _whole: set[int]
    _streams: dict[int, Any]

    def wake(self) -> None:  # the persister's
        raise NotImplementedError

    def _set_dirty(self, ino: int, n: int) -> None:  # the engine's
        raise NotImplementedError

    def _drop_warm_copy(self, ino: int) -> None:  # the engine's
        raise NotImplementedError

    def _drop_mem_copy(self, ino: int) -> None:  # the engine's
        raise NotImplementedError

    async def refresh_key(self, bucket: str, key: str, recursive: bool = False) -> None:
        """Before an S3 listing or a key lookup: import the directories along ``key``
        (each one level, TTL-limited), or with ``recursive`` everything under it.  Not while
        the cold store is down: the local view is a valid answer, and a hung store must
        not hang listings."""
        if self.cold_down:
            return
        try:
            if recursive:
                if self._prefix_imports.due(bucket + "/" + key):
                    await self.importer.import_prefix(bucket + "/" + key)
                    await self.forget_dropped()
                return
            with self.meta.snapshot() as tx:
                b = tx.get_bucket(bucket)
            if b is None:
                return
            ino = b.ino
            segs = key.split("/")
            for i, seg in enumerate(segs):
                await self.refresh(ino)
                if i == len(segs) - 1 or not seg:
                    return
                async with self.meta.asnapshot() as tx:
                    ent = tx.lookup(ino, seg.encode("utf-8", "surrogateescape"))
                    child = tx.get_inode(ent.ino) if ent is not None else None
                if child is None or not child.is_dir:
                    return
                ino = child.ino
        except TierError as e:
            log.warning("listing cold for import failed: %s", e)

    async def refresh(self, dir_ino: int, force: bool = False) -> bool:
        """Import what cold has under a directory if the last look is older than the TTL
        (single-flight per directory).  Cold being down is logged, not raised: the local
        view is still a valid answer.  False when nothing was looked at (the directory's
        entries are as before: a caller need not read them again)."""
        if self.cold_down or (not force and not await self.importer.stale(dir_ino)):
            return False
        task = self._refreshing.get(dir_ino)
        if task is None:
            async with self.meta.asnapshot(warm=lambda tx: dir_path(tx, dir_ino)) as tx:
                path = dir_path(tx, dir_ino)
            if path is None:
                return False
            task = self._refreshing.get(dir_ino)  # (another caller's, begun meanwhile)
            if task is None:
                task = asyncio.create_task(self.importer.refresh_dir(dir_ino, path))
                self._refreshing[dir_ino] = task
                task.add_done_callback(lambda _t: self._refreshing.pop(dir_ino, None))
        try:
            await asyncio.shield(task)
        except TierError as e:
            log.warning("listing cold for import failed: %s", e)
        await self.forget_dropped()
        return True

    async def forget_dropped(self) -> None:
        """Files a listing found lost from cold: those re-uploaded from their complete local
        copy count as dirty again; those dropped (deleted outside tierd) lose their local
        blocks too.  Both are logged with the evidence."""
        while self.importer.reuploaded:
            ino, why = self.importer.reuploaded.pop()
            self.reupload_counted(ino, why)
        while self.importer.dropped:
            ino, why = self.importer.dropped.pop()
            log.warning("inode %d was deleted from the cold store outside tierd: dropped "
                        "from the namespace (%s)", ino, why)
            await self.free_vanished(ino)

    def reupload_counted(self, ino: int, why: str) -> None:
        """A file whose cold object is gone was queued again from its local copy."""
        with self.meta.snapshot() as tx:
            inode = tx.get_inode(ino)
        self.stats.reuploaded += 1
        if inode is not None:
            self._set_dirty(ino, inode.size)
        self.hints.add(ino)
        log.warning("inode %d: the cold store lost its object; uploading it again from the "
                    "complete local copy (%s)", ino, why)
        self.wake()

    async def free_vanished(self, ino: int) -> None:
        """A file dropped because its cold object vanished: free its local blocks now (the
        orphaned inode itself goes at its last release, or at the next start)."""
        self.stats.vanished += 1
        self.hotc.forget(ino)
        self._whole.discard(ino)
        self._streams.pop(ino, None)
        self._drop_warm_copy(ino)
        self._drop_mem_copy(ino)
        with contextlib.suppress(OSError):
            await self.hot.punch(ino, 0, 1 << 62)


class PrefixImports:
    """Time-limited memory of recursive imports (an S3 listing without delimiter), so a
    paging client does not re-list cold for every page."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._seen: dict[str, float] = {}

    def due(self, prefix: str) -> bool:
        now = time.monotonic()
        if now - self._seen.get(prefix, -1e18) < self.ttl:
            return False
        self._seen[prefix] = now
        if len(self._seen) > 4096:
            self._seen.clear()
        return True
