"""The placement engine's core: settings, the state rebuilt at start, accounting, the
write-side hooks the namespace calls inside its transactions; import is in
``importing.py``.

State lives in metadata (``Inode.blocks["hot"]``/``["warm"]``, the ``Q``/``R``/``S``/``Y``
keys); the engine keeps only what can be rebuilt at start in memory: bytes resident per inode
and tier, dirty bytes, the replacement policy's lists, in-flight fetches.  Eviction and
demotion are in ``evict.py``, the read path (fetch, promotion, readahead) in ``reads.py``,
the persister in ``placement.py``; :class:`~tierd.placement.placement.Placement` is all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tierd.mempool.pool import MemPool
from tierd.meta import STATE_CLEAN, ColdRecord, Inode, MetaStore, MetaTxn, PlacementPolicy
from tierd.placement import bitmap, homes, intents, peerreads
from tierd.placement.importer import Importer
from tierd.placement.importing import Importing, PrefixImports
from tierd.placement.intents import RecentDeletes
from tierd.placement.memtier import MEM, MemTier
from tierd.placement.paths import file_keys, file_policy, queue_token
from tierd.placement.peerreads import PeerReader
from tierd.placement.stats import PlacementStats
from tierd.placement.tiercache import TierCache
from tierd.tiers import BLOCK_SIZE, LocalTier, ObjectTier

log = logging.getLogger("tierd.placement")
FIRST_WINDOW = 2 * BLOCK_SIZE  # a sequential stream's first readahead window
HOT = "hot"
WARM = "warm"
TIERS = (HOT, WARM)
#: what a policy's ``tier`` may name: where a prefix's data lives locally
POLICY_TIERS = (HOT, WARM, MEM)
MODES = ("write-back", "write-through", "cache-only")


@dataclass(slots=True)
class Stream:
    """A reader's position and readahead state (one per inode: the last reader wins)."""

    next: int = -1  # where the next sequential read starts
    window: int = 0
    ra_end: int = 0  # end of what readahead has requested


@dataclass
class PlacementSettings:
    dirty_limit: int = 1 << 30  # committed bytes not yet in cold before writers wait
    import_ttl: float = 5.0  # seconds a directory listing of cold stays fresh
    persist_parallel: int = 4  # inodes uploaded at once
    hot_high: float = 0.90  # evict when the hot tier is fuller than this...
    hot_low: float = 0.80  # ...down to this
    warm_high: float = 0.90  # the same for the warm tier (when there is one)
    warm_low: float = 0.80
    readahead_max: int = 64 << 20  # largest readahead window of a sequential stream
    retry_delay: float = 1.0  # first back-off after a failed upload (doubles up to 30 s)
    probe_interval: float = 10.0  # an idle cold store is asked whether it answers this often
    persist_delay: float = 0.0  # seconds a queued file waits before upload (daemon: config)


