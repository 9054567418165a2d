"""Hot (NVMe) and warm (SSD) tiers: one sparse file per inode in a local directory.

The layout is ``<root>/<last 2 hex>/<ino:016x>`` (data dirs written before placement existed
keep opening).  The hot tier's object is the one owner of the hot data files: their path,
their creation and their descriptors; the namespace reaches them through
:class:`~tierd.tiers.hotdir.HotDir`, which wraps this object (an open file's descriptor is
this cache's, :meth:`LocalTier.pin`).  A file's content is cached
block by block (:data:`BLOCK_SIZE`, 4 MiB): a block present on this tier is written at its
offset, an absent one is a hole.  *Which* blocks are present is placement's record in the
metadata (``Inode.blocks``), not this class's: the holes are how the space is freed, and
:meth:`LocalTier.present_blocks` (``SEEK_DATA``/``SEEK_HOLE``) is there to verify or rebuild
that record after a crash.

Why sparse files rather than one file per block: a sequential read of a hot file is one
descriptor and the kernel's read-ahead; eviction punches holes (``fallocate``
``PUNCH_HOLE|KEEP_SIZE``: the size stays, the blocks go back to the file system).

I/O follows :mod:`tierd.tiers.fileio`: reads try ``RWF_NOWAIT`` inline and go to a thread only
when the data is not in the page cache; writes likewise.  ``fsync``, ``punch``, ``remove``
and tree walks always run in threads.  Descriptors are kept open in a bounded LRU with
reference counts, so a thread never uses a descriptor that was closed (and its number
reused) under it.  Opening a file runs inline: a lookup in a local directory costs
microseconds, a thread hop ~50 µs (DESIGN.md).

Errors are ``OSError``: ``FileNotFoundError`` for an inode with no file here (reads, punch,
fsync), ``ENOSPC`` from writes when the device is full (placement evicts and retries, or
answers ENOSPC/507).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tierd.tiers import fileio
from tierd.tiers.filemaker import FileMaker, create_new

#: the unit of caching and placement (DESIGN.md: "addressed in fixed-size blocks")
BLOCK_SIZE = 4 << 20

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02

# the process's own symbols include libc's (find_library would spawn ldconfig at import)
_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = getattr(_libc, "fallocate64", None) or getattr(_libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    _fallocate.restype = ctypes.c_int


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free ``[offset, offset+length)`` of a file, keeping its size (reads give zeros).

    Returns False when the file system cannot punch holes (the range is left as it is:
    placement's record is what says the block is gone; the space comes back when the file
    is removed).  ``os.posix_fallocate`` cannot do this: it only allocates."""
    if length <= 0:
        return True
    if _fallocate is not None:
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        if _fallocate(fd, mode, offset, length) == 0:
            return True
        err = ctypes.get_errno()
        if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise OSError(err, f"fallocate(PUNCH_HOLE): {os.strerror(err)}")
    size = os.fstat(fd).st_size
    if offset == 0 and length >= size:
        # the whole file: truncating to 0 and back frees every block and keeps the size
        os.ftruncate(fd, 0)
        os.ftruncate(fd, size)
        return True
    return False


