"""Group commit: many small metadata transactions, one durable engine commit.

A durable lmdb commit costs an fdatasync (~250 µs on the machines we measure), so one per
mutation caps a mount at ~4,000 creates/s and makes every concurrent S3 PUT wait for its own
disk flush.  Local file systems solve this with a journal that commits groups of operations
and makes each one durable only when asked (fsync); this engine does the same over any
:class:`~tierd.meta.kv.KVStore`:

* A committed transaction is published at once into an in-memory overlay (visible to every
  later transaction, and atomic to concurrent readers), and queued.
* A flusher thread writes the queued changes to the inner engine in one transaction, durable
  (lmdb: ``sync`` and ``metasync``), after at most ``interval`` seconds, or immediately when
  someone waits for durability (:meth:`GroupCommitStore.sync` / :meth:`sync_async`): the
  durability points of DESIGN.md (fsync, close of a written file, an S3 acknowledgement).
  Concurrent waiters share one flush.
* The event loop never waits for the disk: it only touches dictionaries, and the inner
  engine's write transaction lives entirely in the flusher thread (lmdb requires that).

Integrity is the inner engine's: it only ever sees whole groups, committed durably, so a
machine crash leaves a consistent store that lacks at most the last ``interval`` of
acknowledged-but-not-yet-durable changes (the same promise as ext4's journal, which commits
every 5 s) and never loses anything a durability point returned for.

Readers keep snapshot isolation: every overlay value is versioned by commit sequence number,
and a transaction reads the newest version not newer than its start, over an inner read
transaction begun at the same instant.  Versions already in the inner engine are dropped
once no transaction that began before that flush remains.

**Out of space.**  A flush that fails keeps its group queued and is retried; whoever waits
for durability gets an ``FsError`` with the cause's errno (ENOSPC for a full map or file
system: 507 / ENOSPC at the doors, not an I/O error).  So that the changes of a full store
never pile up in memory, a commit that *adds* metadata is refused with ENOSPC before it is
published -- nothing of it is visible -- while the last flush failed for lack of space, or
when the inner engine's :meth:`~tierd.meta.kv.KVStore.headroom` (measured after every
flush) is too small for what is queued or being flushed plus this change (counting a page
per changed key: a flush copies each page it touches).  Commits that free space or keep
the size (deletions, bitmap and time updates) always go through: they are how the store
gets its room back.
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from itertools import islice

from sortedcontainers import SortedList

from tierd.errors import FsError, no_space
from tierd.meta.kv import KVStore, KVTxn
from tierd.meta.layers import ENDED, merge_layers

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 0.005  # seconds a non-durable change may wait for its group
RETRY_DELAY = 0.5  # seconds between attempts of a group whose flush failed
LOG_EVERY = 30.0  # seconds between repeated log lines of one lasting failure
#: the inner engine's pages cost more than the bytes of the keys and values in them
#: (lmdb: measured 1.0 to 1.4 times; the engine's headroom keeps a margin of its own)
_PAGE_OVERHEAD = 1.25
#: commits skip the exact size check while the room exceeds what is queued by this
_SLACK = 1 << 20
#: a flush copies every page it touches (copy-on-write), so each changed key may cost a page
#: beyond its bytes; admission counts one per key queued or in flight
_KEY_PAGE = 4096
_SCAN_BATCH = 64
_MISSING = object()
#: the most keys a transaction keeps of what it read from its snapshot: an operation reads
#: a few keys again and again; a long listing that reads each of a million inodes once
#: must not keep them all
_READS_KEPT = 256


def _size(key: bytes, value: bytes | None) -> int:
    return 0 if value is None else len(key) + len(value)


def _flush_error(error: BaseException | None) -> FsError:
    """What a waiter for durability gets when the flush failed: the cause's errno."""
    if isinstance(error, FsError):
        return FsError(error.errno or errno.EIO, f"metadata flush failed: {error.message}")
    code = error.errno if isinstance(error, OSError) and error.errno else errno.EIO
    return FsError(code, f"metadata flush failed: {type(error).__name__}: {error}")


class _Versions:
    """One key's committed-but-maybe-unflushed values: parallel lists, oldest first."""

    __slots__ = ("seqs", "values")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.values: list[bytes | None] = []

    def at(self, seq: int) -> object:
        """The value as of ``seq`` (None: deleted), or _MISSING: look in the inner engine."""
        i = bisect.bisect_right(self.seqs, seq)
        return self.values[i - 1] if i else _MISSING




