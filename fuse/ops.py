"""The FUSE operations of tierd: kernel requests translated into namespace calls.

Every rule (names, permissions, link counts, errnos) lives in the namespace; this class only
maps arguments, keeps the state the kernel protocol needs (directory offsets, lookup counts,
page-cache versions) and fills the kernel's attribute structures.  Permissions are decided
by the namespace with the caller's identity, so FUSE and S3 give one identity one answer;
the kernel checks the same mode bits and ACLs too (``enable_acl``, :class:`OpsBase`), which
covers what never reaches the daemon (opening a FIFO, connecting to a socket).
"""

from __future__ import annotations

import errno
import stat
import time
from collections.abc import Sequence

import pyfuse3

from tierd.errors import FsError
from tierd.namespace.api import ROOT_INO, UTIME_NOW

from .attrs import entry_attributes, negative_entry, statvfs
from .base import fs_errors
from .files import FileOps
from .handles import DOT_ID, DOTDOT_ID, DirHandle
from .killpriv import holds_for_writing

#: entries fetched from the namespace per readdir round (a 4 KiB reply holds ~25 entries
#: with attributes, so one batch rarely needs a second scan)
READDIR_BATCH = 64
#: pyfuse3 turns UTIME_NOW into the current time before calling setattr; a time this close to
#: "now" from a caller that may not set explicit times is treated as UTIME_NOW
NOW_WINDOW_NS = 200_000_000
CAPS = b"security.capability"


