"""Size changes of regular files: truncate, ftruncate and ``open(O_TRUNC)``.

Metadata first, space later (docs/durability.md): bytes a committed version names are cut
from the data file only once the commit of the smaller size is durable, so a crash leaves
the old size with all of its bytes or the new size.  Bytes past the recorded size that a
crash leaves behind are never read (every read stops at the size) and are cut before
anything extends the file (:meth:`ResizeOps._cut_stale`), so an extension reads zeros.
"""

from __future__ import annotations

import asyncio
import errno
import os

from tierd.acl import W_OK, Identity, check_access
from tierd.acl.modes import drop_privs, write_drops_privs
from tierd.errors import FsError
from tierd.meta import EMPTY_MD5, STATE_DIRTY
from tierd.namespace.base import NamespaceBase, now_ns
from tierd.namespace.contentmeta import forget_content_meta
from tierd.namespace.crashpoint import crashpoint
from tierd.namespace.keepversion import keep_committed


class ResizeOps(NamespaceBase):
    """Truncation and extension of regular files (see the module doc)."""

    async def _truncate(self, ident: Identity, ino: int, size: int, fh: int | None) -> None:
        if size < 0:
            raise FsError(errno.EINVAL, "negative file size")
        async with self.meta.asnapshot() as tx:
            inode = self._get(tx, ino)
        if inode.is_dir:
            raise FsError(errno.EISDIR, f"inode {ino} is a directory")
        if not inode.is_reg:
            raise FsError(errno.EINVAL, f"inode {ino} is not a regular file")
        if fh is not None and self._handle(fh).writable:
            pass  # ftruncate on a descriptor opened for writing needs no further check
        else:
            check_access(ident, inode, W_OK, f"inode {ino}")
        await self._set_size(ino, size, drop=write_drops_privs(ident, inode.mode))

    async def _set_size(self, ino: int, size: int, drop: bool = False) -> None:
        """Truncate or extend a file's data and commit the new size and version at once
        (``drop``: also clear setuid/setgid, for an unprivileged caller); metadata first,
        space later (the module doc).  Writes to the inode wait while this runs."""
        if drop:
            async with self.meta.awrite() as tx:
                inode = self._get(tx, ino)
                inode.mode = drop_privs(inode.mode)
                tx.put_inode(inode)
        await self._prepare_write(ino, size)
        while (busy := self._resizing.get(ino)) is not None:
            await asyncio.shield(busy)
        done = self._resizing[ino] = asyncio.get_running_loop().create_future()
        try:
            await self._resize(ino, size)
        finally:
            del self._resizing[ino]
            done.set_result(None)

    async def _resize(self, ino: int, size: int) -> None:
        async with self.meta.asnapshot() as tx:
            cut = size < self._get(tx, ino).size  # committed bytes go: durable first
        if cut:
            await self._keep_before_cut(ino)
        while True:
            of = self._open.get(ino)
            if of is not None:
                if size > of.size:
                    self._cut_stale(of.fd, of.size)
                if size > of.size or not cut:
                    os.ftruncate(of.fd, size)  # no committed byte is lost
                of.size = size
                of.touch()
                await self._commit_open(of)
                break
            if await self._resize_closed(ino, size):
                break  # (else the file was opened while the transaction began)
        if cut:
            crashpoint("truncate.committed")
            await self._sync_meta()
            crashpoint("truncate.durable")
            await asyncio.to_thread(self._cut_file, ino, size)
            crashpoint("truncate.cut")

    async def _resize_closed(self, ino: int, size: int) -> bool:
        """The resize of a file no handle holds; False (nothing done) when one was opened
        while the transaction began (over PostgreSQL the begin awaits): the caller then
        resizes through the handle, whose size would otherwise be stale."""
        fd = self.hot.open(ino)
        try:
            async with self.meta.awrite() as tx:
                if ino in self._open:
                    return False
                inode = self._get(tx, ino)
                if size > inode.size:
                    self._cut_stale(fd, inode.size)
                    os.ftruncate(fd, size)
                inode.size = size
                inode.mtime_ns = inode.ctime_ns = now_ns()
                inode.version = tx.next_version()
                forget_content_meta(inode)
                inode.etag = EMPTY_MD5 if size == 0 else ""
                inode.state = STATE_DIRTY
                tx.put_inode(inode)
                self._queue(tx, inode)
        finally:
            os.close(fd)
        return True

    async def _keep_before_cut(self, ino: int) -> None:
        """In a versioned bucket the committed version is kept before a cut destroys its
        bytes (:mod:`tierd.namespace.keepversion`), unless an in-place change since the
        last durable point already kept it (its intention is durable)."""
        of = self._open.get(ino)
        if of is not None and of.intending is not None:
            await asyncio.shield(of.intending)
        if of is None or not of.intent:
            await keep_committed(self, ino)

    def _cut_file(self, ino: int, size: int) -> None:
        """The deferred cut of a shrink, once durable (blocking: a thread).  A descriptor
        of its own: an open file's may be closed meanwhile by its last release, and a
        file dropped meanwhile is gone (nothing to cut, nothing to create)."""
        try:
            fd = os.open(self.hot.path(ino), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            self._cut_stale(fd, size)
        finally:
            os.close(fd)

    @staticmethod
    def _cut_stale(fd: int, size: int) -> None:
        """Before the file grows past ``size``: bytes the data file holds beyond it are
        not content (a crash between a smaller size's commit and the cut, or writes
        that were never committed) and must read as zeros once the size covers them."""
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
