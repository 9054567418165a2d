"""Open files: create/open, read/write, flush/fsync/release.

Bytes go straight to the namespace, which reads and writes the tier file with
``preadv``/``pwritev`` (inline when the page cache can serve them).  What this module adds
is the kernel's side of caching:

* ``keep_cache`` on open while the inode's content version is the one the kernel's page
  cache holds, so a file read again is served from the kernel at memory speed;
* close-to-open across doors and nodes: an open that finds another content version than
  the one whose attributes the kernel was last given makes the kernel drop them (an
  attribute-only inode invalidation, sent before the OPEN reply) -- without it the kernel
  would read the new bytes up to the old size, which it trusts for the attribute timeout
  (another node's change reaches it only later, through the change feed);
* after a handle that wrote commits (flush, fsync, release) the new version is recorded as
  cached -- the kernel's pages already hold those writes (the mount does not use the
  kernel's writeback cache: writes reach the daemon as they happen, see docs/fuse.md).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os

import pyfuse3

from tierd.acl import X_OK, Identity
from tierd.acl.modes import drop_privs, has_privs
from tierd.namespace.api import Inode, crashpoint

from .base import OpsBase, fs_errors
from .handles import FileState

#: the open flag the kernel adds when a file is opened for execve() (__FMODE_EXEC)
FMODE_EXEC = 0o40
#: how far ahead of a sequential reader the tier file is asked to read
READ_AHEAD = 16 << 20


#: seconds between looks, after the last passthrough writer's RELEASE, at whether the hot
#: file is still open for writing elsewhere (a mapping that outlived its descriptor)
PT_POLL = 0.2

log = logging.getLogger("tierd.fuse")
_lease_warned = False


def _writable(flags: int) -> bool:
    return flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)


def written_elsewhere(fd: int) -> bool:
    """Whether the file of ``fd`` (the daemon's one read-write descriptor of a hot file)
    is open for writing through any other open file -- a kernel backing file kept by a
    shared mapping, say.  The kernel refuses a write lease then (``EAGAIN``); the lease,
    when granted, is given back at once.  Where leases are unavailable this cannot tell,
    and says no (logged once)."""
    global _lease_warned
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EBUSY):
            return True
        if not _lease_warned:
            _lease_warned = True
            log.warning("write leases are unavailable on the hot tier (%s): a shared mapping "
                        "of a passthrough writer that outlives its descriptor is not "
                        "waited for", os.strerror(e.errno or 0))
        return False
    crashpoint("pt.lease")  # a kill now leaves the lease to the dead mount (tests)
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return False


class FileOps(OpsBase):
    # -- opening -----------------------------------------------------------------------------
    def _file_info(self, fh: int, inode: Inode, flags: int,
                   ident: Identity) -> pyfuse3.FileInfo:
        self.files[fh] = FileState(inode.ino, _writable(flags), ident.is_root)
        keep = self.kcache.keep_cache(inode.ino, inode.version)
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep, direct_io=False)

    @fs_errors
    async def open(
        self, inode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileInfo:
        ident = self.ident(ctx)
        if flags & FMODE_EXEC:
            # execve(): the caller's right to execute, as the namespace decides it (the
            # kernel checks the same mode bits and ACL from its cache)
            await self.ns.access(ident, inode, X_OK)
        fh, attrs = await self.ns.open_file(ident, inode, flags)
        if self.kcache.attrs_stale(inode, attrs.version) and not (
                flags & os.O_TRUNC and _writable(flags)):
            # the open is answered after this: the kernel's next stat or read asks for the
            # attributes (a truncating open needs none: the kernel sets the size to 0)
            self.invalidator.attrs_now(inode)
        return self._file_info(fh, attrs, flags, ident)

    @fs_errors
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        ident = self.ident(ctx)
        inode, fh = await self.ns.create(ident, parent_inode, name, mode, flags,
                                         self.umask(ctx), kernel_writes=self.pt_creates)
        if flags & os.O_TRUNC and inode.size:
            # an existing file was opened and truncated: its version is the truncated one
            inode = await self.ns.getattr(Identity.ROOT, inode.ino)
        info = self._file_info(fh, inode, flags, ident)
        return info, self.entry(inode)

    # -- data ----------------------------------------------------------------------------------
    @fs_errors
    async def read(  # type: ignore[override]  # pyfuse3 replies from any buffer
        self, fh: int, off: int, size: int
    ) -> bytes | bytearray:
        """The buffer the namespace read into goes to the kernel as it is (pyfuse3 takes any
        buffer, its stub says bytes): one copy per request, the reply's."""
        st = self.files.get(fh)
        if st is not None:
            self._read_ahead(st, fh, off, size)
        return await self.ns.read(fh, off, size)

    def _read_ahead(self, st: FileState, fh: int, off: int, size: int) -> None:
        """Sequential readers: ask the tier file to read :data:`READ_AHEAD` bytes ahead, so
        the next requests find the page cache filled and are served inline (the cold path is
        otherwise one blocking read in a thread per kernel request)."""
        sequential = off == st.last_end or off == 0
        st.last_end = off + size
        if not sequential or off + size + READ_AHEAD // 2 < st.advised:
            return
        start = max(off, st.advised)
        st.advised = off + size + READ_AHEAD
        self.ns.advise_read(fh, start, st.advised - start)  # fire and forget

    @fs_errors
    async def write(self, fh: int, off: int, buf: bytes, kill_privs: bool = False) -> int:
        """``kill_privs``: the writer lacks CAP_FSETID (kernel backend, HANDLE_KILLPRIV_V2:
        the kernel then neither clears set-id bits itself nor sends the chmod that did).
        The namespace clears them at a write through a handle a non-root caller opened;
        for a handle root opened and another user writes through, the door does."""
        st = self.files.get(fh)
        if st is not None:
            st.wrote = True
            if kill_privs and st.by_root:
                await self._kill_privs(st.ino)
        return await self.ns.write(fh, off, buf)

    async def _kill_privs(self, ino: int) -> None:
        """Clear setuid (and setgid with group execute) as a write by an unprivileged
        process does on Linux (``file_remove_privs``)."""
        inode = await self.ns.getattr(Identity.ROOT, ino)
        if has_privs(inode.mode):
            await self.ns.setattr(Identity.ROOT, ino, mode=drop_privs(inode.mode) & 0o7777)

    # -- durability ------------------------------------------------------------------------------
    def _committed(self, fh: int, version: int | None) -> None:
        """The kernel's pages hold what this handle wrote: remember the version the
        namespace committed (None: another handle made the writes durable first, so which
        version the pages match is not known, and the next open drops them)."""
        st = self.files.get(fh)
        if st is None or not st.wrote:
            return
        st.wrote = False
        if version is not None:
            self.kcache.cached(st.ino, version)
            # the kernel sized the file from these writes itself
            self.kcache.gave_attrs(st.ino, version)

    # -- write passthrough (kpass.py): the kernel wrote the hot file, the daemon saw nothing --
    def passthrough_writer(self, fh: int, ino: int, fd: int) -> None:
        """``fh`` is opened with the kernel writing the hot file (``fd``) itself."""
        self.pt_writers.setdefault(ino, set()).add(fh)
        st = self.files.get(fh)
        if st is not None:
            st.passthrough = True
            st.hot_fd = fd
        self.space.add(ino, fd)  # the hot tier's headroom kept meanwhile (ptspace.py)

    def _pt_sync(self, fh: int, wrote: bool = True) -> None:
        """Before a durability point of a passthrough writer: the namespace takes the hot
        file's size and counts the handle as written (a new version at its commit)."""
        st = self.files.get(fh)
        if st is not None and st.passthrough:
            self.ns.passthrough_sync(fh, wrote)
            st.wrote = True

    def pt_refresh(self, ino: int, wrote: bool = False) -> None:
        """Before the daemon answers with (getattr) or changes (setattr) the size of an
        inode passthrough writers hold: the size the kernel's writes gave the hot file."""
        for fh in self.pt_writers.get(ino, ()):
            self.ns.passthrough_sync(fh, wrote)
            return

    def _pt_close(self, fh: int) -> None:
        st = self.files.get(fh)
        if st is None or not st.passthrough:
            return
        self.ns.passthrough_close(fh)
        fhs = self.pt_writers.get(st.ino)
        if fhs is not None:
            fhs.discard(fh)
            if not fhs:
                del self.pt_writers[st.ino]
                self.pt_privs.pop(st.ino, None)
                self.space.remove(st.ino)

    # -- killpriv under write passthrough: the kernel's writes clear no set-id bit ---------------
    def _hot_stamp(self, ino: int) -> tuple[int, int, int] | None:
        for fh in self.pt_writers.get(ino, ()):
            st = self.files.get(fh)
            if st is not None and st.hot_fd >= 0:
                s = os.fstat(st.hot_fd)
                return s.st_size, s.st_mtime_ns, s.st_ctime_ns
        return None

    def pt_watch_privs(self, ino: int, mode: int) -> None:
        """After a setattr left ``ino`` with ``mode``: set-id bits on an inode passthrough
        writers hold (a chmod made while they are open: a new writer never passes through a
        set-id file, ``NamespaceAPI.passthrough_open``) are watched from the hot file's
        stamp now; none, or no such writer, ends the watch."""
        stamp = self._hot_stamp(ino) if has_privs(mode) else None
        if stamp is None:
            self.pt_privs.pop(ino, None)
        else:
            self.pt_privs[ino] = stamp

    async def pt_killpriv(self, ino: int) -> None:
        """At each look at a watched inode (getattr, lookup, readdirplus, setattr, flush,
        fsync, release): the hot file changed since the set-id bits were set, so a writer
        wrote through the kernel, which cleared nothing (``fs/fuse/passthrough.c`` writes
        the backing file with the daemon's credentials).  Linux clears the bits at a write
        by a process without ``CAP_FSETID``; the daemon cannot tell which process wrote, so
        the bits go when any passthrough writer of the inode open then was opened by a
        non-root caller (the proxy the WRITE path uses too), through the namespace's
        setattr, and the kernel drops the mode it cached.  Writers all root: they stay."""
        old = self.pt_privs.get(ino)
        if old is None:
            return
        stamp = self._hot_stamp(ino)
        if stamp is None:
            del self.pt_privs[ino]
            return
        if stamp == old:
            return
        self.pt_privs[ino] = stamp
        fhs = self.pt_writers.get(ino, set())
        if all(self.files[fh].by_root for fh in fhs if fh in self.files):
            return
        del self.pt_privs[ino]
        await self._kill_privs(ino)
        self.invalidator.attrs_now(ino)

    @fs_errors
    async def flush(self, fh: int) -> None:
        await self._pt_look(fh)
        self._committed(fh, await self.ns.flush(fh))

    @fs_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self._pt_look(fh)
        self._committed(fh, await self.ns.fsync(fh, datasync))

    async def _pt_look(self, fh: int, wrote: bool = True) -> None:
        self._pt_sync(fh, wrote)
        st = self.files.get(fh)
        if st is not None and st.ino in self.pt_privs:
            await self.pt_killpriv(st.ino)

    @fs_errors
    async def release(self, fh: int) -> None:
        st = self.files.get(fh)
        if (st is not None and st.passthrough and self.pt_writers.get(st.ino) == {fh}
                and written_elsewhere(st.hot_fd)):
            # the last passthrough writer's RELEASE, but the hot file is still open for
            # writing: a shared mapping outlived its descriptor (the kernel's passthrough
            # mmap maps the hot file itself, and the FUSE file goes at close(2))
            task = asyncio.ensure_future(self._release_later(fh, st.hot_fd))
            # (its stores count as writes at the release, whatever the clock shows)
            self._later.add(task)
            task.add_done_callback(self._later.discard)
            return
        await self._release_now(fh)

    async def _release_now(self, fh: int, mapped: bool = False) -> None:
        """The release proper.  A passthrough writer's last close sent a FLUSH, which
        committed its writes: the release commits again only when the hot file changed
        since (``mapped``: a mapping wrote after the close)."""
        try:
            await self._pt_look(fh, wrote=mapped)
            self._pt_close(fh)
            self._committed(fh, await self.ns.release(fh))
        finally:
            self.files.pop(fh, None)

    def cancel_later(self) -> None:
        """The session ends: releases still waiting for a mapping stop looking (their
        handles stay open: the namespace's close makes them durable, and the intention
        stays for the next start, ``Namespace._recover``)."""
        for task in list(self._later):
            task.cancel()
        self.space.close()

    async def _release_later(self, fh: int, fd: int) -> None:
        """Keep the handle -- and with it the in-place intention and the "being written"
        state -- until nothing but the daemon has the hot file open for writing; then the
        release commits what the mapping wrote as a new version."""
        while written_elsewhere(fd):
            await asyncio.sleep(PT_POLL)
        try:
            await self._release_now(fh, mapped=True)
        except Exception:
            log.exception("releasing passthrough handle %d failed", fh)
