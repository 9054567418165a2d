"""The embedded metadata engine: one lmdb environment in the data directory.

lmdb gives readers lock-free MVCC snapshots and one writer at a time, which fits an asyncio
daemon: transactions are short and never span an ``await``.

Two durability modes (setting ``meta_sync``):

* ``durable=True`` (default): ``sync=True, metasync=False``.  Each commit fdatasyncs the data
  pages before the meta page is written, so the file stays intact through a machine crash
  and at most the last commit is undone; :meth:`LmdbStore.sync` (called at the durability
  points: fsync, close, S3 acknowledgement) also flushes that meta page.  Costs one
  fdatasync per commit (~4,000 commits/s measured on this machine kind).
* ``durable=False``: ``sync=False``.  Commits reach only the OS page cache (a killed process
  still loses nothing) and are flushed at the durability points; a machine crash between
  them can corrupt the file unless the file system preserves write order.  For scratch
  nodes and benchmarks of the rest of the stack (~150,000 commits/s).

See docs/metadata.md, "Transactions and durability".

**Out of space** is an answer, not an I/O error: lmdb reports a full map as
``MDB_MAP_FULL`` and a full file system as a short write ("Input/output error"); both become
``FsError(ENOSPC)`` naming the cause (the ``meta_map_size`` setting, or the file system of
the metadata directory), so the doors answer 507 / ENOSPC and the transaction is aborted
whole.  So that a full file system shared with the data tiers does not stop metadata
commits -- the deletions that free space are commits too -- the store keeps a reserve
allocated past lmdb's last page (an eighth of the store, 4 to 64 MiB; ``posix_fallocate``
of ``data.mdb``, best effort: skipped when there is no room), which lmdb's growth writes
into without asking the file system for blocks.  :meth:`LmdbStore.headroom` tells the group
commit how much it may still add (docs/durability.md, "Full disk").
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import lmdb

from tierd.errors import FsError
from tierd.meta.kv import KVStore, KVTxn

log = logging.getLogger(__name__)

DEFAULT_MAP_SIZE = 64 << 30  # address space only; the file grows as needed
#: bytes kept allocated past the last page: an eighth of the store, at least
#: RESERVE_MIN, at most RESERVE (and at most 1/32 of the file system, and the map)
RESERVE = 64 << 20
RESERVE_MIN = 4 << 20
#: free bytes on the file system below which lmdb's "Input/output error" (a short write)
#: is taken for what it almost always is there: the file system is full
_NEARLY_FULL = 16 << 20
#: pages a group flush may need beyond its data (copied branch pages, the free list)
_FLUSH_PAGES = 64
_NUM_METAS = 2
#: seconds the file system's free space and the file's size are taken as measured
_SPACE_TTL = 0.05
#: the lock file's size (lmdb's: 8 KiB for its 126 reader slots)
_LOCK_BYTES = 64 << 10


def _allocate_lock_file(path: Path) -> None:
    """Give a new environment's lock file its blocks before lmdb maps it: lmdb extends the
    file with ``ftruncate`` and writes it through the mapping, which on a full file system
    is SIGBUS, not an error.  Allocated here, a full disk is ENOSPC (a clear start-up
    error) instead."""
    if path.exists():
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.posix_fallocate(fd, 0, _LOCK_BYTES)
    except OSError:
        os.close(fd)
        path.unlink()
        raise
    os.close(fd)


class LmdbTxn(KVTxn):
    def __init__(self, store: LmdbStore, write: bool) -> None:
        self.write = write
        self._store = store
        self._txn = store.env.begin(write=write, buffers=False)
        self._done = False

    def get(self, key: bytes) -> bytes | None:
        value = self._txn.get(key)
        return None if value is None else bytes(value)

    def put(self, key: bytes, value: bytes) -> None:
        if not self.write:
            raise PermissionError("write in a read-only transaction")
        try:
            self._txn.put(key, value)
        except lmdb.Error as e:
            raise self._store.translate(e) from e

    def delete(self, key: bytes) -> bool:
        if not self.write:
            raise PermissionError("write in a read-only transaction")
        try:
            return bool(self._txn.delete(key))
        except lmdb.Error as e:
            raise self._store.translate(e) from e

    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        cur = self._txn.cursor()
        try:
            if reverse:
                if end is None:
                    ok = cur.last()
                else:
                    ok = cur.set_range(end)
                    ok = cur.prev() if ok else cur.last()
                while ok:
                    k = bytes(cur.key())
                    if k < start:
                        break
                    yield k, bytes(cur.value())
                    ok = cur.prev()
            else:
                ok = cur.set_range(start)
                while ok:
                    k = bytes(cur.key())
                    if end is not None and k >= end:
                        break
                    yield k, bytes(cur.value())
                    ok = cur.next()
        finally:
            cur.close()

    def commit(self) -> None:
        if not self._done:
            self._done = True
            try:
                self._txn.commit()
            except lmdb.Error as e:  # lmdb aborted it: nothing of it was written
                raise self._store.translate(e) from e

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._txn.abort()


class LmdbStore(KVStore):
    name = "lmdb"

    def __init__(
        self,
        path: Path | str,
        map_size: int = DEFAULT_MAP_SIZE,
        *,
        durable: bool = True,
        metasync: bool = False,
    ) -> None:
        self.durable = durable
        self.path = path = Path(path)
        self.map_size = map_size
        self.space_hint = (f"delete something, raise meta_map_size (the lmdb map), or free "
                           f"space on the file system of {path}")
        self._space_at = 0.0  # when _free, _reserve and _file_size were measured
        self._free = self._reserve = self._file_size = 0
        path.mkdir(parents=True, exist_ok=True)
        if os.stat(path).st_mode & 0o777 != 0o700:  # (no write on a full disk otherwise)
            os.chmod(path, 0o700)
        _allocate_lock_file(path / "lock.mdb")
        self.env = lmdb.open(
            str(path),
            map_size=map_size,
            subdir=True,
            sync=durable,
            metasync=metasync,
            max_dbs=0,
            lock=True,
            readahead=False,
        )
        self.keep_reserve()

    def begin(self, write: bool = False) -> KVTxn:
        return LmdbTxn(self, write)

    def sync(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        self.env.close()

    def stat(self) -> dict[str, int]:
        info = self.env.info()
        st = self.env.stat()
        return {
            "entries": int(st["entries"]),
            "map_size": int(info["map_size"]),
            "used_bytes": int((info["last_pgno"] + 1) * st["psize"]),
        }

    # -- space ---------------------------------------------------------------------------

    def translate(self, e: lmdb.Error) -> Exception:
        """The error to raise for ``e``: FsError(ENOSPC) when the map or the file system
        is full (with what to do about it), else ``e`` itself."""
        if isinstance(e, lmdb.MapFullError):
            return FsError(errno.ENOSPC, f"the metadata store is full: its lmdb map "
                           f"({self.env.info()['map_size']} bytes) has no free page left; "
                           "delete something, or raise meta_map_size and restart")
        text = str(e)
        if ("No space left" in text or "Disk quota" in text
                or ("Input/output error" in text and self._fs_free() < _NEARLY_FULL)):
            return FsError(errno.ENOSPC, f"the metadata store is full: no space left on "
                           f"the file system of {self.path} ({text})")
        return e

    def _fs_free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def _pages(self) -> tuple[int, int, int, int]:
        """(page size, pages the file has up to its last used one, pages in use, map
        size)."""
        info, st = self.env.info(), self.env.stat()
        used = st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"] + _NUM_METAS
        return (int(st["psize"]), int(info["last_pgno"]) + 1, int(used),
                int(info["map_size"]))

    def _space(self) -> tuple[int, int]:
        """(free bytes on the file system, bytes of the reserve), re-read at most every
        :data:`_SPACE_TTL` seconds: the flusher asks after every flush, and a statvfs and
        a stat cost more than the rest of :meth:`headroom`."""
        now = time.monotonic()
        if now - self._space_at > _SPACE_TTL:
            st = os.statvfs(self.path)
            self._free = st.f_bavail * st.f_frsize
            psize, top, _, _ = self._pages()
            self._reserve = min(max(RESERVE_MIN, min(RESERVE, top * psize // 8)),
                                st.f_blocks * st.f_frsize // 32)
            self._file_size = os.stat(self.path / "data.mdb").st_size
            self._space_at = now
        return self._free, self._reserve

    def headroom(self) -> int:
        """Bytes of new metadata that still fit, conservatively: free pages in the file
        and in the map, and what the file system (or the reserve allocated past the last
        page) can still give the file; minus what a flush needs for itself."""
        psize, top, used, map_size = self._pages()
        try:
            free, _ = self._space()
        except OSError:
            free = 0
        disk = free + max(0, self._file_size - top * psize)
        grow = min(map_size - top * psize, disk)
        return max(0, grow + (top - used) * psize - _FLUSH_PAGES * psize)

    def keep_reserve(self) -> None:
        """Keep a reserve allocated past the last page (an eighth of the store, 4 to
        64 MiB, at most 1/32 of the file system, never past the map), so that metadata
        can grow on a full file system.
        Best effort: without room it is skipped and tried again after a later flush."""
        psize, top, _, map_size = self._pages()
        data = self.path / "data.mdb"
        try:
            _, reserve = self._space()
            want = min(top * psize + reserve, map_size)
            if self._file_size >= top * psize + reserve // 2 or want <= top * psize:
                return
            fd = os.open(data, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.posix_fallocate(fd, 0, want)
            finally:
                os.close(fd)
            self._file_size = max(self._file_size, want)
        except OSError as e:
            self._space_at = 0.0  # measure again next time
            log.debug("metadata reserve of %s not extended: %s", data, e)