class TierdOps(FileOps):
    # -- names ---------------------------------------------------------------------------------
    @fs_errors
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        try:
            inode = await self.ns.lookup(self.ident(ctx), parent_inode, name, bounded=True)
        except FsError as e:
            if e.errno == errno.ENOENT and self.negative_timeout > 0:
                return negative_entry(self.negative_timeout)
            raise
        if inode.ino in self.pt_writers:  # the entry carries the size the kernel wrote
            self.pt_refresh(inode.ino)
            await self.pt_killpriv(inode.ino)
            inode = await self.ns.getattr(self.ident(ctx), inode.ino)
        return self.entry(inode)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            if self.kcache.forget(ino, n):
                self.no_caps.discard(ino)

    @fs_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if self.pt_writers:
            self.pt_refresh(inode)
            await self.pt_killpriv(inode)
        # (bounded: the kernel caches what this gives until the change feed drops it; an
        # open checks the content version itself, files.FileOps.open)
        attrs = await self.ns.getattr(self.ident(ctx), inode, bounded=True)
        self.kcache.gave_attrs(inode, attrs.version)
        return entry_attributes(attrs, self.entry_timeout, self.attr_timeout)

    @fs_errors
    async def setattr(
        self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
        fh: int | None, ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        ident = self.ident(ctx)
        mode = attr.st_mode & 0o7777 if fields.update_mode else None
        uid = attr.st_uid if fields.update_uid else None
        gid = attr.st_gid if fields.update_gid else None
        size = attr.st_size if fields.update_size else None
        atime = attr.st_atime_ns if fields.update_atime else None
        mtime = attr.st_mtime_ns if fields.update_mtime else None
        if fh is not None and fh not in self.files:
            fh = None  # ftruncate passes its file handle; anything else is a path call
        if self.pt_writers:  # what the kernel's writes left first (size, their mtime)
            self.pt_refresh(inode, wrote=size is not None)
            await self.pt_killpriv(inode)
        if size is not None and self._near_now(atime, mtime):
            # a truncate stamps "now" (the kernel never sends explicit times with a size)
            atime = None if atime is None else UTIME_NOW
            mtime = None if mtime is None else UTIME_NOW
        # a non-owner's mode change that only drops set-id bits may be the kernel's killpriv
        # for a write (killpriv.py): the namespace asks, only then, whether the caller
        # holds the file open for writing
        def killpriv() -> bool:
            return holds_for_writing(ctx.pid, inode, self.mount_dev)

        try:
            new = await self.ns.setattr(ident, inode, mode=mode, uid=uid, gid=gid, size=size,
                                        atime_ns=atime, mtime_ns=mtime, fh=fh,
                                        killpriv=killpriv)
        except FsError as e:
            # UTIME_NOW needs only write permission, explicit times ownership; pyfuse3 hands
            # both over as times, so a refusal of "times equal to now" is retried as NOW
            if e.errno != errno.EPERM or not self._near_now(atime, mtime):
                raise
            new = await self.ns.setattr(
                ident, inode, mode=mode, uid=uid, gid=gid,
                atime_ns=None if atime is None else UTIME_NOW,
                mtime_ns=None if mtime is None else UTIME_NOW, fh=fh, killpriv=killpriv)
        if (mode is not None or size is not None) and inode in self.pt_writers:
            # (a truncate changed the hot file itself: the stamp is taken anew)
            self.pt_watch_privs(inode, new.mode)
        if size is not None and new.is_reg:
            self.kcache.cached(inode, new.version)  # the kernel truncated its pages itself
        self.kcache.gave_attrs(inode, new.version)
        return entry_attributes(new, self.entry_timeout, self.attr_timeout)

    @staticmethod
    def _near_now(*times: int | None) -> bool:
        given = [t for t in times if t is not None]
        now = time.time_ns()
        return bool(given) and all(abs(now - t) < NOW_WINDOW_NS for t in given)

    @fs_errors
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return await self.ns.readlink(self.ident(ctx), inode)

    # -- creating and removing -----------------------------------------------------------------
    @fs_errors
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        inode = await self.ns.mknod(self.ident(ctx), parent_inode, name, mode, rdev,
                                    self.umask(ctx))
        return self.entry(inode)

    @fs_errors
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        inode = await self.ns.mkdir(self.ident(ctx), parent_inode, name, mode,
                                    self.umask(ctx))
        return self.entry(inode)

    @fs_errors
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        inode = await self.ns.symlink(self.ident(ctx), parent_inode, name, target)
        return self.entry(inode)

    @fs_errors
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        # fs.protected_hardlinks is the namespace's rule (tierd.acl.modes.may_hardlink)
        linked = await self.ns.link(self.ident(ctx), inode, new_parent_inode, new_name)
        return self.entry(linked)

    @fs_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self.ns.unlink(self.ident(ctx), parent_inode, name)

    @fs_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self.ns.rmdir(self.ident(ctx), parent_inode, name)

    @fs_errors
    async def rename(
        self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
        flags: int, ctx: pyfuse3.RequestContext,
    ) -> None:
        await self.ns.rename(self.ident(ctx), parent_inode_old, name_old, parent_inode_new,
                             name_new, flags)

    # -- directories ---------------------------------------------------------------------------
    @fs_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        ident = self.ident(ctx)
        await self.ns.listdir(ident, inode, limit=0)  # a directory the caller may read
        attrs = await self.ns.getattr(ident, inode)
        fh = self._next_dir_fh
        self._next_dir_fh += 1
        self.dirs[fh] = DirHandle(inode, ident, attrs.parent or ROOT_INO)
        return fh

    @fs_errors
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        dh = self.dirs.get(fh)
        if dh is None:
            raise FsError(errno.EBADF, "directory handle is not open")
        marker = dh.marker(start_id)
        if marker is None:
            raise FsError(errno.EINVAL, f"readdir offset {start_id} was never handed out")
        if start_id < DOT_ID and not self._dot(token, b".", dh.ino, DOT_ID):
            return
        if start_id < DOTDOT_ID and not self._dot(token, b"..", dh.parent, DOTDOT_ID):
            return
        timeout = self.entry_timeout
        for ino in list(self.pt_writers):  # entries carry sizes: what the kernel wrote
            self.pt_refresh(ino)
            await self.pt_killpriv(ino)
        while True:
            entries = await self.ns.listdir(dh.ident, dh.ino, start_after=marker,
                                            limit=READDIR_BATCH)
            for name, inode in entries:
                attrs = entry_attributes(inode, timeout, self.attr_timeout)
                if not self.readdir_reply(token, name, attrs, dh.offset_after(name)):
                    return
                self.kcache.looked_up(inode.ino)
                if self.readdir_gives_attrs:
                    self.kcache.gave_attrs(inode.ino, inode.version)
                marker = name
            if len(entries) < READDIR_BATCH:
                return

    def _dot(self, token: pyfuse3.ReaddirToken, name: bytes, ino: int, next_id: int) -> bool:
        """'.' and '..' (the kernel does not link them from readdirplus: no lookup count)."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = stat.S_IFDIR | 0o755
        a.entry_timeout = a.attr_timeout = 0
        return self.readdir_reply(token, name, a, next_id)

    async def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh, None)

    @fs_errors
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        # metadata changes reach the OS at commit; an fsync on a directory makes them durable
        await self.ns.sync()

    # -- file system -----------------------------------------------------------------------------
    @fs_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        return statvfs(await self.ns.statfs())

    @fs_errors
    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        await self.ns.access(self.ident(ctx), inode, mode)
        return True

    # -- extended attributes ---------------------------------------------------------------------
    @fs_errors
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        # The kernel asks for security.capability before every write (to drop file
        # capabilities); files without one are remembered, so that costs no transaction,
        # and the first ask is bounded as a getattr is (over PostgreSQL the node's cache
        # answers it: a read transaction cost each new file's first write 0.7 ms)
        if name == CAPS and inode in self.no_caps:
            raise FsError(errno.ENODATA, "no security.capability")
        try:
            return await self.ns.getxattr(self.ident(ctx), inode, name, bounded=name == CAPS)
        except FsError as e:
            if name == CAPS and e.errno == errno.ENODATA:
                self.no_caps.add(inode)
            raise

    @fs_errors
    async def setxattr(
        self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext,
        flags: int = 0,
    ) -> None:
        # pyfuse3 checks XATTR_CREATE/XATTR_REPLACE with getxattr before calling this (flags
        # 0); the kernel backend hands them on, and the namespace checks permission first
        self.no_caps.discard(inode)
        await self.ns.setxattr(self.ident(ctx), inode, name, value, flags)

    @fs_errors
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> Sequence[bytes]:
        return await self.ns.listxattr(self.ident(ctx), inode)

    @fs_errors
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self.ns.removexattr(self.ident(ctx), inode, name)