def data_ranges(fd: int, offset: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """``(start, end)`` extents holding data within ``[offset, end)`` (SEEK_DATA/SEEK_HOLE).

    Granularity is the file system's block: a partly written 4 MiB block shows as data.
    A file system without SEEK_DATA reports the whole file as data."""
    size = os.fstat(fd).st_size
    end = size if end is None else min(end, size)
    out: list[tuple[int, int]] = []
    pos = offset
    while pos < end:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break  # no data after pos
            if e.errno == errno.EINVAL:
                return [(offset, end)] if offset < end else []
            raise
        if start >= end:
            break
        stop = min(os.lseek(fd, start, os.SEEK_HOLE), end)
        out.append((start, stop))
        pos = stop
    return out


def blocks_of(offset: int, length: int, block_size: int = BLOCK_SIZE) -> range:
    """Indexes of the blocks that ``[offset, offset+length)`` touches."""
    if length <= 0:
        return range(0)
    return range(offset // block_size, (offset + length - 1) // block_size + 1)


@dataclass
class _Fd:
    fd: int
    refs: int = 0
    doomed: bool = False  # dropped from the cache while in use: close at the last release


class _Held:
    """:meth:`LocalTier.fd`'s ``async with``: the cached descriptor, held until the block
    ends.  A plain class rather than ``contextlib.asynccontextmanager``, whose generator
    cost ~3 us an entry, as much as the page-cache ``pread`` of every hot read it wraps."""

    __slots__ = ("_create", "_ent", "_ino", "_tier")

    def __init__(self, tier: LocalTier, ino: int, create: bool) -> None:
        self._tier, self._ino, self._create = tier, ino, create
        self._ent: _Fd | None = None

    async def __aenter__(self) -> int:
        self._ent = self._tier._acquire(self._ino, self._create)
        return self._ent.fd

    async def __aexit__(self, *exc: object) -> None:
        if self._ent is not None:
            ent, self._ent = self._ent, None
            self._tier._release(ent)


class LocalTier:
    """One local tier directory (hot or warm).  Methods are coroutines; the descriptor
    cache is touched only from the event loop's thread."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        name: str = "hot",
        capacity: int = 0,
        block_size: int = BLOCK_SIZE,
        max_open: int = 256,
    ) -> None:
        """``capacity`` 0 means the file system's size.  ``max_open`` bounds the cached
        descriptors (in-use ones are never closed)."""
        self.root = Path(root)
        self.name = name
        self.block_size = block_size
        self._capacity = capacity
        self._max_open = max_open
        self._fds: OrderedDict[int, _Fd] = OrderedDict()
        self._new: set[int] = set()  # created since their directory was last fsynced
        self._maker = FileMaker()  # empty files made ahead (:meth:`make_files`)
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalTier({self.name!r}, {str(self.root)!r})"

    def path(self, ino: int) -> str:
        """The inode's data file: ``<root>/<last 2 hex digits>/<ino as 16 hex digits>``."""
        h = f"{ino:016x}"
        return os.path.join(self.root, h[-2:], h)

    # -- descriptors -------------------------------------------------------------------------

    def open_file(self, ino: int, *, create: bool) -> int:
        """A new O_RDWR descriptor on the inode's file, which the caller owns and closes
        (the cache below uses it too); with ``create`` a missing file (and its shard
        directory) is made, empty.  Blocking only briefly: safe in a thread."""
        p = self.path(ino)
        flags = os.O_RDWR | os.O_CLOEXEC
        try:
            return os.open(p, flags)
        except FileNotFoundError:
            if not create:
                raise
        fd = create_new(p)  # (the shard directory only when missing: see there)
        if fd is None:  # made meanwhile
            return os.open(p, flags)
        self._new.add(ino)
        return fd

    def make_files(self, inos: Sequence[int]) -> list[int]:
        """Empty data files for ``inos``, numbers no file or inode has yet (the spares of
        :mod:`tierd.namespace.spares`), made by a helper process
        (:mod:`tierd.tiers.filemaker`): the leading numbers whose file was made, in order;
        the ``OSError`` of the first when none could be.  Blocking: call in a thread."""
        made = list(inos[:self._maker.make([os.fsencode(self.path(i)) for i in inos])])
        self._new.update(made)  # their names are synced with their first fsync
        return made

    def _acquire(self, ino: int, create: bool) -> _Fd:
        ent = self._fds.get(ino)
        if ent is None:
            ent = _Fd(self.open_file(ino, create=create), refs=1)
            self._fds[ino] = ent
            self._trim()  # (in use already: never the one just opened)
            return ent
        self._fds.move_to_end(ino)
        ent.refs += 1
        return ent

    def _release(self, ent: _Fd) -> None:
        ent.refs -= 1
        if ent.refs == 0 and ent.doomed:
            os.close(ent.fd)

    def _trim(self) -> None:
        """Close the least recently used descriptors no one holds, down to the limit.  The
        walk stops once it has enough of them: copying the whole cache's keys on every new
        file's open (the cache sits at its limit during a burst of creates) was 1.8% of the
        event loop's busy time."""
        excess = len(self._fds) - self._max_open
        if excess <= 0:
            return
        idle: list[int] = []
        for ino, ent in self._fds.items():  # least recently used first
            if ent.refs == 0:
                idle.append(ino)
                if len(idle) == excess:
                    break
        for ino in idle:
            os.close(self._fds.pop(ino).fd)

    def pin(self, ino: int) -> tuple[int, Callable[[], None]]:
        """The cached descriptor of the inode's file (created when missing), held until
        the returned call lets go of it: for a holder that outlives an ``async with``
        (:meth:`fd`), such as the namespace's open file.  Loop only; never close it."""
        ent = self._acquire(ino, True)
        return ent.fd, functools.partial(self._release, ent)

    async def apin(self, ino: int) -> tuple[int, Callable[[], None]]:
        """:meth:`pin` for a file that may not exist yet: a missing one is created in a
        worker thread.  A create writes the file system's metadata, which waits behind
        the writes of any sync in progress on it (1-1.4 ms measured while other work
        synced, 20 us when quiet): not on the event loop.  An existing file opens inline
        (a lookup)."""
        if ino not in self._fds:
            try:
                fd = self.open_file(ino, create=False)
            except FileNotFoundError:
                fd = await asyncio.to_thread(self.open_file, ino, create=True)
            if ino not in self._fds:  # (else another coroutine opened it meanwhile)
                ent = self._fds[ino] = _Fd(fd, refs=1)
                self._trim()  # (in use already: never the one just opened)
                return ent.fd, functools.partial(self._release, ent)
            os.close(fd)
        ent = self._acquire(ino, True)
        return ent.fd, functools.partial(self._release, ent)

    def inventory(self) -> set[int]:
        """Inode numbers that have a file on this tier (one walk of the shard directories;
        blocking: call in a thread).  At start placement checks the metadata's claims
        against it: a tier restored or lost apart from the metadata must not be trusted."""
        return inventory(self.root)

    def release_fd(self, ino: int) -> None:
        """Close the cached descriptor of a file someone else unlinked (an open descriptor
        would keep its blocks allocated: a full tier would never get the space back)."""
        self._drop(ino)

    def _drop(self, ino: int) -> None:
        ent = self._fds.pop(ino, None)
        if ent is not None:
            if ent.refs == 0:
                os.close(ent.fd)
            else:
                ent.doomed = True

    def fd(self, ino: int, *, create: bool = False) -> _Held:
        """A descriptor on the inode's file for the duration of the ``async with`` (e.g. to
        hand to :meth:`ObjectTier.read_into` or ``put_file``); do not close it."""
        return _Held(self, ino, create)

    # -- data --------------------------------------------------------------------------------

    async def read(self, ino: int, offset: int, length: int) -> bytes:
        """Bytes at ``offset`` (holes read as zeros; short at end of file)."""
        async with self.fd(ino) as fd:
            return await fileio.pread(fd, length, offset)

    async def write(self, ino: int, offset: int, data: bytes | memoryview) -> int:
        """Write all of ``data`` at ``offset``, creating the file if needed."""
        async with self.fd(ino, create=True) as fd:
            return await fileio.pwrite(fd, data, offset)

    async def copy_from(self, src: LocalTier, ino: int, offset: int, length: int) -> int:
        """Copy ``[offset, offset+length)`` of the inode's file on tier ``src`` to the same
        range here (demotion hot -> warm, promotion warm -> hot): ``copy_file_range`` in a
        thread (no copy through Python; a reflink where the file system can), else
        ``pread``/``pwrite``.  Returns the bytes copied (short at the source's end)."""
        async with src.fd(ino) as sfd, self.fd(ino, create=True) as dfd:
            return await asyncio.to_thread(fileio.copy_range, sfd, dfd, length, offset, offset)

    async def truncate(self, ino: int, size: int) -> None:
        """Set the file's size (creating it): extending adds a hole, no blocks."""
        async with self.fd(ino, create=True) as fd:
            await asyncio.to_thread(os.ftruncate, fd, size)

    async def punch(self, ino: int, offset: int, length: int) -> bool:
        """Free a range (eviction of blocks); the size is kept.  False if the file system
        could not free it (see :func:`punch_hole`)."""
        async with self.fd(ino) as fd:
            return await asyncio.to_thread(punch_hole, fd, offset, length)

    async def evict_blocks(self, ino: int, blocks: Iterable[int]) -> bool:
        """Punch whole blocks by index (contiguous runs in one call each)."""
        ok = True
        for start, count in _runs(sorted(set(blocks))):
            ok &= await self.punch(ino, start * self.block_size, count * self.block_size)
        return ok

    async def fsync(self, ino: int) -> None:
        """Make the file's data durable (and its directory entry, if it is new): a
        durability point of the design (FUSE fsync/close, S3 acknowledgement)."""
        async with self.fd(ino) as fd:
            await asyncio.to_thread(os.fdatasync, fd)
        if ino in self._new:
            self._new.discard(ino)
            await asyncio.to_thread(fileio.fsync_parent, self.path(ino))

    async def remove(self, ino: int) -> None:
        """Delete the inode's file (missing is fine)."""
        self._drop(ino)
        self._new.discard(ino)
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(os.unlink, self.path(ino))

    # -- inspection --------------------------------------------------------------------------

    async def stat(self, ino: int) -> os.stat_result | None:
        """The file's stat, or None if this tier has no file for the inode."""
        try:
            return await asyncio.to_thread(os.stat, self.path(ino))
        except FileNotFoundError:
            return None

    async def allocated(self, ino: int) -> int:
        """Bytes the file occupies on disk (``st_blocks * 512``), 0 if absent."""
        st = await self.stat(ino)
        return 0 if st is None else st.st_blocks * 512

    async def data_ranges(self, ino: int, offset: int = 0,
                          length: int | None = None) -> list[tuple[int, int]]:
        """Extents holding data (see :func:`data_ranges`); [] if the file is absent."""
        end = None if length is None else offset + length
        try:
            async with self.fd(ino) as fd:
                return await asyncio.to_thread(data_ranges, fd, offset, end)
        except FileNotFoundError:
            return []

    async def present_blocks(self, ino: int, offset: int = 0,
                             length: int | None = None) -> list[int]:
        """Indexes of blocks in the range that hold any data on this tier (for verifying or
        rebuilding placement's record after a crash)."""
        out: list[int] = []
        for start, end in await self.data_ranges(ino, offset, length):
            for b in blocks_of(start, end - start, self.block_size):
                if not out or out[-1] < b:
                    out.append(b)
        return out

    def capacity(self) -> int:
        """Configured capacity, or the file system's size when none is configured."""
        if self._capacity:
            return self._capacity
        st = os.statvfs(self.root)
        return st.f_blocks * st.f_frsize

    def fs_free(self) -> int:
        """Bytes the file system can still give an unprivileged writer."""
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    async def used(self) -> int:
        """Bytes allocated under the tier directory (a walk: for startup and verification;
        placement keeps its own running count)."""
        return await asyncio.to_thread(_tree_allocated, str(self.root))

    async def close(self) -> None:
        """Close cached descriptors (those in use close at their last release) and end the
        helper process that makes files."""
        for ino in list(self._fds):
            self._drop(ino)
        await asyncio.to_thread(self._maker.close)


def _runs(sorted_blocks: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for b in sorted_blocks:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs


def _tree_allocated(root: str) -> int:
    total = 0
    stack = [root]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    return total


def inventory(root: str | os.PathLike[str]) -> set[int]:
    """Inode numbers with a data file under ``root`` (one walk of the shard directories,
    ``<root>/<last 2 hex>/<ino:016x>``; the staging and upload directories are not shards).
    Blocking: call it in a thread."""
    out: set[int] = set()
    try:
        shards = list(os.scandir(root))
    except FileNotFoundError:
        return out
    for shard in shards:
        if not (shard.is_dir(follow_symlinks=False) and len(shard.name) == 2):
            continue
        for f in os.scandir(shard.path):
            if len(f.name) == 16:
                with contextlib.suppress(ValueError):
                    out.add(int(f.name, 16))
    return out
