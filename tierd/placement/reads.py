"""The read path: blocks a reader needs, from the nearest tier that has them.

* :meth:`Reading.ensure` makes a range present **on hot** (the S3 door sends from the hot
  file; the persister uploads from it; writes change it in place).  A block missing on hot is
  copied from warm when warm has it, else fetched from cold.
* :meth:`Reading.read` returns the bytes of a range (the FUSE door): a block that is only on
  warm is served from warm, and **promoted** to hot on its second reference -- when its key is
  still in the hot 2Q's ghost list (it left hot's FIFO recently) or it was referenced once
  on warm already.  Blocks neither local tier has come from cold into the file's target tier
  (its policy's ``tier``; hot by default).

Fills are single-flight per ``(tier, ino, block)`` (shielded: a cancelled reader does not
cancel a shared fill) and go in runs: one ``read_into`` per run of consecutive missing
blocks, split by the cold tier into parallel ranged GETs.  Sequential streams get readahead
like the kernel's: the window doubles from 2 blocks up to ``readahead_max`` and the next
window is requested as soon as the reader enters the last one, so one or two windows are
always in flight; a stream's windows are fetched in ranges of a quarter of the window (at
least the cold tier's ``range_size``), so a fast stream makes few, large requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from tierd.errors import FsError, Reason
from tierd.meta import ColdRecord, MetaTxn
from tierd.placement import bitmap
from tierd.placement.engine import FIRST_WINDOW, HOT, WARM, Stream
from tierd.placement.evict import Evicting
from tierd.placement.memtier import MEM
from tierd.placement.paths import file_policy
from tierd.placement.peerreads import VersionMoved
from tierd.placement.tiercache import TierCache
from tierd.tiers import (
    BLOCK_SIZE,
    ObjectChanged,
    ObjectNotFound,
    TierError,
    TierUnavailable,
    fileio,
)

log = logging.getLogger("tierd.placement")
#: reads of a file that another node of a cluster changes meanwhile: tries before ESTALE
_CHANGED_TRIES = 3


@dataclass(slots=True)
class View:
    """One snapshot of what placement needs of an inode to serve a read."""

    ino: int
    version: int
    size: int
    hot: bytes | None  # None: the whole file is on hot
    warm: bytes
    rec: ColdRecord | None
    tier: str  # where its blocks land from cold (policy ``tier``)
    unlinked: bool = False  # no names left (deleted, or dropped as vanished from cold)
    home: str = ""  # in a cluster: the node holding this version's bytes until persisted


class Reading(Evicting):
    """Adds :meth:`ensure`, :meth:`read`, :meth:`fill` and :meth:`quiesce`."""

    # -- entry points ------------------------------------------------------------------
    async def ensure(self, ino: int, offset: int, length: int, *, touch: bool = True) -> None:
        """:meth:`_ensure`; on a node of a cluster again when the file changed meanwhile."""
        for attempt in range(_CHANGED_TRIES):
            try:
                return await self._ensure(ino, offset, length, touch=touch)
            except FsError as e:
                if e.errno != errno.ESTALE or not self.node or attempt + 1 == _CHANGED_TRIES:
                    raise

    async def _ensure(self, ino: int, offset: int, length: int, *, touch: bool = True) -> None:
        """Make ``[offset, offset+length)`` present on hot, from warm or cold (shared with
        concurrent readers); ``touch`` counts it as a reference and reads ahead of a
        sequential stream.  FsError EIO (reason ServiceUnavailable) when cold cannot serve,
        ENOENT (NoSuchKey) when the object vanished from cold."""
        if ino in self._whole:
            if touch:
                self._step(ino, offset, offset + max(length, 1), None)
            return
        v = await self._aview(ino)
        end = 0 if v is None else min(v.size, offset + length)
        if v is None or end <= offset:
            return
        ra = self._step(ino, offset, end, v) if touch else None
        if v.hot is None:
            self._mark_whole(ino)
            self.stats.hits += 1
            return
        first, last = offset // BLOCK_SIZE, (end - 1) // BLOCK_SIZE
        missing = [b for b in range(first, last + 1) if not bitmap.has(v.hot, b)]
        ahead = [b for b in ra or () if b > last and not bitmap.has(v.hot, b)]
        self._count(missing)
        if not missing and bitmap.count(v.hot) == bitmap.nblocks(v.size):
            self._mark_whole(ino)  # every block arrived: later reads skip the metadata
        await self._fetch(v, self.hotc, missing, ahead)

    def hot_complete(self, ino: int) -> bool:
        """Whether every block of the file is on hot already (reading needs no fetch)."""
        if ino in self._whole:
            return True
        v = self._view(ino)
        return v is None or v.hot is None or bitmap.count(v.hot) == bitmap.nblocks(v.size)

    async def read_held(self, ino: int, version: int, offset: int, length: int) -> bytes | None:
        """For another node of a cluster (the peer data door): the bytes of ``[offset,
        offset+length)`` of ``version``, from this node's hot tier only; None when this node
        does not hold that range; :class:`~tierd.placement.peerreads.VersionMoved` when the
        file is at another version here, or being written (its bytes may be changing)."""
        v = await self._aview(ino)
        if v is None:
            return None
        if v.version != version or self.busy(ino):
            raise VersionMoved(f"inode {ino} is at version {v.version} on node {self.node!r}"
                               + (" and being written" if self.busy(ino) else ""))
        end = min(v.size, offset + length)
        if end <= offset:
            return b""
        if v.hot is not None and not all(bitmap.has(v.hot, b) for b in
                                         range(offset // BLOCK_SIZE, (end - 1) // BLOCK_SIZE + 1)):
            return None
        self.acquire(ino)
        try:
            async with self.hot.fd(ino) as fd:
                data = await fileio.pread(fd, end - offset, offset)
        except FileNotFoundError:
            return None
        finally:
            self.release(ino)
        after = await self._aview(ino)
        if after is None or after.version != version or self.busy(ino):
            raise VersionMoved(f"inode {ino} changed on node {self.node!r} while it was read")
        self.stats.peer_served_bytes += len(data)
        return data

    async def read(self, ino: int, offset: int, length: int) -> bytes:
        """The bytes of ``[offset, offset+length)`` (short at end of file).  A file with a
        memory-tier copy is served from it; warm-only blocks are served from warm until
        their second reference promotes them; the rest from the hot file, through the hot
        tier's descriptor (an open file's is the one the namespace writes through)."""
        if self.mem is not None:
            data = self.mem.read(ino, offset, length)
            if data is not None:
                return data
            if ino not in self._mem_seen and self.mem_policies():
                self._mem_seen.add(ino)  # decided once per content (enqueue forgets it)
                if len(self._mem_seen) > 1 << 16:
                    self._mem_seen.clear()
                self.admit_mem_later(ino)
        for attempt in range(_CHANGED_TRIES):
            try:
                async with self.hot.fd(ino, create=True) as fd:
                    return await self._read_local(ino, fd, offset, length)
            except FsError as e:  # on a cluster: changed on another node meanwhile
                if e.errno != errno.ESTALE or not self.node or attempt + 1 == _CHANGED_TRIES:
                    raise
        raise AssertionError("unreachable")

    async def _read_local(self, ino: int, fd: int, offset: int, length: int) -> bytes:
        """:meth:`read` from hot and warm, ``fd`` the hot file's descriptor."""
        self.acquire(ino)
        try:
            if ino in self._whole:
                self._step(ino, offset, offset + max(length, 1), None)
                return await fileio.pread(fd, length, offset)
            v = await self._aview(ino)
            end = 0 if v is None else min(v.size, offset + length)
            if v is None or end <= offset:
                return await fileio.pread(fd, length, offset)
            refs = self._refs(ino, offset, end)
            ra = self._step(ino, offset, end, v)
            if v.hot is None:
                self._mark_whole(ino)
                self.stats.hits += 1
                return await fileio.pread(fd, length, offset)
            first, last = offset // BLOCK_SIZE, (end - 1) // BLOCK_SIZE
            to_hot: list[int] = []
            on_warm: list[int] = []
            for b in range(first, last + 1):
                if bitmap.has(v.hot, b):
                    continue
                if bitmap.has(v.warm, b) and not (b in refs and self._promote(ino, b)):
                    on_warm.append(b)
                elif v.tier == WARM and not bitmap.has(v.warm, b):
                    on_warm.append(b)  # lands on warm, its target tier
                    if b in refs:
                        self._promote(ino, b)  # this miss is its first reference
                else:
                    to_hot.append(b)
            self._count(to_hot + on_warm)
            if not to_hot and not on_warm and bitmap.count(v.hot) == bitmap.nblocks(v.size):
                self._mark_whole(ino)  # every block arrived: later reads skip the metadata
            ahead = [b for b in ra or () if b > last
                     and not bitmap.has(v.hot, b) and not bitmap.has(v.warm, b)]
            target = self.warmc if v.tier == WARM and self.warmc is not None else self.hotc
            cold_to_warm = [b for b in on_warm if not bitmap.has(v.warm, b)]
            if target is self.hotc:
                await asyncio.gather(self._fetch(v, self.hotc, to_hot, ahead),
                                     self._fetch(v, target, cold_to_warm, []))
            else:
                await asyncio.gather(self._fetch(v, self.hotc, to_hot, []),
                                     self._fetch(v, target, cold_to_warm, ahead))
            if not on_warm:
                return await fileio.pread(fd, end - offset, offset)
            return await self._read_mixed(ino, fd, offset, end, set(on_warm))
        finally:
            self.release(ino)

    async def fill(self, ino: int, tier: str) -> int:
        """Make the whole file present on ``tier`` (``warmup --tier``); returns its size.
        Filling warm copies hot blocks down rather than fetching them again."""
        tc = self.cache_of(tier)
        v = await self._aview(ino)
        if v is None:
            return 0
        n = bitmap.nblocks(v.size)
        if tc is self.hotc:
            if v.hot is not None:
                await self._fetch(v, tc, [b for b in range(n) if not bitmap.has(v.hot, b)],
                                  [])
            return v.size
        missing = [b for b in range(n) if not bitmap.has(v.warm, b)]
        await self._fetch(v, tc, missing, [])
        return v.size

    def admit_mem_later(self, ino: int) -> None:
        """Copy the file into the memory tier in the background, if its policy says so."""
        if self.mem is not None:
            self.mem.start_admit(ino, lambda: self.admit_mem(ino))

    async def admit_mem(self, ino: int, *, force: bool = False) -> bool:
        """Make the file's memory-tier copy: the whole file onto hot first (from warm or
        cold), then into a pool region.  Only files whose policy names ``mem`` unless
        ``force`` (``warmup --tier mem``); not while it has unflushed writes (its commit
        calls again).  False when the file stays on hot (spilled, changed, not placed)."""
        mem = self.mem
        if mem is None:
            return False
        async with self.meta.asnapshot() as tx:
            inode = tx.get_inode(ino)
            if inode is None or not inode.is_reg or not (force or self.wants_mem(tx, ino)):
                return False
        if mem.get(ino, inode.version) is not None:
            return True
        if self.busy(ino) or inode.size == 0:
            return False
        version = inode.version

        def current() -> bool:
            with self.meta.snapshot() as tx:
                cur = tx.get_inode(ino)
            return cur is not None and cur.version == version and not self.busy(ino)

        with self.hold(ino):
            await self.ensure(ino, 0, inode.size, touch=False)
            if not current():
                return False
            async with self.hot.fd(ino, create=False) as fd:
                return await mem.admit(ino, version, inode.size, inode.uid, fd, current)

    async def quiesce(self, ino: int) -> None:
        """Wait for in-flight fills of ``ino`` (before its content is replaced)."""
        tasks = {t for (_, i, _), t in list(self._inflight.items()) if i == ino}
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- references, streams, promotion ------------------------------------------------
    def _view(self, ino: int) -> View | None:
        with self.meta.snapshot() as tx:
            return self._view_in(tx, ino)

    async def _aview(self, ino: int) -> View | None:
        """:meth:`_view` for coroutines (over PostgreSQL its begin, and its reads, leave
        the loop)."""
        async with self.meta.asnapshot(warm=lambda tx: self._view_in(tx, ino)) as tx:
            return self._view_in(tx, ino)

    def _view_in(self, tx: MetaTxn, ino: int) -> View | None:
        inode = tx.get_inode(ino)
        if inode is None or not inode.is_reg:
            return None
        hot = inode.blocks.get(HOT)
        rec = tx.get_cold(ino) if hot is not None else None
        tier = HOT
        if self.warmc is not None and any(p.tier == WARM for p in self.policies.values()):
            policy = file_policy(tx, ino, self.policy_for)
            if policy is not None and policy.tier == WARM:
                tier = WARM
        # warm bits of a warm tier that is no longer configured are ignored
        warm = inode.blocks.get(WARM, b"") if self.warmc is not None else b""
        return View(ino, inode.version, inode.size, hot, warm, rec, tier, inode.nlink == 0,
                    inode.home)

    def _refs(self, ino: int, offset: int, end: int) -> range:
        """Blocks this read references: one sequential stream's several reads of a block
        are one reference (they would promote scans)."""
        st = self._streams.get(ino)
        first = offset // BLOCK_SIZE
        if st is not None and st.next == offset and offset % BLOCK_SIZE:
            first += 1
        return range(first, (end - 1) // BLOCK_SIZE + 1)

    def _step(self, ino: int, offset: int, end: int, v: View | None) -> range | None:
        """Count the read's references on the tiers that hold its blocks and advance the
        stream; returns the blocks to read ahead (None: none)."""
        for b in self._refs(ino, offset, end):
            key = (ino, b)
            if key in self.hotc.order:
                self.hotc.order.access(key)
            if self.warmc is not None and key in self.warmc.order:
                self.warmc.order.access(key)
        st = self._streams.get(ino)
        if st is None or (st.next != offset and offset != 0):
            self._streams[ino] = Stream(next=end, ra_end=0 if offset == 0 else end)
            if len(self._streams) > 4096:
                self._streams.pop(next(iter(self._streams)))
            if offset != 0:
                return None
            st = self._streams[ino]
        st.next = end
        if v is None or st.ra_end - end >= st.window:
            return None
        # the reader entered the last window: request the next one
        st.window = min(max(st.window * 2, FIRST_WINDOW), self.settings.readahead_max)
        start = max(st.ra_end, end)
        st.ra_end = min(v.size, start + st.window)
        if st.ra_end <= start:
            return None
        return range(start // BLOCK_SIZE, (st.ra_end - 1) // BLOCK_SIZE + 1)

    def _promote(self, ino: int, b: int) -> bool:
        """A reference to a block only warm holds: the second one (within the hot 2Q's
        ghost history, or our own memory of warm references) promotes it to hot."""
        key = (ino, b)
        if key in self._warm_refs or key in self.hotc.order.a1out:
            self._warm_refs.pop(key, None)
            self.stats.promoted_blocks += 1
            return True
        self._warm_refs[key] = None
        while len(self._warm_refs) > max(16, self.hotc.order.capacity):
            self._warm_refs.popitem(last=False)
        return False

    def _count(self, missing: list[int]) -> None:
        if missing:
            self.stats.misses += 1
        else:
            self.stats.hits += 1

    async def _read_mixed(self, ino: int, fd: int, offset: int, end: int,
                          on_warm: set[int]) -> bytes:
        """A range partly served from warm: runs of blocks from each tier's file."""
        assert self.warm is not None
        parts: list[bytes] = []
        pos = offset
        while pos < end:
            b = pos // BLOCK_SIZE
            warm = b in on_warm
            stop = pos
            while stop < end and ((stop // BLOCK_SIZE) in on_warm) == warm:
                stop = min(end, (stop // BLOCK_SIZE + 1) * BLOCK_SIZE)
            if warm:
                try:
                    parts.append(await self.warm.read(ino, pos, stop - pos))
                except OSError as e:
                    log.warning("reading inode %d from the warm tier failed: %s", ino, e)
                    raise FsError(errno.EIO, f"warm tier: {e}") from e
                self.stats.warm_read_bytes += stop - pos
            else:
                parts.append(await fileio.pread(fd, stop - pos, pos))
            if len(parts[-1]) < stop - pos:
                parts[-1] += bytes(stop - pos - len(parts[-1]))
            pos = stop
        return b"".join(parts)

    # -- fills -------------------------------------------------------------------------
    async def _fetch(self, v: View, dst: TierCache, blocks: list[int],
                     ahead: list[int]) -> None:
        """Fill ``blocks`` of ``v`` on ``dst`` and wait for them; start ``ahead`` (readahead)
        without waiting.  A demand run adjacent to the readahead is fetched with it."""
        if not blocks and not ahead:
            return
        if blocks and ahead and ahead[0] == blocks[-1] + 1:
            blocks, ahead = blocks + ahead, []
        stream = bool(ahead) or len(blocks) > 1
        waits = self._start(v, dst, blocks, stream=stream)
        if ahead:
            for t in self._start(v, dst, ahead, stream=True):
                t.add_done_callback(_quiet)
        if waits:
            await asyncio.gather(*(asyncio.shield(t) for t in waits))

    def _start(self, v: View, dst: TierCache, blocks: list[int], *,
               stream: bool) -> list[asyncio.Task[None]]:
        """Tasks filling ``blocks`` (already in flight, or new runs by source)."""
        tasks: dict[int, asyncio.Task[None]] = {}
        new: list[int] = []
        for b in blocks:
            t = self._inflight.get((dst.name, v.ino, b))
            if t is not None:
                tasks[id(t)] = t
            elif b < bitmap.nblocks(v.size):
                new.append(b)
        for first, count in bitmap.runs(new):
            run = list(range(first, first + count))
            for src, part in _split(run, lambda b: self._source(v, dst, b)):
                task = asyncio.create_task(self._fill_run(v, dst, part, src, stream))
                for b in part:
                    self._inflight[(dst.name, v.ino, b)] = task
                task.add_done_callback(
                    functools.partial(self._done, [(dst.name, v.ino, b) for b in part]))
                tasks[id(task)] = task
        return list(tasks.values())

    def _done(self, keys: list[tuple[str, int, int]], task: asyncio.Task[None]) -> None:
        for k in keys:
            if self._inflight.get(k) is task:
                del self._inflight[k]

    def _source(self, v: View, dst: TierCache, b: int) -> str:
        """Where block ``b`` comes from when filling ``dst``: the memory tier's copy (for
        hot), the other local tier if it has the block, else cold."""
        if dst is self.hotc and self.mem is not None and self.mem.get(v.ino, v.version):
            return MEM
        if self.warmc is None:
            return "cold"
        if dst is self.hotc:
            return WARM if bitmap.has(v.warm, b) else "cold"
        return HOT if v.hot is None or bitmap.has(v.hot, b) else "cold"

    async def _fill_run(self, v: View, dst: TierCache, run: list[int], src: str,
                        stream: bool) -> None:
        ino = v.ino
        self._filling[ino] += 1
        try:
            while True:
                while (punching := self._evicting.get((dst.name, ino))) is not None:
                    await asyncio.shield(punching)
                cur = await self._aview(ino)
                if (dst.name, ino) not in self._evicting:
                    break  # (a punch began while the view was read: wait for it, again)
            if cur is None or cur.version != v.version:
                if self.node and cur is not None:
                    # on a cluster the new version may be another node's: the reader
                    # looks again (read/ensure retry) rather than read a file lacking it
                    raise FsError(errno.ESTALE, f"inode {ino} changed while it was read")
                return  # replaced meanwhile: the new content is whole on hot
            if src != "cold" and not all(self._source(cur, dst, b) == src for b in run):
                src = "cold"  # left that tier before we started
            off = run[0] * BLOCK_SIZE
            n = min(v.size, (run[-1] + 1) * BLOCK_SIZE) - off
            await self.make_room(dst, n)
            try:
                await self._copy_in(v, dst, off, n, src, stream)
            except BaseException:
                # give back what a failed fill wrote (no bit records it; a full tier needs
                # the space): the run's blocks are this task's alone
                with contextlib.suppress(OSError):
                    await dst.tier.punch(ino, off, n)
                raise
            async with self.meta.awrite() as tx:
                inode = tx.get_inode(ino)
                if inode is None or inode.version != v.version:
                    return
                bm = inode.blocks.get(dst.name)
                if bm is None and dst is self.hotc:
                    return  # whole on hot already
                bm = bm or b""
                fresh = [b for b in run if not bitmap.has(bm, b)]
                inode.blocks[dst.name] = bitmap.with_bits(bm, fresh, True)
                tx.put_inode(inode)
            dst.add_bytes(ino, sum(bitmap.block_bytes(v.size, b) for b in fresh))
            for b in fresh:
                dst.add(ino, b)
            if src == "cold" and self.held_elsewhere(v.home, v.version, v.rec):
                src = "peer"  # another node's door (counted as peer_read_bytes), not cold
            self.stats.filled[(dst.name, src)] += n
            if src == "cold":
                self.stats.fetched_bytes += n
        finally:
            self._filling[ino] -= 1
            if self._filling[ino] <= 0:
                del self._filling[ino]

    async def _copy_in(self, v: View, dst: TierCache, off: int, n: int, src: str,
                       stream: bool) -> None:
        """The bytes of one run onto ``dst``'s file: from the other local tier, or from
        cold (ENOSPC on the local tier: evict and retry once, then ENOSPC)."""
        if src == MEM:
            if await self._copy_from_mem(v, dst, off, n):
                return
            src = "cold"  # the copy was reclaimed meanwhile
        rec = v.rec
        if src == "cold" and self.held_elsewhere(v.home, v.version, rec):
            await self.fetch_from_peer(v.ino, v.home, v.version, dst.tier, off, n)
            return
        if src == "cold" and (rec is None or not rec.keys):
            if v.unlinked:
                raise FsError(errno.ENOENT, f"inode {v.ino} was deleted", reason=Reason.NO_SUCH_KEY)
            raise FsError(errno.EIO, f"inode {v.ino}: bytes at {off} are on no local tier "
                          "and the cold store has no copy", reason=Reason.SERVICE_UNAVAILABLE)
        key, etag = next(iter(rec.keys.items())) if rec is not None and rec.keys else ("", "")
        for attempt in (0, 1):
            try:
                if src != "cold":
                    await dst.tier.copy_from(self.cache_of(src).tier, v.ino, off, n)
                    return
                # a stream's runs in a few large ranges (fewer requests), at most
                # readahead_max / 4 each so a large run still goes in parallel
                rs = max(self.cold.transfer.range_size,
                         min(n // 4, self.settings.readahead_max // 4)) if stream else None
                async with dst.tier.fd(v.ino, create=True) as fd:
                    await self.cold.read_into(key, off, n, fd, off, if_match=etag,
                                              range_size=rs)
                return
            except OSError as e:
                if e.errno == errno.ENOSPC and attempt == 0 and await self.evict(
                        2 * n, tier=dst.name):
                    continue
                if e.errno == errno.ENOSPC:
                    log.warning("%s tier full and nothing evictable: %s", dst.name, e)
                raise FsError(e.errno or errno.EIO, f"{dst.name} tier: {e}") from e
            except TierUnavailable as e:
                self.stats.cold_read_errors += 1  # tierd_cold_store_errors_total
                log.warning("read of %s failed: cold store unavailable: %s", key, e)
                raise FsError(errno.EIO, f"cold store unavailable: {e}",
                              reason=Reason.SERVICE_UNAVAILABLE) from e
            except ObjectNotFound as e:
                await self._vanished(v, key, etag)
                raise FsError(errno.ENOENT, f"{key}: deleted from the cold store outside "
                              "tierd", reason=Reason.NO_SUCH_KEY) from e
            except ObjectChanged as e:
                self.stats.cold_read_errors += 1
                log.warning("read of %s failed: the cold object was replaced outside tierd "
                            "(expected ETag %s): %s", key, etag, e)
                raise FsError(errno.EIO, f"cold object {key} changed: {e}") from e
            except TierError as e:
                self.stats.cold_read_errors += 1
                log.warning("read of %s failed: %s", key, e)
                raise FsError(errno.EIO, str(e)) from e

    async def _copy_from_mem(self, v: View, dst: TierCache, off: int, n: int) -> bool:
        """One run from the file's memory-tier copy onto ``dst``; False when the copy is
        gone (ENOSPC: evict and retry once, as for cold)."""
        assert self.mem is not None
        for attempt in (0, 1):
            try:
                async with dst.tier.fd(v.ino, create=True) as fd:
                    await asyncio.to_thread(self.mem.copy_out, v.ino, v.version, fd, off, n)
                return True
            except FileNotFoundError:
                return False
            except OSError as e:
                if e.errno == errno.ENOSPC and attempt == 0 and await self.evict(
                        2 * n, tier=dst.name):
                    continue
                raise FsError(e.errno or errno.EIO, f"{dst.name} tier: {e}") from e
        return False

    async def _vanished(self, v: View, key: str, etag: str) -> None:
        """The cold object of a clean file is gone: upload it again when a complete local
        copy exists, else drop the file from the namespace (never a file with data cold
        lacks) and free its local blocks (``importer.lost``)."""
        got = await self.importer.judge_read_miss(v.ino, key)
        if got is None:
            log.warning("%s vanished from the cold store but inode %d is not clean; kept",
                        key, v.ino)
            return
        if got[0] == "reupload":
            self.reupload_counted(v.ino, got[1])
            return
        log.warning("%s was deleted from the cold store outside tierd: dropped inode %d "
                    "from the namespace (%s)", key, v.ino, got[1])
        await self.free_vanished(v.ino)


def _split(run: list[int], source: Callable[[int], str]) -> list[tuple[str, list[int]]]:
    """Consecutive pieces of ``run`` with the same ``source(block)``."""
    out: list[tuple[str, list[int]]] = []
    for b in run:
        k = source(b)
        if out and out[-1][0] == k:
            out[-1][1].append(b)
        else:
            out.append((k, [b]))
    return out


def _quiet(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("readahead failed: %s", task.exception())


