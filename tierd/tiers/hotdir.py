"""The namespace's side of the hot tier: staging, installs and small-file writes over the
hot :class:`~tierd.tiers.local_tier.LocalTier`.

One object owns the hot data files: the hot ``LocalTier`` that placement fills, evicts and
uploads from.  It alone knows their layout (``<hot>/<last 2 hex>/<ino:016x>``), creates
them and keeps their descriptors (a bounded cache with reference counts).  ``HotDir`` wraps
that same object for what only the namespace does -- staging whole-object uploads in
``<hot>/tmp`` so a PUT appears atomically by rename, group-synced small files, sweeping a
crash's leftovers -- and asks it for every path and descriptor: an open file's descriptor
is the tier's cached one (:meth:`HotDir.pin`), so the namespace's writes and placement's
reads, fills and uploads of that file go through one descriptor.

Why a wrapper rather than one class: the namespace's file calls are blocking (run in
threads or right after a commit: ``remove`` unlinks at once, ``open`` hands a new
descriptor to a thread or to sendfile) where the tier's are coroutines on the loop, and the
warm tier needs no staging; keeping the two APIs apart is the smaller change, and the files
still have one owner.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Sequence

from tierd.tiers.fileio import copy_range, fsync_parent
from tierd.tiers.groupsync import GroupWriter, syncfs
from tierd.tiers.local_tier import LocalTier

log = logging.getLogger("tierd.tiers")


class HotDir:
    def __init__(self, tier: LocalTier) -> None:
        self.tier = tier
        self.root = tier.root
        self.tmp = self.root / "tmp"
        self.tmp.mkdir(exist_ok=True)
        self.small = GroupWriter(self._open_new_path, fsync_parent)

    def path(self, ino: int) -> str:
        """The inode's data file (the tier's layout)."""
        return self.tier.path(ino)

    def open(self, ino: int) -> int:
        """A new O_RDWR descriptor on the inode's data file, which the caller closes (a
        thread's hashing or cloning, a reader handed to sendfile); a missing file (created
        before its data, e.g. by mknod, or whose data was lost) is created empty."""
        return self.tier.open_file(ino, create=True)

    def make_files(self, inos: Sequence[int]) -> list[int]:
        """Empty data files for new numbers, made ahead by a helper process: the leading
        numbers whose file was made (:meth:`LocalTier.make_files`; blocking, a thread)."""
        return self.tier.make_files(inos)

    def pin(self, ino: int) -> tuple[int, Callable[[], None]]:
        """The tier's cached descriptor of the inode's data file (created empty when
        missing) and the call that lets go of it: an open file's descriptor, shared with
        placement's reads, fills and uploads.  Loop only; never close it."""
        return self.tier.pin(ino)

    async def apin(self, ino: int) -> tuple[int, Callable[[], None]]:
        """:meth:`pin`, a missing data file created off the event loop."""
        return await self.tier.apin(ino)

    def open_new(self, ino: int) -> int:
        """A write descriptor on a new inode's data file, emptied (a crash may have left a
        file under a number the metadata never committed)."""
        return self._open_new_path(self.path(ino))

    async def write_new(self, ino: int, chunks: Sequence[bytes | memoryview],
                        durable: bool = True) -> None:
        """A new inode's data file holding ``chunks``, durable (name included) on return
        unless ``durable=False`` (then in the page cache: the caller logged the bytes);
        small files of concurrent requests share one thread and their syncs
        (:mod:`tierd.tiers.groupsync`)."""
        await self.small.write(self.path(ino), chunks, durable)

    def sync_all(self) -> None:
        """Everything written to the tier's file system so far made durable (``syncfs``;
        blocking: a thread)."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            syncfs(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _open_new_path(p: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            return os.open(p, flags, 0o600)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            return os.open(p, flags, 0o600)

    def remove(self, ino: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(ino))

    def new_temp(self) -> tuple[str, int]:
        """A fresh staging file for a streamed upload."""
        p = os.path.join(self.tmp, uuid.uuid4().hex)
        return p, os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

    def install(self, temp_path: str, ino: int) -> None:
        """Atomically make a staged file the inode's data (rename within one directory tree)."""
        p = self.path(ino)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.replace(temp_path, p)

    def install_durable(self, temp_path: str, ino: int) -> None:
        """:meth:`install` and make the new name survive a crash (blocking: a thread)."""
        self.install(temp_path, ino)
        self.fsync_dir(ino)

    def detach(self, ino: int) -> bool:
        """Give the inode's data file a new file-system inode with the same bytes (a copy,
        fsynced, renamed over the old name, the name fsynced): whoever still holds the old
        one -- the kernel's backing file of a FUSE write passthrough outlives the daemon
        that opened it (fuse/kpass.py) -- writes where no version looks.  Blocking; False
        when there is no data file."""
        path = self.path(ino)
        try:
            src = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return False
        except BlockingIOError:
            # a write lease on it that nobody gives back: the dead daemon's, kept with its
            # backing file by a process still holding a file of the last mount open
            log.warning("the data file of inode %d is under a write lease of the last "
                        "daemon (its passthrough file is still open): the start waits for "
                        "the kernel to break it (/proc/sys/fs/lease-break-time)", ino)
            src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            tmp, dst = self.new_temp()
            try:
                size = os.fstat(src).st_size
                if copy_range(src, dst, size, 0, 0) != size:
                    raise OSError(f"data file of inode {ino} changed while copied")
                os.fsync(dst)
            finally:
                os.close(dst)
            self.install_durable(tmp, ino)
            self.tier.release_fd(ino)  # a cached descriptor would still name the old one
        finally:
            os.close(src)
        return True

    def clear_temp(self) -> int:
        """Remove staging files left by a crash; returns how many."""
        n = 0
        for entry in os.scandir(self.tmp):
            os.unlink(entry.path)
            n += 1
        return n

    def inventory(self) -> set[int]:
        """Inode numbers that have a data file here (blocking: a thread)."""
        return self.tier.inventory()

    def fsync_dir(self, ino: int) -> None:
        fsync_parent(self.path(ino))

    def statvfs(self) -> os.statvfs_result:
        return os.statvfs(self.root)