def _in_range(keys: SortedList | list[bytes], start: bytes, end: bytes | None) -> bool:
    """Whether sorted ``keys`` hold one in ``[start, end)``."""
    i = keys.bisect_left(start) if isinstance(keys, SortedList) else bisect.bisect_left(
        keys, start)
    return i < len(keys) and (end is None or keys[i] < end)


class GroupTxn(KVTxn):
    """One transaction over the overlay and an inner snapshot.

    Its own writes are a plain dict (every transaction of every door begins one, and a
    sorted map costs several microseconds to make and to fill); the sorted view a scan
    needs is built on demand and kept until a new key is written.  What it read from the
    inner snapshot it keeps too (``_reads``): that snapshot never changes, and the
    namespace reads the same keys again within one operation (an unlink reads its dirent
    and inode three times each), each read of lmdb being a point where the interpreter
    lock is handed to another thread.  It keeps the first ``_READS_KEPT`` keys only, so a
    long listing's transaction stays small."""

    __slots__ = ("_done", "_gen", "_inner", "_local", "_reads", "_seq", "_sorted", "_store",
                 "write")

    def __init__(self, store: GroupCommitStore, write: bool) -> None:
        self.write = write
        self._store = store
        self._local: dict[bytes, bytes | None] | None = {} if write else None
        self._sorted: list[bytes] | None = None  # the local keys in order, for scans
        self._reads: dict[bytes, bytes | None] = {}  # the inner snapshot's answers so far
        self._done = True  # until the snapshot is taken (``__del__`` has nothing to free)
        with store._lock:
            self._seq = store._seq
            self._gen = gen = store._gen
            # begun under the lock so the snapshot and the sequence number agree
            self._inner = store.inner.begin(write=False)
            readers = store._readers
            readers[gen] = readers.get(gen, 0) + 1
        self._done = False

    def __del__(self) -> None:
        # an abandoned transaction still releases its snapshot when collected (a list
        # append: atomic without the lock, which the collector may run inside of)
        if not self._done:
            self._done = True
            self._store._released.append((self._gen, self._inner))

    def _check(self) -> None:
        if self._done:
            raise RuntimeError("transaction already ended")

    def get(self, key: bytes) -> bytes | None:
        self._check()
        if self._local is not None and key in self._local:
            value: bytes | None = self._local[key]
            return value
        store = self._store
        # a key the overlay lacks now had no version this snapshot may see that is not in
        # its inner snapshot (versions are dropped only once every older reader's inner
        # snapshot holds them): no lock for the common case
        if key not in store._versions:
            return self._inner_get(key)
        with store._lock:
            versions = store._versions.get(key)
            found = versions.at(self._seq) if versions is not None else _MISSING
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        return self._inner_get(key)

    def _inner_get(self, key: bytes) -> bytes | None:
        """The inner snapshot's value of ``key``, read from it once per transaction."""
        reads = self._reads
        value = reads.get(key, _MISSING)
        if value is _MISSING:
            value = self._inner.get(key)
            if len(reads) < _READS_KEPT:
                reads[key] = value
        return value  # type: ignore[return-value]

    def put(self, key: bytes, value: bytes) -> None:
        self._check()
        if self._local is None:
            raise PermissionError("write in a read-only transaction")
        key = bytes(key)
        if self._sorted is not None and key not in self._local:
            self._sorted = None
        self._local[key] = bytes(value)

    def delete(self, key: bytes) -> bool:
        self._check()
        if self._local is None:
            raise PermissionError("write in a read-only transaction")
        existed = self.get(key) is not None
        key = bytes(key)
        if self._sorted is not None and key not in self._local:
            self._sorted = None
        self._local[key] = None
        return existed

    def _overlay(
        self, start: bytes, end: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, bytes | None]]:
        """The overlay's versions as of this snapshot, lazily, in small locked batches."""
        store = self._store
        lo, lo_inclusive, hi, hi_inclusive = start, True, end, False
        while True:
            with store._lock:
                keys = list(islice(store._keys.irange(
                    lo, hi, inclusive=(lo_inclusive, hi_inclusive), reverse=reverse),
                    _SCAN_BATCH))
                batch = []
                for k in keys:
                    v = store._versions[k].at(self._seq)
                    if v is not _MISSING:
                        batch.append((k, v))
            yield from batch  # type: ignore[misc]
            if len(keys) < _SCAN_BATCH:
                return
            if reverse:
                hi, hi_inclusive = keys[-1], False
            else:
                lo, lo_inclusive = keys[-1], False

    def _local_range(
        self, start: bytes, end: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, bytes | None]]:
        local = self._local
        if local is None:
            return
        # copied per batch: the caller may write between the items it takes
        lo, lo_inclusive, hi = start, True, end
        while True:
            if self._sorted is None:
                self._sorted = sorted(local)
            order = self._sorted
            first = (bisect.bisect_left if lo_inclusive else bisect.bisect_right)(order, lo)
            last = len(order) if hi is None else bisect.bisect_left(order, hi)
            if reverse:
                keys = order[max(first, last - _SCAN_BATCH):last][::-1]
            else:
                keys = order[first:min(last, first + _SCAN_BATCH)]
            for k in keys:
                if k in local:
                    yield k, local[k]
            if len(keys) < _SCAN_BATCH:
                return
            if reverse:
                hi = keys[-1]
            else:
                lo, lo_inclusive = keys[-1], False

    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        self._check()
        store = self._store
        with store._lock:
            layered = _in_range(store._keys, start, end)
        local = self._local
        if local:
            if self._sorted is None:
                self._sorted = sorted(local)
            layered = layered or _in_range(self._sorted, start, end)
        if not layered:
            # nothing of the range in the overlay (a key it gains later has only versions
            # newer than this snapshot, and one it drops is in the inner snapshot: as for
            # ``get``) nor written here yet: the inner snapshot's answer, without the three
            # layers' merge -- a point range (an inode's links, its xattrs) usually is one
            yield from self._inner.scan(start, end, reverse=reverse)
            return
        inner: Iterator[tuple[bytes, bytes | None]] = self._inner.scan(
            start, end, reverse=reverse)
        merged = merge_layers(self._overlay(start, end, reverse), inner, reverse)
        if self._local is not None:
            merged = merge_layers(self._local_range(start, end, reverse), merged, reverse)
        for k, v in merged:
            if v is not None:
                yield k, v

    def commit(self) -> None:
        if self._done:
            return
        if self._local:
            refused = self._store._admit(self)
            if refused is not None:
                self._end()
                raise refused
            self._store._publish(self._local)
        self._end()

    def growth(self) -> int:
        """Bytes this transaction adds to the store (negative: it frees some)."""
        assert self._local is not None
        delta = 0
        for k, v in list(self._local.items()):
            local, self._local = self._local, None  # read what is stored, not our write
            try:
                old = self.get(k)
            finally:
                self._local = local
            delta += _size(k, v) - _size(k, old)
        return delta

    def abort(self) -> None:
        if not self._done:
            self._end()

    def _end(self) -> None:
        self._done = True
        self._store._released.append((self._gen, self._inner))
        # lmdb frees a reader slot only with the transaction object, and a caller's frame
        # may keep this wrapper alive long after it ended
        self._inner = ENDED
        if self.write:
            self._store._writer.release()
        with self._store._lock:
            self._store._drain()