class PlacementCore(Importing):
    """Accounting, policies, write-side hooks and import; subclasses add eviction, reads
    and the persister."""

    cold_down = False  # the persister's view: the cold store does not answer

    def __init__(self, meta: MetaStore, cold: ObjectTier, hot: LocalTier,
                 settings: PlacementSettings | None = None,
                 warm: LocalTier | None = None) -> None:
        self.meta, self.cold, self.hot, self.warm = meta, cold, hot, warm
        self.settings = s = settings or PlacementSettings()
        self.hints: set[int] = set()
        # ino -> when it was first queued (wall ns, its queue token's first 8 bytes): kept
        # from the enqueue that wrote the token (and read from the queue for files queued
        # elsewhere), so a burst of creates costs the persister no read per file
        self._queued_at: dict[int, int] = {}
        self.changed_lately = 0.0  # monotonic time of the last queueing or removal: the
        # persister's write-back waits a little longer while a burst goes on (placement.py)
        # keys this node deleted while listings ran (import must not bring them back)
        self.recent = RecentDeletes()
        self.importer = Importer(meta, cold, s.import_ttl,
                                 busy=lambda ino: self.busy(ino), local=self.whole_locally,
                                 recent=self.recent)
        # cold key -> the inode whose upload or copy to it is in flight (until its record
        # is written): a name change meanwhile must leave a pending delete for that key
        self.putting: dict[str, int] = {}
        self.deletes_hint = False  # pending deletes were added: the delete worker looks
        self.hotc = TierCache(hot, s.hot_high, s.hot_low)
        self.warmc = TierCache(warm, s.warm_high, s.warm_low) if warm is not None else None
        self.dirty: dict[int, int] = {}  # ino -> bytes waiting for cold
        self.dirty_bytes = 0
        self._holds: Counter[int] = Counter()
        self._filling: Counter[int] = Counter()  # inodes with a fill in progress
        self._refreshing: dict[int, asyncio.Task[int]] = {}
        self.policies: dict[str, PlacementPolicy] = {}
        self.busy: Callable[[int], bool] = lambda ino: False  # set by the namespace
        # busy, less a kernel writer that wrote nothing since its last sync (upload.py)
        self.unsettled: Callable[[int], bool] = lambda ino: self.busy(ino)
        self._progress = asyncio.Event()
        self.stats = PlacementStats()
        self._prefix_imports = PrefixImports(s.import_ttl)
        # inodes known whole on hot: reads skip the metadata lookup (hot re-reads are the
        # common case); cleared for an inode whenever one of its blocks is evicted
        self._whole: set[int] = set()
        # (tier, ino) -> the punch in progress; fills into that tier's file wait for it
        self._evicting: dict[tuple[str, int], asyncio.Future[None]] = {}
        # (tier, ino, block) -> the fill bringing that block onto that tier
        self._inflight: dict[tuple[str, int, int], asyncio.Task[None]] = {}
        self._streams: dict[int, Stream] = {}
        # warm-only blocks referenced once (the second reference promotes them to hot)
        self._warm_refs: OrderedDict[tuple[int, int], None] = OrderedDict()
        # the memory tier (pool regions), once the daemon attached its pool
        self.mem: MemTier | None = None
        # inodes whose memory-tier placement was decided since their last change (a read
        # of a file without a memory copy looks at its policy once, not on every read)
        self._mem_seen: set[int] = set()
        # prefixes whose files are about to take their final names (see publishing())
        self._publishing: Counter[str] = Counter()
        #: files a round left alone because a key of theirs is being published: tried
        #: again when a publish ends (not at every wake: that spun the persister)
        self.held_back: set[int] = set()
        # a node of a cluster: its name, and how it reads versions other nodes hold
        self.node = meta.node
        self.peer: PeerReader | None = None
        # whether a node of the cluster heart-beats (set by tierd.cluster), and the files
        # of dead ones nothing can persist (tierd.placement.homes)
        self.home_alive: Callable[[str], bool] | None = None
        self.stranded: dict[str, homes.Stranded] = {}

    # the hot tier's numbers under their pre-warm names (du, tests, the benchmark)
    @property
    def used(self) -> int:
        return self.hotc.used

    @property
    def capacity(self) -> int:
        return self.hotc.capacity

    def attach_pool(self, pool: MemPool, max_share: float = 0.5) -> MemTier:
        """Give placement the memory pool: ``tier = "mem"`` policies keep copies there."""
        self.mem = MemTier(pool, max_share)
        self._mem_seen.clear()
        return self.mem

    def detach_pool(self) -> None:
        if self.mem is not None:
            self.mem.close()
            self.mem = None

    def reload_policies(self) -> None:
        """Read the placement policies again (another node of a cluster changed them)."""
        with self.meta.snapshot() as tx:
            self.policies = {p.prefix: p for p in tx.list_policies()}
        self.policies_changed()

    def policies_changed(self) -> None:
        """Reads look at the files' (new) memory-tier placement again."""
        self._mem_seen.clear()

    @contextlib.contextmanager
    def publishing(self, prefix: str) -> Iterator[None]:
        """Files under ``prefix`` are written there only to be renamed to their final names
        (an atomic publish: a checkpoint's temporary step directory).  The persister
        leaves them alone until then, so cold gets each once, under its final key, rather
        than an upload and then a server-side copy of the same bytes."""
        self._publishing[prefix] += 1
        try:
            yield
        finally:
            self._publishing[prefix] -= 1
            if self._publishing[prefix] <= 0:
                del self._publishing[prefix]
            self.hints |= self.held_back
            self.held_back.clear()
            self.wake()

    def unpublished(self, keys: list[str]) -> bool:
        """Whether any of a file's keys is under a prefix being published."""
        return bool(self._publishing) and any(
            k.startswith(p) for k in keys for p in self._publishing)

    def mem_policies(self) -> bool:
        return self.mem is not None and any(p.tier == MEM for p in self.policies.values())

    def wants_mem(self, tx: MetaTxn, ino: int) -> bool:
        """Whether the file's policy (:func:`file_policy`) places it in the memory tier."""
        if not self.mem_policies():
            return False
        policy = file_policy(tx, ino, self.policy_for)
        return policy is not None and policy.tier == MEM

    def tiers(self) -> list[TierCache]:
        return [self.hotc] if self.warmc is None else [self.hotc, self.warmc]

    def whole_locally(self, inode: Inode) -> bool:
        """Whether every block of the file's current version is on a local tier (hot and
        warm together) or in its memory-tier copy: then cold losing its object loses
        nothing, and the file is uploaded again instead of dropped."""
        hot = inode.blocks.get(HOT)
        if hot is None or inode.size == 0:
            return True  # a missing hot bitmap: the whole file is on hot
        warm = inode.blocks.get(WARM, b"")
        if all(bitmap.has(hot, b) or bitmap.has(warm, b)
               for b in range(bitmap.nblocks(inode.size))):
            return True
        return self.mem is not None and self.mem.get(inode.ino, inode.version) is not None

    # -- a node of a cluster --------------------------------------------------------------
    def _mark_whole(self, ino: int) -> None:
        """Every block is on hot: later reads skip the metadata.  Not on a node of a
        cluster, where another node may write a new version at any time: there every read
        looks at the version it serves (close-to-open across nodes)."""
        if not self.node:
            self._whole.add(ino)

    def held_elsewhere(self, home: str, version: int, rec: ColdRecord | None) -> bool:
        return peerreads.held_elsewhere(self.node, home, version, rec)

    async def fetch_from_peer(self, ino: int, home: str, version: int, tier: LocalTier,
                              offset: int, length: int) -> None:
        await peerreads.copy_from_peer(self.peer, tier, ino, home, version, offset, length)
        self.stats.peer_read_bytes += length

    def mine(self, tx: MetaTxn, ino: int) -> bool:
        """Whether this node persists ``ino``: on a cluster only the home of its version
        does (the bytes are on its hot tier); a deleted inode's cold objects any node."""
        if not self.node:
            return True
        inode = tx.get_inode(ino)
        return inode is None or inode.home in ("", self.node)

    # -- start-up ----------------------------------------------------------------------
    def load_state(self, hot_files: set[int] | None = None,
                   warm_files: set[int] | None = None) -> None:
        """Rebuild the in-memory accounting from metadata (one scan at start).

        With the inventories of the local tiers (inode numbers that have a file there), the
        metadata's claims are checked first: a file that should hold blocks but is missing
        (the metadata restored from a backup onto a node with an empty hot tier, a wiped
        tier) is recorded as holding none, so reads fetch it from cold, if cold has this
        version; if it does not, the bytes are lost and that is logged once, loudly."""
        fixes: list[Inode] = []
        with self.meta.snapshot() as tx:
            queued = set(tx.list_queue())
            for inode in tx.iter_inodes():
                if not inode.is_reg:
                    continue
                if hot_files is not None and self._missing_files(tx, inode, hot_files,
                                                                 warm_files):
                    fixes.append(inode)  # accounted below as it is recorded now
                for tc in self.tiers():
                    bm = inode.blocks.get(tc.name)
                    if bm is None and tc is not self.hotc:
                        continue  # no warm bitmap: nothing on warm
                    blocks = bitmap.present(bm, inode.size)
                    tc.set_resident(inode.ino, sum(bitmap.block_bytes(inode.size, b)
                                                   for b in blocks))
                    for b in blocks:
                        tc.add(inode.ino, b)
                if (inode.ino in queued and inode.state != STATE_CLEAN
                        and inode.home in ("", self.node)):
                    self._set_dirty(inode.ino, inode.size)
            self.policies = {p.prefix: p for p in tx.list_policies()}
        if fixes:
            with self.meta.write() as tx:
                for inode in fixes:
                    cur = tx.get_inode(inode.ino)
                    if cur is not None:
                        cur.blocks = inode.blocks
                        tx.put_inode(cur)
            log.warning("%d files the metadata placed on a local tier have no file there: "
                        "they will be read from the cold store", len(fixes))

    def _missing_files(self, tx: MetaTxn, inode: Inode, hot_files: set[int],
                       warm_files: set[int] | None) -> bool:
        """Check one inode's tier claims against the tiers' inventories; when a claimed
        file is missing, correct ``inode.blocks`` (in memory) and return True.  A file
        missing from hot whose version cold lacks is lost: logged, left as it is."""
        if inode.size == 0:
            return False
        bm = inode.blocks.get(HOT)
        hot_missing = inode.ino not in hot_files and (bm is None or any(bm))
        warm_missing = (warm_files is not None and inode.ino not in warm_files
                        and any(inode.blocks.get(WARM, b"")))
        if not (hot_missing or warm_missing):
            return False
        if hot_missing:
            rec = tx.get_cold(inode.ino)
            if rec is None or rec.version != inode.version or not rec.keys:
                log.error("inode %d: its data file is missing from the hot tier and the cold "
                          "store has no copy of this version: its bytes are lost", inode.ino)
                return False
            inode.blocks[HOT] = b""  # none on hot: reads fetch from cold
        if warm_missing:
            inode.blocks.pop(WARM, None)
        return True

    # -- accounting --------------------------------------------------------------------
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

    def forget(self, ino: int) -> None:
        """The namespace removed the inode's local data: drop what placement knows of it
        (and its warm copy, which the namespace does not know about)."""
        self.hot.release_fd(ino)
        self.hotc.forget(ino)
        self._whole.discard(ino)
        self._streams.pop(ino, None)
        self._drop_warm_copy(ino)
        self._drop_mem_copy(ino)

    def _drop_mem_copy(self, ino: int) -> None:
        self._mem_seen.discard(ino)
        if self.mem is not None:
            self.mem.drop(ino)

    def _drop_warm_copy(self, ino: int) -> None:
        """The warm file holds an older content (or a deleted file): remove it now, on the
        loop (an unlink is microseconds), so a later demotion starts from a fresh file.  A
        demotion still copying into the old file writes into an unlinked inode and its
        metadata commit sees the version changed."""
        if self.warm is None or self.warmc is None:
            return
        self.warmc.forget(ino)
        self.warm.release_fd(ino)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.warm.path(ino))

    def policy_for(self, key: str) -> PlacementPolicy:
        best: PlacementPolicy | None = None
        for prefix, p in self.policies.items():
            if key.startswith(prefix) and (best is None or len(prefix) > len(best.prefix)):
                best = p
        return best or PlacementPolicy("")

    # -- write side: called inside the namespace's transactions ------------------------
    def enqueue(self, tx: MetaTxn, inode: Inode, content: bool) -> None:
        """The file's content (``content``) or names changed: queue it for the persister.
        New content was written locally, so the whole file is present on hot.  The caller
        stores ``inode`` itself (before or after); it is stored here again only when this
        changed it (a residency bitmap dropped): a create paid a second ``put_inode``."""
        if not inode.is_reg:
            return
        self._queue(tx, inode.ino)
        if not content:
            self._intend_deletes(tx, inode.ino)
            self.names_moved(inode.ino)
        if content:
            changed = inode.blocks.pop(HOT, None) is not None
            if inode.blocks.pop(WARM, None) is not None:
                changed = True
                # the warm copy is of the old content: removed once this txn committed
                tx.after_commit(functools.partial(self._after_soon, self._reap_warm,
                                                  inode.ino))
            if changed:
                tx.put_inode(inode)
            self._drop_mem_copy(inode.ino)
            if self.wants_mem(tx, inode.ino):
                # the new content goes to the pool once committed (and flushed)
                tx.after_commit(functools.partial(self._after_soon, self.admit_mem_later,
                                                  inode.ino))
            self.hotc.set_resident(inode.ino, inode.size)
            for b in range(bitmap.nblocks(inode.size)):
                self.hotc.add(inode.ino, b)
            self._set_dirty(inode.ino, inode.size)
        self.nudge()

    def _queue(self, tx: MetaTxn, ino: int) -> None:
        """Queue ``ino`` with a fresh token and hint the persister, keeping the token's
        stamp in :attr:`_queued_at`: the persister's delay check then needs no snapshot per
        queued file (it woke for every create and read each new file's token).  A stamp of
        a transaction that aborts is harmless: the persister finds no token when its delay
        is over, and forgets the stamp (``reconcile``: not queued, nothing to do)."""
        token = queue_token(tx.queued(ino))
        tx.enqueue(ino, token)
        self._queued_at[ino] = int.from_bytes(token[:8], "big")
        self.changed_lately = time.monotonic()
        self.hints.add(ino)  # the persister rescans the whole queue only now and then

    @staticmethod
    def _after_soon(fn: Callable[[int], None], ino: int) -> None:
        """From a commit: ``fn(ino)`` at the loop's next turn (not inside the committing
        code; without a running loop, not at all: the file stays, unused)."""
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().call_soon(fn, ino)

    def _reap_warm(self, ino: int) -> None:
        """After a content change: drop the warm file if the metadata no longer records
        warm blocks (the change committed; an aborted one left the bitmap, and the file)."""
        with self.meta.snapshot() as tx:
            inode = tx.get_inode(ino)
        if inode is None or WARM not in inode.blocks:
            self._drop_warm_copy(ino)

    def admit_mem_later(self, ino: int) -> None:  # the read path overrides this
        pass

    def wake(self) -> None:  # the persister overrides this
        pass

    def nudge(self) -> None:  # the persister overrides this: a wake it may put off
        self.wake()

    def _intend_deletes(self, tx: MetaTxn, ino: int, *, named: bool = True) -> None:
        """Inside the namespace's transaction that removed names of ``ino``: every cold key
        its objects may be under (its record's, and one an upload is putting now) that no
        longer names it becomes a durable pending delete, committed with the change.
        ``named=False``: it has no name left (:func:`file_keys`)."""
        rec = tx.get_cold(ino)
        claimed = set(rec.keys) if rec is not None else set()
        claimed.update(k for k, owner in self.putting.items() if owner == ino)
        if not claimed:
            return
        for k in claimed - set(file_keys(tx, ino, named=named)):
            intents.intend(tx, k, ino)
            self.deletes_hint = True

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

    def names_moved(self, ino: int) -> None:  # the persister overrides this
        pass

    def gone(self, ino: int) -> None:  # upload.py overrides this
        pass

    def deleted(self, tx: MetaTxn, ino: int, held: bool = False) -> None:
        """An inode lost its last name: its cold objects go (pending deletes, committed
        with the change), an upload of it in flight is cancelled, its record is dropped by
        the persister -- or here, on a single node, when nothing of it is on its way to
        cold and no handle ``held`` it (an open file's reads keep the persister's rules).
        A removal counts as activity for the persister's burst hold as a queueing does:
        uploads of files a burst of unlinks is about to remove are wasted work."""
        self.changed_lately = time.monotonic()
        self._intend_deletes(tx, ino, named=False)  # (every caller removed its names first)
        self.gone(ino)
        rec = tx.get_cold(ino)
        if rec is not None:
            if (not held and self.never_sent(ino)
                    and all(intents.pending(tx, k) for k in rec.keys)):
                # every object of it is a pending delete now (just above): its record
                # goes with the change, as its reconcile would have dropped it -- a
                # reconcile and a record transaction per unlinked persisted file were 29%
                # of the loop while a process unlinked them (bench/unlink_deletes.py)
                tx.delete_cold(ino)
                if tx.queued(ino) is not None:
                    tx.dequeue(ino)
                tx.after_commit(functools.partial(self._dropped_unsent, ino))
                return
            self._queue(tx, ino)  # its record (and objects) go
        elif tx.queued(ino) is not None:
            if self.never_sent(ino):
                # no record, no put of it in flight: cold holds nothing of it that the
                # persister would look at (a put-intention left by a crash is a pending
                # delete of its own), so its reconcile would only dequeue it
                tx.dequeue(ino)
                tx.after_commit(functools.partial(self._dropped_unsent, ino))
                return
            self._queue(tx, ino)
        self.wake()

    def never_sent(self, ino: int) -> bool:
        """Whether nothing of queued file ``ino`` can be on its way to cold from here (the
        persister answers; without one, False: the reconcile decides)."""
        return False

    def _dropped_unsent(self, ino: int) -> None:
        """After the commit that deleted a file and dequeued it, with nothing of it on its
        way to cold (never sent, or its objects left as pending deletes)."""
        self._set_dirty(ino, 0)

    async def admit(self, nbytes: int) -> None:
        """Backpressure for the FUSE path: wait while dirty bytes exceed the bound."""
        while self.dirty_bytes > self.settings.dirty_limit:
            self.stats.write_waits += 1
            await self._progress.wait()

    def over_dirty_limit(self) -> bool:
        return self.dirty_bytes > self.settings.dirty_limit

    def queue_summary(self, limit: int = 2000) -> dict[str, Any]:
        """The persist queue at a glance (``/v1/status``): its depth and the age of its
        oldest entry (a token starts with the file's first-queued time, ``queue_token``).
        It runs on the loop, so only the first ``limit`` tokens are read: beyond that the
        age is of those and ``truncated`` says so (``/metrics`` reads all, in a thread)."""
        oldest, now = 0, time.time_ns()
        with self.meta.snapshot() as tx:
            queue = tx.list_queue()
            for ino in queue[:limit]:
                token = tx.queued(ino) or b""
                if len(token) >= 8:
                    stamp = int.from_bytes(token[:8], "big")
                    oldest = stamp if not oldest else min(oldest, stamp)
        return {"depth": len(queue), "truncated": len(queue) > limit,
                "oldest_age_seconds": round(max(0, now - oldest) / 1e9, 3) if oldest else 0.0}

    # -- readers' holds ----------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self, ino: int) -> Iterator[None]:
        """Keep the inode's blocks (on every tier) from eviction while a reader uses its
        descriptor."""
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
