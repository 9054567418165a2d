"""File data on the hot tier directory: one sparse local file per inode.

The tiers issue replaces this with block-addressed tiers; until then the namespace stores
each regular file's bytes in ``<hot>/<shard>/<ino>`` and stages whole-object uploads in
``<hot>/tmp`` so a PUT appears atomically by rename.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

from tierd.tiers.fileio import fsync_parent
from tierd.tiers.groupsync import GroupWriter, syncfs


class HotDir:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.tmp = self.root / "tmp"
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(exist_ok=True)
        self.small = GroupWriter(self._open_new_path, fsync_parent)

    def path(self, ino: int) -> str:
        h = f"{ino:016x}"
        return os.path.join(self.root, h[-2:], h)

    def open(self, ino: int, create: bool = False) -> int:
        """An O_RDWR descriptor on the inode's data file (created empty when asked)."""
        p = self.path(ino)
        flags = os.O_RDWR | os.O_CLOEXEC
        if create:
            flags |= os.O_CREAT  # (the shard directory is made below if it is missing)
        try:
            return os.open(p, flags, 0o600)
        except FileNotFoundError:
            # a file created before its data (e.g. by mknod) or whose data was lost: empty
            os.makedirs(os.path.dirname(p), exist_ok=True)
            return os.open(p, flags | os.O_CREAT, 0o600)

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
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
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

    def create_empty(self, ino: int) -> None:
        os.close(self.open(ino, create=True))

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

    def clear_temp(self) -> int:
        """Remove staging files left by a crash; returns how many."""
        n = 0
        for entry in os.scandir(self.tmp):
            os.unlink(entry.path)
            n += 1
        return n

    def inventory(self) -> set[int]:
        """Inode numbers that have a data file here (blocking: a thread)."""
        return inventory(self.root)

    def fsync_dir(self, ino: int) -> None:
        fsync_parent(self.path(ino))

    def statvfs(self) -> os.statvfs_result:
        return os.statvfs(self.root)


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