class GroupCommitStore(KVStore):
    """A :class:`KVStore` that commits to ``inner`` in durable groups (see the module doc)."""

    def __init__(self, inner: KVStore, interval: float = DEFAULT_INTERVAL) -> None:
        self.inner = inner
        self.name = f"group-{inner.name}"
        self.interval = interval
        self._lock = threading.Lock()
        self._writer = threading.Lock()
        self._keys: SortedList = SortedList()
        self._versions: dict[bytes, _Versions] = {}
        self._seq = 0  # last published commit
        self._gen = 0  # inner-engine flushes completed
        self._readers: dict[int, int] = {}  # live transactions per flush generation
        self._released: list[tuple[int, KVTxn]] = []
        self._queued: dict[bytes, bytes | None] = {}  # newest value per key since last flush
        self._queued_seq = 0
        self._durable_seq = 0
        self._flushed: deque[tuple[int, int, list[bytes]]] = deque()  # (gen, seq, keys)
        self._error: BaseException | None = None
        self._failures = 0  # consecutive failed flushes
        self._logged = 0.0  # monotonic time of the last line about a lasting failure
        self._refused_logged = 0.0
        self._queued_bytes = 0  # keys and values queued since the last flush
        #: bytes and keys of the group being written: the room was measured before it, so
        #: admission counts it until the flush that writes it measures the room again
        self._inflight_bytes = self._inflight_keys = 0
        self._room = inner.headroom()  # the inner engine's, after the last flush
        self._urgent = False
        self._closing = False
        self._wake = threading.Condition(self._lock)
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._thread = threading.Thread(target=self._flusher, name="tierd-meta-flush",
                                        daemon=True)
        self._thread.start()

    # -- transactions ---------------------------------------------------------------------

    def begin(self, write: bool = False) -> KVTxn:
        if self._closing:
            raise RuntimeError("metadata store is closed")
        if write:
            self._writer.acquire()
        try:
            return GroupTxn(self, write)
        except BaseException:
            if write:
                self._writer.release()
            raise

    def _publish(self, changes: dict[bytes, bytes | None]) -> None:
        with self._lock:
            seq = self._seq + 1
            idle = not self._queued  # the flusher sleeps until there is work
            for k, v in changes.items():
                versions = self._versions.get(k)
                if versions is None:
                    versions = self._versions[k] = _Versions()
                    self._keys.add(k)
                versions.seqs.append(seq)
                versions.values.append(v)
                self._queued[k] = v
                self._queued_bytes += _size(k, v)
            self._seq = self._queued_seq = seq
            if idle:  # (waking it for every commit costs a thread switch each)
                self._wake.notify()

    def _admit(self, txn: GroupTxn) -> FsError | None:
        """None when ``txn`` may be published, else the ENOSPC to raise (see the module
        doc).  Cheap unless the store is short of room: then the change's size is
        measured and only changes that add metadata are refused."""
        with self._lock:  # the room and what it was measured against change together
            room, error = self._room, self._error
            waiting = self._queued_bytes + self._inflight_bytes
            pages = (len(self._queued) + self._inflight_keys) * _KEY_PAGE
        full = error is not None and no_space(error)
        if not full and (room is None
                         or room > _PAGE_OVERHEAD * waiting + pages + _SLACK):
            return None
        growth = txn.growth()
        if growth <= 0:
            return None
        if not full:
            assert room is not None and txn._local is not None
            pages += len(txn._local) * _KEY_PAGE
            if room >= _PAGE_OVERHEAD * (waiting + growth) + pages:
                return None
            why = (f"{room} bytes of room left, {waiting} bytes in {pages // _KEY_PAGE} "
                   f"keys waiting for it")
        else:
            why = error.message if isinstance(error, FsError) else str(error)
        now = time.monotonic()
        if now - self._refused_logged > LOG_EVERY:
            self._refused_logged = now
            log.error("metadata store full: refusing changes that add metadata (ENOSPC) "
                      "until there is room: %s; %s", why, self.inner.space_hint)
        return FsError(errno.ENOSPC, f"the metadata store is full ({why}); only changes "
                       f"that free space are accepted until there is room: "
                       f"{self.inner.space_hint}")

    def _drain(self) -> None:
        """Forget ended transactions and drop what nobody can read any more (lock held).

        Ended transactions are handed over through ``_released`` (a list append, atomic
        without the lock) because a garbage-collection finalizer may run at any point,
        including inside a section that holds the lock."""
        while self._released:
            gen, inner = self._released.pop()
            inner.abort()
            left = self._readers[gen] - 1
            if left:
                self._readers[gen] = left
            else:
                del self._readers[gen]
        self._collect()

    def _collect(self) -> None:
        """Drop overlay versions the inner engine holds for every live reader (lock held)."""
        oldest = min(self._readers) if self._readers else self._gen
        while self._flushed and self._flushed[0][0] <= oldest:
            _, seq, keys = self._flushed.popleft()
            for k in keys:
                versions = self._versions.get(k)
                if versions is None:
                    continue
                i = bisect.bisect_right(versions.seqs, seq)
                if i == len(versions.seqs):
                    del self._versions[k]
                    self._keys.remove(k)
                elif i:
                    del versions.seqs[:i], versions.values[:i]

    # -- the flusher ----------------------------------------------------------------------

    def _flusher(self) -> None:
        while True:
            with self._lock:
                while not self._queued and not self._closing:
                    self._wake.wait()
                if not self._queued and self._closing:
                    return
                if not self._urgent and not self._closing and self.interval > 0:
                    # gather a group: wait out the interval unless someone needs it durable
                    self._wake.wait_for(lambda: self._urgent or self._closing, self.interval)
                batch, seq = self._queued, self._queued_seq
                nbytes = self._queued_bytes
                self._queued, self._urgent, self._queued_bytes = {}, False, 0
                self._inflight_bytes, self._inflight_keys = nbytes, len(batch)
            try:
                with self.inner.begin(write=True) as tx:
                    for k, v in batch.items():
                        if v is None:
                            tx.delete(k)
                        else:
                            tx.put(k, v)
            except BaseException as e:  # keep the group queued; waiters learn of it
                self._failed(e, len(batch))
                with self._lock:
                    batch.update(self._queued)
                    self._queued = batch
                    self._queued_bytes += nbytes
                    self._inflight_bytes = self._inflight_keys = 0
                    self._error = e
                    self._wake.wait(RETRY_DELAY)
                self._resolve()
                if self._closing:
                    return
                continue
            if self._failures:
                log.warning("metadata flush succeeded again after %d failed attempts",
                            self._failures)
                self._failures = 0
            self.inner.keep_reserve()
            room = self.inner.headroom()
            with self._lock:
                self._error = None
                self._room = room
                self._inflight_bytes = self._inflight_keys = 0
                self._gen += 1
                self._durable_seq = seq
                self._flushed.append((self._gen, seq, list(batch)))
                self._drain()
                self._wake.notify_all()
            self._resolve()

    def _failed(self, e: BaseException, changes: int) -> None:
        """Log a failed flush: the first one, then one line per :data:`LOG_EVERY`."""
        self._failures += 1
        now = time.monotonic()
        if self._failures > 1 and now - self._logged < LOG_EVERY:
            return
        self._logged = now
        kind = "no space" if no_space(e) else "error"
        log.error("metadata flush failed (%s, attempt %d): %s: %s; %d changes stay in "
                  "memory and are retried every %.1f s; operations waiting for durability "
                  "fail with %s", kind, self._failures, type(e).__name__, e, changes,
                  RETRY_DELAY, "ENOSPC" if no_space(e) else "EIO")

    def _resolve(self) -> None:
        with self._lock:
            done, error = self._durable_seq, self._error
            ready = [w for w in self._waiters if w[0] <= done or error is not None]
            self._waiters = [w for w in self._waiters if not (w[0] <= done or error is not None)]
        for target, loop, fut in ready:
            try:
                if target <= done:
                    loop.call_soon_threadsafe(_set_result, fut)
                else:
                    loop.call_soon_threadsafe(_set_error, fut, error)
            except RuntimeError:  # that loop is closed: nobody is waiting any more
                pass

    # -- durability -----------------------------------------------------------------------

    def sync(self) -> None:
        """Return once everything committed before the call is durable (blocking)."""
        with self._lock:
            target = self._seq
            while self._durable_seq < target:
                if self._error is not None:
                    raise _flush_error(self._error) from self._error
                if self._closing and not self._thread.is_alive():
                    raise RuntimeError("metadata store closed before the flush")
                self._urgent = True
                self._wake.notify_all()
                self._wake.wait(0.1)

    @property
    def last_commit(self) -> int:
        """Sequence number of the last published commit (for ``sync_async(upto=...)``)."""
        return self._seq

    async def sync_async(self, upto: int | None = None, *, urgent: bool = True) -> None:
        """:meth:`sync` for the event loop: waits without blocking it or hopping threads.
        ``upto`` (a :attr:`last_commit`): wait only for the commits up to that one, not
        for later ones (no flush at all when the group commit already covered them).
        ``urgent=False``: wait for the group's regular flush (within ``interval``) rather
        than cutting the group short -- for background work, whose waits would otherwise
        add flushes (and disk syncs) of their own."""
        loop = asyncio.get_running_loop()
        with self._lock:
            target = self._seq if upto is None else min(upto, self._seq)
            if self._durable_seq >= target:
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((target, loop, fut))
            if urgent:
                self._urgent = True
            self._wake.notify_all()
        await fut

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        self._thread.join()
        self.inner.close()

    def stat(self) -> dict[str, int]:
        out = dict(self.inner.stat())
        with self._lock:
            out["unflushed_keys"] = len(self._queued)
            out["overlay_keys"] = len(self._versions)
        return out


def _set_result(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _set_error(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if not fut.done():
        fut.set_exception(_flush_error(error))
