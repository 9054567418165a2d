"""Shared state and helpers of the namespace: the store, open files, lookups, attributes.

The namespace is split by concern into mixins (entries, files, xattrs, objects) over this
base; :class:`tierd.namespace.Namespace` assembles them.  Every method is a coroutine that
runs its metadata transaction without awaiting inside it: lmdb allows one writer, so a
transaction held across an ``await`` would stall the whole daemon.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tierd.acl import X_OK, Identity, check_access
from tierd.acl.modes import created_mode_gid, has_privs
from tierd.errors import FsError
from tierd.meta import ROOT_INO, Inode, MetaStore, MetaTxn
from tierd.namespace.bucketconf import BucketConfig
from tierd.namespace.garbage import Garbage
from tierd.namespace.names import check_name
from tierd.namespace.smalllog import SmallLog
from tierd.namespace.spares import Spares
from tierd.tiers.hotdir import HotDir

if TYPE_CHECKING:
    from tierd.placement import Placement

log = logging.getLogger("tierd.namespace")

ROOT_MODE = stat.S_IFDIR | 0o1777  # anyone may create a bucket; the sticky bit protects it
IMPLICIT = "tierd.implicit"  # objmeta flag of directories created only to hold an S3 key
MAX_SYMLINK_HOPS = 40
INO_BATCH = 64  # inode numbers a PUT over a shared engine reserves at once (_alloc_ino)
#: seconds an object call waits for its subscribers' answers before it answers (_announce)
ANNOUNCE_WAIT = 1.0
#: a subscriber's answer to a change: None, or what the call that made it waits for
Notified = Awaitable[None] | None


def now_ns() -> int:
    return time.time_ns()


@dataclass(slots=True)
class OpenFile:
    """Live state of a regular file while at least one handle is open.

    Writes update ``size``/``mtime_ns`` here and reach the metadata store at flush, fsync
    and release (the durability points); getattr overlays this state so every caller sees
    the live size.  An MD5 is streamed while writes arrive in order from offset 0, so the
    ETag of a sequentially written file costs no second read.
    """

    ino: int
    # the data file's descriptor (the hot tier's, HotDir.pin) and the call that lets go of
    # it: taken at the first read or write, not at open
    opener: Callable[[], tuple[int, Callable[[], None]]]
    size: int
    refs: int = 0
    gen: int = 0  # bumped by every write/truncate
    committed_gen: int = 0
    # the content version the last commit through this open file recorded (0: none yet):
    # what a durability point reports as the version the writer's pages hold
    committed_version: int = 0
    synced_gen: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    privs: bool = False  # mode has setuid, or setgid with group exec: a write must drop them
    # the size the last commit recorded: a write below it changes bytes a committed (maybe
    # durable) version names, and needs a durable intention first (files.FileOps.write)
    committed_size: int = 0
    intent: bool = False  # this inode's ``V`` key is durable: bytes may change in place
    intending: asyncio.Future[None] | None = None  # the ``V`` key being made durable
    # a commit deleted the inode (and wrote its ``G`` key) while this handle, opened from a
    # snapshot taken before it committed, held it: the data file goes at the last release
    dropped: bool = False
    # a commit of this namespace took the inode's last name while this file was open (an
    # orphan, ``O`` key): its last release deletes it.  Only this process changes names
    # over an embedded engine, so there a release without this flag reads nothing
    # (FileOps._reap_if_orphan); a cluster's other nodes can unlink too, so over a shared
    # one every last release looks
    unnamed: bool = False
    # handles the kernel writes through directly (FUSE write passthrough): while any is
    # open the writes are invisible here, so the file counts as written (not uploadable,
    # not evictable) and its ``V`` intention stays (tiering.TieringOps.passthrough_open)
    external: int = 0
    # the hot file's (size, mtime, ctime) when last looked at for them: a change since
    # is the kernel's writes; an explicit mtime set since stays (passthrough_sync)
    external_seen: tuple[int, int, int] = (-1, -1, -1)
    # the create that made this file committed its kernel-marked ``V`` key with it (FUSE
    # write passthrough of a new file: no flush before the reply, TieringOps.passthrough_open)
    kernel_intent: bool = False
    _fd: int = -1
    _unpin: Callable[[], None] | None = None

    @property
    def fd(self) -> int:
        """The data file's descriptor (the hot tier's: never close it).  Taken lazily:
        creating a file that is closed without a write (touch, lock files, a create+close
        benchmark) then costs no local file at all."""
        if self._fd < 0:
            self._fd, self._unpin = self.opener()
        return self._fd

    async def open_async(
        self, pin: Callable[[int], Awaitable[tuple[int, Callable[[], None]]]]
    ) -> int:
        """:attr:`fd` through ``pin`` (``HotDir.apin``: a missing data file is created in a
        worker thread, not on the event loop)."""
        if self._fd < 0:
            fd, unpin = await pin(self.ino)
            if self._fd < 0:
                self._fd, self._unpin = fd, unpin
            else:  # another coroutine took it meanwhile
                unpin()
        return self._fd

    @property
    def opened(self) -> bool:
        return self._fd >= 0

    def close_fd(self) -> None:
        unpin, self._unpin, self._fd = self._unpin, None, -1
        if unpin is not None:
            unpin()

    @property
    def dirty(self) -> bool:
        return self.gen != self.committed_gen

    def touch(self) -> None:
        self.gen += 1
        self.mtime_ns = self.ctime_ns = now_ns()


@dataclass(slots=True)
class Handle:
    fh: int
    ino: int
    ident: Identity  # who opened it: writes by a non-root opener drop setuid/setgid
    readable: bool
    writable: bool
    append: bool
    ofile: OpenFile


@dataclass(frozen=True, slots=True)
class Change:
    """What an object-door operation changed, for doors that cache (the FUSE kernel cache):
    the content or attributes of ``ino``, and/or the entry ``name`` in directory ``parent``."""

    ino: int | None = None
    parent: int | None = None
    name: bytes | None = None


@dataclass(frozen=True, slots=True)
class StatFs:
    f_bsize: int
    f_frsize: int
    f_blocks: int
    f_bfree: int
    f_bavail: int
    f_files: int
    f_ffree: int
    f_favail: int
    f_namemax: int


class NamespaceBase:
    """State and helpers every part of the namespace uses."""

    def __init__(self, meta: MetaStore, hot: HotDir, umask: int,
                 placement: Placement) -> None:
        self.meta = meta
        self.hot = hot
        self.smalllog = SmallLog(meta, hot)
        self.garbage = Garbage(meta, hot, self._placement_forget)
        #: numbers with data files made ahead, for creates the kernel writes (files.py)
        self.spares = Spares(meta, hot)
        self.bucket_config = BucketConfig(meta)
        # inodes whose size is being changed (files.FileOps._set_size): writes wait
        self._resizing: dict[int, asyncio.Future[None]] = {}
        self.umask = umask
        # data lives once in cold, the system of record, and hot caches blocks
        # (docs/placement.md)
        self.placement = placement
        placement.busy = self._open_dirty
        placement.unsettled = self._open_unsettled
        self._open: dict[int, OpenFile] = {}
        self._handles: dict[int, Handle] = {}
        self._next_fh = 1
        #: inode numbers reserved for PUTs over a shared engine (objects.ObjectOps._alloc_ino)
        self._inos: collections.deque[int] = collections.deque()
        self._closed = False
        self._subscribers: list[Callable[[Change], Notified]] = []
        # entries of directories an object call created (implicit prefixes, markers),
        # reported with the call's own changes by the next _notify
        self._created: list[Change] = []

    def subscribe(self, callback: Callable[[Change], Notified]) -> None:
        """Call ``callback`` (synchronously, on the loop; it must not block) after every
        change made through the object calls (put/delete/copy/multipart), so a door that
        caches (FUSE) can invalidate what it cached.  It may return an awaitable: the call
        answers its client once that is done (or after :data:`ANNOUNCE_WAIT` s), so what
        a client changed through one door is what the other shows when it has the answer
        -- the FUSE door's kernel notifications are sent by a thread of their own."""
        self._subscribers.append(callback)

    def unsubscribe(self, callback: Callable[[Change], Notified]) -> None:
        """Stop calling ``callback`` (a door that closes: a mount that is unmounted)."""
        with contextlib.suppress(ValueError):
            self._subscribers.remove(callback)

    def _dir_created(self, parent: int, name: bytes) -> None:
        """Inside the transaction that linked a new directory for an object call: report
        its entry with the call's changes, so a door that caches missing names (a FUSE
        negative entry) learns that the name now exists."""
        if self._subscribers:
            self._created.append(Change(parent=parent, name=name))

    def _take_created(self) -> list[Change]:
        """The entries :meth:`_dir_created` reported so far, taken at the end of the
        transaction's body: over PostgreSQL other calls run while its commit is in flight,
        and their notifications must not announce directories not yet committed."""
        created, self._created = self._created, []
        return created

    def _notify(self, *changes: Change) -> list[Awaitable[None]]:
        """Tell every subscriber of ``changes``; what their answers say to wait for."""
        if self._created:  # (a transaction that failed after creating them: harmless)
            changes = (*self._created, *changes)
            self._created = []
        waits: list[Awaitable[None]] = []
        for cb in self._subscribers:
            for ch in changes:
                try:
                    w = cb(ch)
                except Exception:
                    log.exception("change subscriber failed")
                    continue
                if w is not None:
                    waits.append(w)
        return waits

    async def _announce(self, *changes: Change) -> None:
        """:meth:`_notify` from an object call, which answers its client only once the
        subscribers are done with the changes (see :meth:`subscribe`): an S3 DELETE then a
        ``stat`` through the mount found the kernel's cached entry now and then (CI)."""
        waits = self._notify(*changes)
        if not waits:
            return
        _, late = await asyncio.wait([asyncio.ensure_future(w) for w in waits],
                                     timeout=ANNOUNCE_WAIT)
        if late:
            log.warning("%d change notifications not done after %.1f s (the kernel waits "
                        "for a request on the same directory?); answering anyway",
                        len(late), ANNOUNCE_WAIT)

    # -- attributes ------------------------------------------------------------------------
    def _live(self, inode: Inode) -> Inode:
        """``inode`` with the size and times of unflushed writes applied."""
        of = self._open.get(inode.ino)
        if of is not None and of.external:
            self._external_look(of)  # what the kernel wrote since (fuse/kpass.py)
        if of is None or not of.dirty:
            return inode
        # the committed ETag describes older bytes: unknown until the next commit
        return dataclasses.replace(
            inode, size=of.size, mtime_ns=of.mtime_ns, ctime_ns=of.ctime_ns, etag=""
        )

    @staticmethod
    def _get(tx: MetaTxn, ino: int) -> Inode:
        inode = tx.get_inode(ino)
        if inode is None:
            raise FsError(errno.ENOENT, f"inode {ino} does not exist")
        return inode

    def _dir(self, tx: MetaTxn, ino: int) -> Inode:
        inode = self._get(tx, ino)
        if not inode.is_dir:
            raise FsError(errno.ENOTDIR, f"inode {ino} is not a directory")
        return inode

    def _child(self, tx: MetaTxn, ident: Identity, parent: Inode, name: bytes) -> Inode | None:
        """The inode named ``name`` in directory ``parent`` (search permission checked), or
        None.  "." and ".." resolve as on any POSIX file system."""
        check_access(ident, parent, X_OK, f"directory inode {parent.ino}")
        if name == b".":
            return parent
        if name == b"..":
            return self._get(tx, parent.parent or ROOT_INO)
        check_name(name)
        entry = tx.lookup(parent.ino, name)
        if entry is None:
            return None
        return tx.get_inode(entry.ino)

    @staticmethod
    def _touch_dir(tx: MetaTxn, directory: Inode, nlink_delta: int = 0) -> None:
        directory.mtime_ns = directory.ctime_ns = now_ns()
        directory.nlink += nlink_delta
        tx.put_inode(directory)

    def _new_inode(
        self, tx: MetaTxn, ident: Identity, pdir: Inode, mode: int, *, ino: int = 0,
        **kw: Any,
    ) -> Inode:
        """A new inode owned by the caller; a setgid parent passes on its group (and, to
        directories, the setgid bit) as on Linux (:func:`tierd.acl.modes.created_mode_gid`)."""
        t = now_ns()
        mode, gid = created_mode_gid(ident, pdir, mode)
        inode = Inode(
            ino=ino or tx.next_ino(),
            mode=mode,
            uid=ident.uid,
            gid=gid,
            atime_ns=t,
            mtime_ns=t,
            ctime_ns=t,
            btime_ns=t,
            **kw,
        )
        tx.new_inode(inode.ino, stat.S_ISDIR(mode))  # the engine's cache may know it empty
        return inode

    async def _alloc_ino(self) -> int:
        """A fresh inode number for a PUT; over PostgreSQL (a write transaction there waits
        for the cluster's lock) reserved INO_BATCH at a time, unused ones never reused."""
        if not self.meta.engine.remote:
            async with self.meta.awrite() as tx:
                return tx.next_ino()
        while not self._inos:
            async with self.meta.awrite() as tx:
                self._inos.extend(tx.reserve_inos(INO_BATCH))
        return self._inos.popleft()

    # -- open files ------------------------------------------------------------------------
    def _handle(self, fh: int) -> Handle:
        h = self._handles.get(fh)
        if h is None:
            raise FsError(errno.EBADF, f"file handle {fh} is not open")
        return h

    def _attach(
        self, inode: Inode, ident: Identity, readable: bool, writable: bool, append: bool
    ) -> int:
        of = self._open.get(inode.ino)
        if of is None:
            of = OpenFile(inode.ino, functools.partial(self.hot.pin, inode.ino),
                          inode.size, mtime_ns=inode.mtime_ns,
                          ctime_ns=inode.ctime_ns, committed_size=inode.size,
                          unnamed=inode.nlink == 0)  # (an orphan opened again by number)
            self._open[inode.ino] = of
        of.refs += 1
        fh = self._next_fh
        self._next_fh += 1
        of.privs = has_privs(inode.mode)
        self._handles[fh] = Handle(fh, inode.ino, ident, readable, writable, append, of)
        return fh

    def _forget_data(self, ino: int) -> None:
        """Drop a file's bytes once nothing names or holds it: called after the commit that
        deleted the inode and wrote its ``G`` key; the file goes once that commit is
        durable (:mod:`tierd.namespace.garbage`).  A handle may hold it still: over
        PostgreSQL an open reads a snapshot while the delete's commit is in flight (the
        delete saw no handle); its bytes then go at the handle's last release."""
        of = self._open.get(ino)
        if of is not None:
            of.dropped = True
            return
        self.garbage.add(ino)

    def _placement_forget(self, ino: int) -> None:
        self.placement.forget(ino)

    # -- placement hooks -------------------------------------------------------------------
    def _external_look(self, of: OpenFile, wrote: bool = False) -> None:
        """While the kernel writes ``of``'s hot file itself (FUSE write passthrough,
        ``of.external``): its size and mtime become the live ones, and ``wrote``, or a
        size, mtime or ctime changed since the last look, counts as a write (a new content
        version at the next commit) -- except on a file committed empty and empty still:
        a write extends it, a store through a mapping cannot reach past its end, a
        truncate is a setattr the namespace sees, so closing a file created and left empty
        commits nothing.  While the namespace changes the size itself (``_set_size``: the
        new size committed and made durable before the hot file is cut) the hot file's
        size is not the file's: the look counts a write but takes nothing from it, and
        the first look after the cut takes it all (tests/namespace/
        test_passthrough_truncate.py: an ``O_TRUNC`` open racing a writer's release)."""
        seen = _stamp(of.fd)
        if of.committed_size == 0 and seen[0] == 0:
            wrote = False
        changed = seen != of.external_seen
        if wrote or changed:
            of.gen += 1
            of.ctime_ns = now_ns()
        if of.ino in self._resizing:
            return
        if changed and seen[1] != of.external_seen[1]:
            of.mtime_ns = seen[1]  # the kernel's last write (not an explicit utime)
        of.size = seen[0]
        of.external_seen = seen

    def _open_dirty(self, ino: int) -> bool:
        """Unflushed writes in the hot file (or about to be: the intention is being made
        durable): not uploadable, not evictable."""
        of = self._open.get(ino)
        return of is not None and (_unsynced(of) or of.external > 0)

    def _open_unsettled(self, ino: int) -> bool:
        """What the persister asks before and after an upload: :meth:`_open_dirty`, except
        that a file the kernel writes (``of.external``) counts as settled while its hot
        file's (size, mtime, ctime) is the one its last durability point saw.  Busy until
        its last close, such a file -- a log or a checkpoint kept open across fsyncs --
        reached the cold store only at its last close; the WRITE path's writer is uploaded
        after each fsync.  A write the kernel makes during the upload moves the stamp, so
        the round does not leave the queue clean and its ETag is not learned; the next
        flush, fsync or release counts a write whatever it sees, and queues it again.
        Eviction, imports and peers still ask :meth:`_open_dirty`: the kernel may write on."""
        of = self._open.get(ino)
        if of is None or of.external <= 0:
            return of is not None and _unsynced(of)
        return _unsynced(of) or not of.opened or _stamp(of.fd) != of.external_seen

    def _queue(self, tx: MetaTxn, inode: Inode, content: bool = True) -> None:
        """Inside the txn that changed ``inode``'s content (or names): persist it."""
        self.placement.enqueue(tx, inode, content)

    def _names_changed(self, tx: MetaTxn, inode: Inode) -> None:
        self.placement.names_changed(tx, inode)

    async def _ensure(self, ino: int, offset: int, length: int) -> None:
        """Blocks in the range present on hot (read-through from cold)."""
        await self.placement.ensure(ino, offset, length)

    async def _prepare_write(self, ino: int, keep: int) -> None:
        """Before content changes in place: the first ``keep`` bytes must be local (cold
        stores whole objects, so the persister needs all of them anyway), and no fetch may
        land after the change."""
        if keep > 0:
            await self.placement.ensure(ino, 0, keep, touch=False)
        await self.placement.quiesce(ino)

    def _drop_inode(self, tx: MetaTxn, inode: Inode) -> bool:
        """Called when ``inode`` lost its last name: delete it now, or mark it an orphan if
        a handle still holds it.  Returns True when its data must be removed after commit
        (:meth:`_forget_data`; the ``G`` key that says so is written here, in the same
        transaction)."""
        if inode.is_reg:
            self.placement.deleted(tx, inode.ino, held=inode.ino in self._open)
        if inode.ino in self._open:
            self._orphan(tx, inode)
            return False
        tx.delete_inode(inode.ino)
        if inode.is_reg:
            tx.add_garbage(inode.ino)
        return inode.is_reg

    def _orphan(self, tx: MetaTxn, inode: Inode) -> None:
        """``inode`` (nlink 0) becomes an orphan: kept until the last release of the file
        open on it reaps it (marked here, ``OpenFile.unnamed``), or until the next start.
        A mark left by a transaction that aborts costs that release a read, nothing more."""
        tx.put_inode(inode)
        tx.add_orphan(inode.ino)
        if (of := self._open.get(inode.ino)) is not None:
            of.unnamed = True

    async def _commit_open(self, of: OpenFile) -> None:
        raise NotImplementedError  # files.FileOps

    async def _intend(self, of: OpenFile) -> None:
        raise NotImplementedError  # files.FileOps

    async def sync(self) -> None:
        """A durability point for callers outside the namespace (see :meth:`_sync_meta`)."""
        await self._sync_meta()

    async def _sync_meta(self) -> None:
        """A durability point: every metadata change so far is on stable storage after this
        (with group commit, concurrent callers share one flush)."""
        await self.meta.flush()


def _unsynced(of: OpenFile) -> bool:
    """Writes of ``of`` not yet at a durability point (or its intention being made
    durable): its bytes on hot are not a committed version's."""
    return of.dirty or of.synced_gen != of.gen or of.intending is not None


def _stamp(fd: int) -> tuple[int, int, int]:
    """(size, mtime, ctime) of a hot file: what tells a kernel writer's writes."""
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns
