"""FUSE passthrough for opens of files wholly on the hot tier.

With ``FUSE_PASSTHROUGH`` negotiated at INIT, an OPEN reply may name a *backing file*
registered with ``FUSE_DEV_IOC_BACKING_OPEN``: the kernel then serves ``read``, ``mmap``
and ``splice`` of that open file from the hot-tier file itself, and no READ request reaches
the daemon -- nor, for a writable open, any WRITE.  What decides when it is safe (docs/fuse.md,
"Passthrough" and "Write passthrough"):

* **Read-only opens; writable ones only with** ``writes`` (``fuse_passthrough_writes``).  A
  passthrough write changes the hot file without the namespace seeing it, so the namespace
  must first agree (``NamespaceAPI.passthrough_open``: the ``V`` intention durable and held,
  the file "being written" until the last passthrough writer goes), and the door hands it
  the hot file's size at getattr, setattr, flush, fsync and release (fuse/files.py).
  Otherwise writers keep the normal WRITE path.
* **The kernel's I/O modes.**  While an inode has a passthrough open, every other open of
  it must be passthrough with the same backing file, and while it has a cached
  (non-passthrough) open no passthrough open is allowed (``fs/fuse/iomode.c``; a mistake
  is EIO for the opener).  So a read-only open is passthrough only when no writer has the
  inode open, and a writable open of an inode held by passthrough readers waits up to
  :data:`WRITER_WAIT` seconds for them to close (their RELEASE comes asynchronously after
  ``close(2)``), then fails with ``ETXTBSY`` ("text file busy", as for a running program)
  -- unless it may be passthrough itself, and joins their backing file.
* **The bytes must all be there.**  Only files whose every block is on hot and whose hot
  file is exactly the namespace's size (a crash can leave bytes past the committed size,
  which reads must not see): ``NamespaceAPI.hot_fd`` decides both; the inode is held
  against eviction (``NamespaceAPI.hold``) while a passthrough open lasts.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyfuse3

from tierd.acl import Identity
from tierd.acl.modes import has_privs

from . import kproto as K

if TYPE_CHECKING:
    from .ops import TierdOps

log = logging.getLogger("tierd.fuse")

#: seconds a writable open waits for passthrough readers of the inode to be released
WRITER_WAIT = 2.0


@dataclass(slots=True)
class _Backing:
    backing_id: int
    handles: set[int] = field(default_factory=set)
    gone: asyncio.Event = field(default_factory=asyncio.Event)


def _writable(flags: int) -> bool:
    return flags & os.O_ACCMODE != os.O_RDONLY or bool(flags & os.O_TRUNC)


def _leases_work(fd: int) -> bool:
    """Whether the hot tier's file system grants write leases (taken and given back at
    once; refused because another descriptor is open counts as working)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError as e:
        return e.errno in (errno.EAGAIN, errno.EBUSY)
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return True


