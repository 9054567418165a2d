"""The placement engine: which blocks of which file live on the hot tier, and getting the
missing ones from cold.

State lives in metadata (``Inode.blocks["hot"]``, the ``Q``/``R``/``S``/``Y`` keys); the
engine keeps only what can be rebuilt at start in memory: bytes resident per inode, dirty
bytes, the replacement policy's lists, in-flight fetches.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tierd.errors import FsError
from tierd.meta import STATE_CLEAN, ColdRecord, Inode, MetaStore, MetaTxn, PlacementPolicy
from tierd.placement import bitmap
from tierd.placement.cache import TwoQ
from tierd.placement.importer import Importer
from tierd.placement.paths import dir_path, file_keys
from tierd.tiers import (
    BLOCK_SIZE,
    LocalTier,
    ObjectChanged,
    ObjectNotFound,
    ObjectTier,
    TierError,
    TierUnavailable,
)

log = logging.getLogger("tierd.placement")
HOT = "hot"
MODES = ("write-back", "write-through", "cache-only")


@dataclass
class PlacementSettings:
    dirty_limit: int = 1 << 30  # committed bytes not yet in cold before writers wait
    import_ttl: float = 5.0  # seconds a directory listing of cold stays fresh
    persist_parallel: int = 4  # inodes uploaded at once
    hot_high: float = 0.90  # evict when the hot tier is fuller than this...
    hot_low: float = 0.80  # ...down to this
    readahead_max: int = 64 << 20  # largest readahead window of a sequential stream
    retry_delay: float = 1.0  # first back-off after a failed upload (doubles up to 30 s)
    umask: int = 0o022


class PlacementCore:
    """Reads, accounting, eviction and policies; :class:`Placement` adds the persister."""

    def __init__(self, meta: MetaStore, cold: ObjectTier, hot: LocalTier,
                 settings: PlacementSettings | None = None) -> None:
        self.meta, self.cold, self.hot = meta, cold, hot
        self.settings = settings or PlacementSettings()
        self.hints: set[int] = set()
        self.importer = Importer(meta, cold, self.settings.import_ttl, self.settings.umask)
        self.capacity = hot.capacity()
        self.cache = TwoQ(max(1, self.capacity // BLOCK_SIZE))
        self._blocks_of: dict[int, set[int]] = {}  # ino -> blocks known to the cache
        self.resident: dict[int, int] = {}  # ino -> bytes on the hot tier
        self.used = 0
        self.dirty: dict[int, int] = {}  # ino -> bytes waiting for cold
        self.dirty_bytes = 0
        self._inflight: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._holds: Counter[int] = Counter()
        self._streams: dict[int, tuple[int, int]] = {}  # ino -> (next offset, window)
        self._refreshing: dict[int, asyncio.Task[int]] = {}
        self.policies: dict[str, PlacementPolicy] = {}
        self.busy: Callable[[int], bool] = lambda ino: False  # set by the namespace
        self._progress = asyncio.Event()
        self.stats = Counter[str]()
        self._prefix_imports = PrefixImports(self.settings.import_ttl)
        # inodes known whole on hot: reads skip the metadata lookup (hot re-reads are the
        # common case); cleared for an inode whenever one of its blocks is evicted
        self._whole: set[int] = set()
        self._evicting: dict[int, asyncio.Future[None]] = {}  # ino -> punch in progress

    # -- start-up ----------------------------------------------------------------------
    def load_state(self) -> None:
        """Rebuild the in-memory accounting from metadata (one scan at start)."""
        with self.meta.snapshot() as tx:
            queued = set(tx.list_queue())
            for inode in tx.iter_inodes():
                if not inode.is_reg:
                    continue
                blocks = bitmap.present(inode.blocks.get(HOT), inode.size)
                self._set_resident(inode.ino, sum(bitmap.block_bytes(inode.size, b)
                                                  for b in blocks))
                for b in blocks:
                    self._cache_add(inode.ino, b)
                if inode.ino in queued and inode.state != STATE_CLEAN:
                    self._set_dirty(inode.ino, inode.size)
            self.policies = {p.prefix: p for p in tx.list_policies()}

    # -- accounting --------------------------------------------------------------------
    def _set_resident(self, ino: int, n: int) -> None:
        self.used += n - self.resident.get(ino, 0)
        if n:
            self.resident[ino] = n
        else:
            self.resident.pop(ino, None)

    def _set_dirty(self, ino: int, n: int) -> None:
        self.dirty_bytes += n - self.dirty.get(ino, 0)
        if n:
            self.dirty[ino] = n
        else:
            self.dirty.pop(ino, None)
        if self.dirty_bytes <= self.settings.dirty_limit:
            self._signal()

    def _signal(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    def _cache_add(self, ino: int, b: int) -> None:
        self.cache.add((ino, b))
        self._blocks_of.setdefault(ino, set()).add(b)

    def forget(self, ino: int) -> None:
        """The namespace removed the inode's local data."""
        self.hot.release_fd(ino)
        for b in self._blocks_of.pop(ino, ()):
            self.cache.forget((ino, b))
        self._set_resident(ino, 0)
        self._streams.pop(ino, None)
        self._whole.discard(ino)

    def policy_for(self, key: str) -> PlacementPolicy:
        best: PlacementPolicy | None = None
        for prefix, p in self.policies.items():
            if key.startswith(prefix) and (best is None or len(prefix) > len(best.prefix)):
                best = p
        return best or PlacementPolicy("")

    # -- write side: called inside the namespace's transactions ------------------------
    def enqueue(self, tx: MetaTxn, inode: Inode, content: bool) -> None:
        """The file's content (``content``) or names changed: queue it for the persister.
        New content was written locally, so the whole file is present on hot."""
        if not inode.is_reg:
            return
        tx.enqueue(inode.ino, time.time_ns().to_bytes(8, "big") + os.urandom(4))
        self.hints.add(inode.ino)  # the persister rescans the whole queue only now and then
        if content:
            inode.blocks.pop(HOT, None)
            tx.put_inode(inode)
            self._set_resident(inode.ino, inode.size)
            for b in range(bitmap.nblocks(inode.size)):
                self._cache_add(inode.ino, b)
            self._set_dirty(inode.ino, inode.size)
        self.wake()

    def wake(self) -> None:  # the persister overrides this
        pass

    def names_changed(self, tx: MetaTxn, inode: Inode) -> None:
        """A file or directory was renamed/linked/unlinked: files below follow in cold."""
        if inode.is_reg:
            self.enqueue(tx, inode, content=False)
            return
        if not inode.is_dir:
            return
        stack = [inode.ino]
        while stack:
            d = stack.pop()
            for _, _, ent in tx.list_dirents(d):
                child = tx.get_inode(ent.ino)
                if child is None:
                    continue
                if child.is_dir:
                    stack.append(child.ino)
                elif child.is_reg:
                    self.enqueue(tx, child, content=False)

    def deleted(self, tx: MetaTxn, ino: int) -> None:
        """An inode lost its last name: its cold objects go (if it has any)."""
        if tx.get_cold(ino) is not None or tx.queued(ino) is not None:
            tx.enqueue(ino, time.time_ns().to_bytes(8, "big") + os.urandom(4))
            self.hints.add(ino)
            self.wake()

    async def admit(self, nbytes: int) -> None:
        """Backpressure for the FUSE path: wait while dirty bytes exceed the bound."""
        while self.dirty_bytes > self.settings.dirty_limit:
            self.stats["write_waits"] += 1
            await self._progress.wait()

    def over_dirty_limit(self) -> bool:
        return self.dirty_bytes > self.settings.dirty_limit

    # -- read side ---------------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self, ino: int) -> Iterator[None]:
        """Keep the inode's blocks from eviction while a reader uses its descriptor."""
        self.acquire(ino)
        try:
            yield
        finally:
            self.release(ino)

    def acquire(self, ino: int) -> None:
        self._holds[ino] += 1

    def release(self, ino: int) -> None:
        self._holds[ino] -= 1
        if self._holds[ino] <= 0:
            del self._holds[ino]

    async def ensure(self, ino: int, offset: int, length: int, *, touch: bool = True) -> None:
        """Make ``[offset, offset+length)`` of the file present on hot, fetching missing
        blocks from cold (shared with concurrent readers), and read ahead of sequential
        streams.  Raises FsError EIO (reason ServiceUnavailable) when cold cannot serve."""
        if ino in self._whole:
            if touch:
                self._touch_whole(ino, offset, length)
            return
        with self.meta.snapshot() as tx:
            inode = tx.get_inode(ino)
            if inode is None or not inode.is_reg:
                return
            bm = inode.blocks.get(HOT)
            rec = tx.get_cold(ino) if bm is not None else None
        end = min(inode.size, offset + length)
        if end <= offset:
            return
        first, last = offset // BLOCK_SIZE, (end - 1) // BLOCK_SIZE
        if touch:
            # one reference per block per sequential stream: a stream's later reads of a
            # block it already entered are not new references (they would promote scans)
            seq = self._streams.get(ino, (-1, 0))[0] == offset
            for b in range(first, last + 1):
                if (not seq or b * BLOCK_SIZE >= offset) and (ino, b) in self.cache:
                    self.cache.access((ino, b))
        if bm is None:
            if touch:
                self._streams[ino] = (end, 0)
            self._whole.add(ino)
            self.stats["hits"] += 1
            return
        missing = [b for b in range(first, last + 1) if not bitmap.has(bm, b)]
        self._readahead(ino, offset, end, inode, bm, rec)
        if not missing:
            self.stats["hits"] += 1
            return
        self.stats["misses"] += 1
        await asyncio.gather(*(self._fetch(ino, b, inode.version, rec) for b in missing))

    def _touch_whole(self, ino: int, offset: int, length: int) -> None:
        seq = self._streams.get(ino, (-1, 0))[0] == offset
        end = offset + max(length, 1)
        for b in range(offset // BLOCK_SIZE, (end - 1) // BLOCK_SIZE + 1):
            if (not seq or b * BLOCK_SIZE >= offset) and (ino, b) in self.cache:
                self.cache.access((ino, b))
        self._streams[ino] = (end, 0)

    def _readahead(self, ino: int, offset: int, end: int, inode: Inode, bm: bytes,
                   rec: ColdRecord | None) -> None:
        """Sequential readers get the next window fetched in the background; the window
        doubles with every sequential read (from one block up to ``readahead_max``)."""
        nxt, window = self._streams.get(ino, (-1, 0))
        if offset != nxt and offset != 0:
            self._streams[ino] = (end, 0)
            return
        window = min(max(window * 2, BLOCK_SIZE), self.settings.readahead_max)
        self._streams[ino] = (end, window)
        first = (end + BLOCK_SIZE - 1) // BLOCK_SIZE
        last = min(bitmap.nblocks(inode.size), (end + window) // BLOCK_SIZE + 1)
        for b in range(first, last):
            if not bitmap.has(bm, b) and (ino, b) not in self._inflight:
                task = self._start_fetch(ino, b, inode.version, rec)
                task.add_done_callback(_quiet)

    def _start_fetch(self, ino: int, b: int, version: int,
                     rec: ColdRecord | None) -> asyncio.Task[None]:
        task = self._inflight.get((ino, b))
        if task is None:
            task = asyncio.create_task(self._do_fetch(ino, b, version, rec))
            self._inflight[(ino, b)] = task
            task.add_done_callback(lambda _t: self._inflight.pop((ino, b), None))
        return task

    async def _fetch(self, ino: int, b: int, version: int, rec: ColdRecord | None) -> None:
        await asyncio.shield(self._start_fetch(ino, b, version, rec))

    async def quiesce(self, ino: int) -> None:
        """Wait for in-flight fetches of ``ino`` (before its content is replaced)."""
        tasks = [t for (i, _), t in list(self._inflight.items()) if i == ino]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _do_fetch(self, ino: int, b: int, version: int, rec: ColdRecord | None) -> None:
        if rec is None or not rec.keys:
            raise FsError(errno.EIO, f"inode {ino}: block {b} is not on the hot tier and "
                          "the cold store has no copy", reason="ServiceUnavailable")
        key, etag = next(iter(rec.keys.items()))
        while (punching := self._evicting.get(ino)) is not None:
            await asyncio.shield(punching)
        if b * BLOCK_SIZE < rec.size:
            await self.make_room(BLOCK_SIZE)
            for attempt in (0, 1):
                try:
                    async with self.hot.fd(ino, create=True) as fd:
                        await self.cold.read_into(key, b * BLOCK_SIZE, BLOCK_SIZE, fd,
                                                  b * BLOCK_SIZE, if_match=etag)
                    break
                except OSError as e:
                    if e.errno == errno.ENOSPC and attempt == 0 and await self.evict(
                            2 * BLOCK_SIZE):
                        continue
                    raise FsError(e.errno or errno.EIO, f"hot tier: {e}") from e
                except TierUnavailable as e:
                    log.warning("read of %s failed: cold store unavailable: %s", key, e)
                    raise FsError(errno.EIO, f"cold store unavailable: {e}",
                                  reason="ServiceUnavailable") from e
                except (ObjectChanged, ObjectNotFound) as e:
                    log.warning("read of %s failed: the cold object changed or vanished "
                                "outside tierd: %s", key, e)
                    raise FsError(errno.EIO, f"cold object {key} changed: {e}") from e
                except TierError as e:
                    log.warning("read of %s failed: %s", key, e)
                    raise FsError(errno.EIO, str(e)) from e
            self.stats["fetched_bytes"] += bitmap.block_bytes(rec.size, b)
        with self.meta.write() as tx:
            inode = tx.get_inode(ino)
            if inode is None or inode.version != version:
                return
            bm = inode.blocks.get(HOT)
            if bm is None or bitmap.has(bm, b):
                return
            inode.blocks[HOT] = bitmap.with_bits(bm, [b], True)
            tx.put_inode(inode)
        self._set_resident(ino, self.resident.get(ino, 0) + bitmap.block_bytes(inode.size, b))
        self._cache_add(ino, b)

    # -- eviction ----------------------------------------------------------------------
    async def make_room(self, nbytes: int) -> None:
        high = self.capacity * self.settings.hot_high
        if self.used + nbytes > high:
            await self.evict(int(self.used + nbytes - self.capacity * self.settings.hot_low))

    def _pinned(self, tx: MetaTxn, ino: int) -> bool:
        if not any(p.pin for p in self.policies.values()):
            return False
        return any(self.policy_for(k).pin for k in file_keys(tx, ino))

    async def evict(self, nbytes: int, only: Callable[[int], bool] | None = None) -> int:
        """Drop clean, unpinned, unused blocks in policy order until ``nbytes`` are freed;
        returns the bytes freed.  Only blocks cold holds at the current version leave."""
        freed = 0
        plan: dict[int, list[int]] = {}
        verdict: dict[int, bool] = {}
        with self.meta.snapshot() as tx:
            for ino, b in self.cache.victims():
                if freed >= nbytes:
                    break
                if only is not None and not only(ino):
                    continue
                ok = verdict.get(ino)
                if ok is None:
                    ok = self._evictable(tx, ino)
                    verdict[ino] = ok
                if ok:
                    plan.setdefault(ino, []).append(b)
                    freed += BLOCK_SIZE
        done = 0
        for ino, blocks in plan.items():
            done += await self._evict_blocks(ino, blocks)
        return done

    def _evictable(self, tx: MetaTxn, ino: int) -> bool:
        if self._holds.get(ino) or self.busy(ino):
            return False
        inode = tx.get_inode(ino)
        rec = tx.get_cold(ino)
        if inode is None or rec is None or inode.state != STATE_CLEAN:
            return False
        return rec.version == inode.version and not self._pinned(tx, ino)

    async def _evict_blocks(self, ino: int, blocks: list[int]) -> int:
        """Clear the bits first (one txn, right after the evictability check, no await in
        between: a reader either holds the inode or will see the blocks missing), then
        punch; a fetch of the inode waits for the punch so it cannot be erased by it."""
        with self.meta.write() as tx:
            if not self._evictable(tx, ino):
                return 0
            inode = tx.get_inode(ino)
            assert inode is not None
            bm = inode.blocks.get(HOT)
            bm = bitmap.full(inode.size) if bm is None else bm
            inode.blocks[HOT] = bitmap.with_bits(bm, blocks, False)
            tx.put_inode(inode)
        self._whole.discard(ino)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._evicting[ino] = done
        try:
            await self.hot.evict_blocks(ino, blocks)
        finally:
            done.set_result(None)
            if self._evicting.get(ino) is done:
                del self._evicting[ino]
        n = sum(bitmap.block_bytes(inode.size, b) for b in blocks)
        self._set_resident(ino, max(0, self.resident.get(ino, 0) - n))
        for b in blocks:
            self.cache.remove((ino, b))
            self._blocks_of.get(ino, set()).discard(b)
        self.stats["evicted_bytes"] += n
        return n

    # -- import ------------------------------------------------------------------------
    async def refresh_key(self, bucket: str, key: str, recursive: bool = False) -> None:
        """Before an S3 listing or a key lookup: import the directories along ``key``
        (each one level, TTL-limited), or with ``recursive`` everything under it."""
        try:
            if recursive:
                if self._prefix_imports.due(bucket + "/" + key):
                    await self.importer.import_prefix(bucket + "/" + key)
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
                with self.meta.snapshot() as tx:
                    ent = tx.lookup(ino, seg.encode("utf-8", "surrogateescape"))
                    child = tx.get_inode(ent.ino) if ent is not None else None
                if child is None or not child.is_dir:
                    return
                ino = child.ino
        except TierError as e:
            log.warning("listing cold for import failed: %s", e)

    async def refresh(self, dir_ino: int, force: bool = False) -> None:
        """Import what cold has under a directory if the last look is older than the TTL
        (single-flight per directory).  Cold being down is logged, not raised: the local
        view is still a valid answer."""
        if not force and not self.importer.stale(dir_ino):
            return
        task = self._refreshing.get(dir_ino)
        if task is None:
            with self.meta.snapshot() as tx:
                path = dir_path(tx, dir_ino)
            if path is None:
                return
            task = asyncio.create_task(self.importer.refresh_dir(dir_ino, path))
            self._refreshing[dir_ino] = task
            task.add_done_callback(lambda _t: self._refreshing.pop(dir_ino, None))
        try:
            await asyncio.shield(task)
        except TierError as e:
            log.warning("listing cold for import failed: %s", e)


def _quiet(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("readahead failed: %s", task.exception())


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