class Passthrough:
    """Per-inode I/O mode bookkeeping and the backing-file ioctls of one session."""

    def __init__(self, ops: TierdOps, devfd: int, *, writes: bool = False) -> None:
        self.ops = ops
        self.devfd = devfd
        #: writable opens may be passthrough too (``fuse_passthrough_writes``)
        self.writes = writes
        #: with write passthrough configured, readers pass through only where a writer
        #: could too (:meth:`prepare`), so no writer waits for them
        self.strict = writes
        ops.pt_creates = writes
        self._refused_readers: set[int] = set()  # fh of read-only opens kept cached
        #: writers that joined passthrough readers of a set-id file: its mode (opened)
        self._join_privs: dict[int, int] = {}
        self._writer_fd: dict[int, int] = {}  # fh -> hot fd of a writer decided passthrough
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.backings: dict[int, _Backing] = {}  # ino -> its registered hot file
        self.cached: Counter[int] = Counter()  # ino -> opens (and pending opens) without
        self._cached_fh: dict[int, int] = {}  # fh -> ino of a cached open
        self._pt_fh: dict[int, int] = {}  # fh -> ino of a passthrough open
        self._broken = False
        #: write leases were granted on the hot tier once (a property of its file system,
        #: not of a file: :meth:`prepare` probes until then, two ``fcntl`` calls a create)
        self._leases_ok = False

    # -- open ----------------------------------------------------------------------------------
    async def may_open(self, ino: int, flags: int) -> None:
        """Before the namespace opens: a writer reserves the cached mode of the inode
        (waiting for passthrough readers to go, else ETXTBSY)."""
        if not _writable(flags) or self.writes:  # (writes: decided at :meth:`prepare`)
            return
        await self._readers_gone(ino)
        self.cached[ino] += 1

    async def _readers_gone(self, ino: int) -> None:
        b = self.backings.get(ino)
        if b is not None:
            try:
                await asyncio.wait_for(b.gone.wait(), WRITER_WAIT)
            except TimeoutError:
                raise pyfuse3.FUSEError(errno.ETXTBSY) from None

    async def prepare(self, ino: int, fh: int, flags: int) -> None:
        """With passthrough writes on, after the namespace opened ``fh`` for writing: the
        kernel writes the hot file itself when no cached open of the inode exists and the
        namespace agrees (``passthrough_open``: whole on hot, the in-place intention
        durable); else the cached mode is reserved as :meth:`may_open` does."""
        if not _writable(flags):
            await self._reader(ino, fh)
            return
        if not self.writes:
            return
        if not self.cached[ino] and not self._broken:
            joined = ino in self.backings  # held by passthrough readers
            fd = await self.ops.ns.passthrough_open(fh, join=joined)
            if fd is not None and joined:
                mode = (await self.ops.ns.getattr(Identity.ROOT, ino)).mode
                if has_privs(mode):  # set while the readers were open: watched (files.py)
                    self._join_privs[fh] = mode
            if fd is not None and not self._leases_ok:
                self._leases_ok = _leases_work(fd)
            if fd is not None and not self._leases_ok:
                # the last release could not tell a mapping that outlived its descriptor
                # (fuse/files.py written_elsewhere): such a file system keeps the WRITE path
                self.ops.ns.passthrough_close(fh)
                fd, self.writes = None, False
                self.ops.pt_creates = False
                log.warning("write leases are unavailable on the hot tier: FUSE write "
                            "passthrough is off for this mount")
            if fd is not None:
                if not self.cached[ino]:  # (no cached open came while it waited)
                    self._writer_fd[fh] = fd
                    return
                self.ops.ns.passthrough_close(fh)
        await self._readers_gone(ino)
        self.cached[ino] += 1

    async def _reader(self, ino: int, fh: int) -> None:
        """A read-only open, with write passthrough configured: it starts passthrough for
        the inode only if a writer of it would pass through as well (the namespace's
        refusals: set-id files, the memory tier's, a cluster node's, ...; or write
        passthrough turned off for this mount); else it is a cached open, and a writer
        that comes while it is open takes the WRITE path instead of waiting for it and
        failing ``ETXTBSY``.  An inode already held by passthrough opens is joined."""
        if not self.strict or ino in self.backings or self.cached[ino]:
            return
        if not (self.writes and await self.ops.ns.passthrough_readable(fh)):
            self._refused_readers.add(fh)

    def open_failed(self, ino: int, flags: int) -> None:
        if _writable(flags):
            self._uncache(ino)

    def opened(self, ino: int, fh: int, flags: int) -> int:
        """After the namespace opened ``fh``: the backing id to reply with, or 0 for the
        normal (cached) mode."""
        fd = self._writer_fd.pop(fh, None)
        if fd is not None:  # a writer the namespace let the kernel write through
            backing = self._backing(ino, fh, fd)
            mode = self._join_privs.pop(fh, None)
            if backing:
                self._pt_fh[fh] = ino
                self.ops.passthrough_writer(fh, ino, fd)
                if mode is not None and ino not in self.ops.pt_privs:
                    self.ops.pt_watch_privs(ino, mode)
                return backing
            self.ops.ns.passthrough_close(fh)  # the kernel refused: the normal path
            self.cached[ino] += 1
        if _writable(flags):
            self._cached_fh[fh] = ino  # counted by may_open or prepare
            return 0
        refused = fh in self._refused_readers and ino not in self.backings
        self._refused_readers.discard(fh)
        backing = 0 if self.cached[ino] or refused else self._backing(ino, fh)
        if backing:
            self._pt_fh[fh] = ino
        else:
            self.cached[ino] += 1
            self._cached_fh[fh] = ino
        return backing

    def _backing(self, ino: int, fh: int, fd: int | None = None) -> int:
        b = self.backings.get(ino)
        if b is not None:
            b.handles.add(fh)
            return b.backing_id
        if self._broken:
            return 0
        ns = self.ops.ns
        if fd is None:
            fd = ns.hot_fd(fh)  # None unless the file is whole on hot, at its size
        if fd is None:
            return 0
        arg = ctypes.create_string_buffer(K.BACKING_MAP.pack(fd, 0, 0), K.BACKING_MAP.size)
        rc = self._libc.ioctl(self.devfd, ctypes.c_ulong(K.DEV_IOC_BACKING_OPEN), arg)
        if rc <= 0:
            err = ctypes.get_errno()
            log.warning("FUSE passthrough is off for this mount: FUSE_DEV_IOC_BACKING_OPEN "
                        "failed (%s)", os.strerror(err))
            self._broken = True
            self.ops.pt_creates = False
            return 0
        ns.hold(ino)  # no eviction under the kernel's reads
        self.backings[ino] = _Backing(rc, {fh})
        return int(rc)

    # -- release -------------------------------------------------------------------------------
    def released(self, ino: int, fh: int) -> None:
        self._refused_readers.discard(fh)
        self._join_privs.pop(fh, None)
        if self._writer_fd.pop(fh, None) is not None:  # the OPEN reply failed
            self.ops.ns.passthrough_close(fh)
        if self._cached_fh.pop(fh, None) is not None:
            self._uncache(ino)
            return
        if self._pt_fh.pop(fh, None) is None:
            return
        b = self.backings.get(ino)
        if b is None:
            return
        b.handles.discard(fh)
        if not b.handles:
            self._close(ino, b)

    def _uncache(self, ino: int) -> None:
        self.cached[ino] -= 1
        if self.cached[ino] <= 0:
            del self.cached[ino]

    def _close(self, ino: int, b: _Backing) -> None:
        del self.backings[ino]
        b.gone.set()
        rc = self._libc.ioctl(self.devfd, ctypes.c_ulong(K.DEV_IOC_BACKING_CLOSE),
                              ctypes.byref(ctypes.c_uint32(b.backing_id)))
        if rc < 0:
            log.warning("FUSE_DEV_IOC_BACKING_CLOSE %d failed: %s", b.backing_id,
                        os.strerror(ctypes.get_errno()))
        self.ops.ns.release_held(ino)

    def close_all(self) -> None:
        """The session ends: the kernel drops its backing files with the connection; the
        eviction holds go."""
        self.ops.cancel_later()
        for ino, b in list(self.backings.items()):
            self._close(ino, b)

