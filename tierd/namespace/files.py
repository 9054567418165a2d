"""Open files: create/open, read/write through handles, flush/fsync/release.

Bytes go to the inode's hot-tier file with ``pread``/``pwrite`` (inline when the page cache
can serve them); sizes and times are committed to metadata at the durability points, where
the data is fsynced first, then the metadata committed and synced, then the caller answered.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import stat

from tierd.acl import R_OK, W_OK, Identity, check_access
from tierd.acl.modes import drop_privs, has_privs, write_drops_privs
from tierd.errors import FsError
from tierd.meta import EMPTY_MD5, ROOT_INO, STATE_DIRTY, Dirent, Inode, MetaTxn
from tierd.meta.atxn import behind
from tierd.meta.reads import create_reads
from tierd.namespace import versions
from tierd.namespace.base import OpenFile, now_ns
from tierd.namespace.contentmeta import forget_content_meta
from tierd.namespace.crashpoint import crashpoint
from tierd.namespace.entries import EntryOps
from tierd.namespace.keepversion import keep_committed
from tierd.namespace.staging import retry_full
from tierd.placement.paths import file_policy
from tierd.tiers import fileio


def _access_mask(flags: int) -> tuple[bool, bool]:
    acc = flags & os.O_ACCMODE
    return acc in (os.O_RDONLY, os.O_RDWR), acc in (os.O_WRONLY, os.O_RDWR)


class FileOps(EntryOps):
    async def create(
        self, ident: Identity, parent: int, name: bytes, mode: int, flags: int,
        umask: int = 0, *, kernel_writes: bool = False,
    ) -> tuple[Inode, int]:
        """Create and open a regular file (open(2) with O_CREAT); ``umask`` (of the caller)
        applies unless the parent has a default ACL.  ``kernel_writes``: the FUSE door
        will ask the kernel to write a new file itself (write passthrough): its
        kernel-marked ``V`` key is committed in the create's transaction
        (:meth:`passthrough_open` then needs no flush)."""
        readable, writable = _access_mask(flags)
        drops: list[int] = []
        intend = kernel_writes and writable and not (self.meta.node or self.meta.engine.remote)
        def reads(tx: MetaTxn) -> None:  # off the loop first (tierd.meta.atxn)
            create_reads(tx, parent, name)
            versions.locate(tx, parent, name)
        # a number whose data file exists, for a file the kernel will write (spares.py)
        # (the same rules as ``intend`` below: the final mode's privileges are the asked ones)
        spare = self.spares.take() if intend and not (
            has_privs(mode) or self.placement.mem_policies()) else 0
        numbered = False  # the body gave the spare's number to an inode
        try:
            async with self.meta.awrite(warm=reads) as tx:
                d = self._dir(tx, parent)
                existing = self._child(tx, ident, d, name) if name not in (b".", b"..") else d
                if existing is None:  # (else nothing is written: the file is only opened)
                    d, inode = self._create_locked(tx, ident, parent, name, mode, umask,
                                                   spare)
                    numbered = bool(spare)
                    drops = versions.supersede(self, tx, d, name, None, inode, stamp=True)
                    tx.put_inode(inode)
                    tx.add_dirent(parent, name, Dirent(inode.ino, stat.S_IFREG))
                    self._touch_dir(tx, d)
                    self._queue(tx, inode)  # an empty object is an object too
                    intend = intend and not has_privs(inode.mode) and not (
                        self.placement.wants_mem(tx, inode.ino))
                    if intend:
                        tx.add_intent(inode.ino, kernel=True)
        except BaseException:
            if numbered:  # the commit may have happened: never handed out again
                self.spares.doubt(spare)
            else:
                self.spares.give_back(spare)
            raise
        if existing is not None:
            self.spares.give_back(spare)
            if flags & os.O_EXCL:
                raise FsError(errno.EEXIST, f"{name.decode(errors='replace')!r} exists")
            if existing.is_dir:
                raise FsError(errno.EISDIR, f"{name.decode(errors='replace')!r} is a "
                              "directory")
            return existing, await self.open(ident, existing.ino, flags & ~os.O_CREAT)
        for gone in drops:  # a null version this one replaced (suspended versioning)
            self._forget_data(gone)
        fh = self._attach(inode, ident, readable, writable, bool(flags & os.O_APPEND))
        if intend:
            of = self._handles[fh].ofile
            of.intent = of.kernel_intent = True
        return inode, fh

    def _create_locked(self, tx: MetaTxn, ident: Identity, parent: int, name: bytes,
                       mode: int, umask: int, ino: int) -> tuple[Inode, Inode]:
        """The parent and the new regular file's inode (numbered ``ino``, or the counter's
        next), after the checks of every create."""
        d = self._creatable(tx, ident, parent, name)
        if parent == ROOT_INO:
            raise FsError(errno.EPERM, "the namespace root holds only buckets (directories)")
        inode = self._new_inode(tx, ident, d, stat.S_IFREG | (mode & 0o7777), ino=ino,
                                etag=EMPTY_MD5)
        self._inherit_acl(inode, d, umask)
        return d, inode

    async def open(self, ident: Identity, ino: int, flags: int) -> int:
        fh, _ = await self.open_file(ident, ino, flags)
        return fh

    async def open_file(self, ident: Identity, ino: int, flags: int) -> tuple[int, Inode]:
        """:meth:`open`, with the inode as the handle sees it (after ``O_TRUNC``): the
        FUSE door decides from its version whether the kernel's cached pages still hold."""
        readable, writable = _access_mask(flags)
        while True:
            async with self.meta.asnapshot(fresh=True) as tx:  # after an unlink's commit
                inode = self._get(tx, ino)
                # over PostgreSQL a commit of this node (an unlink, a truncate) may have
                # landed while this snapshot's begin was in a thread: the handle must not
                # start from what it replaced
                stale = behind(self.meta, tx)
            if (busy := self._resizing.get(ino)) is not None and self.meta.engine.remote:
                await asyncio.shield(busy)  # a truncate of the closed file is under way
            elif not stale:
                break
        if inode.is_dir:
            if writable or flags & os.O_TRUNC:
                raise FsError(errno.EISDIR, f"inode {ino} is a directory")
        elif not inode.is_reg:
            raise FsError(errno.ENXIO if not inode.is_lnk else errno.ELOOP,
                          f"inode {ino} is not a regular file")
        mask = (R_OK if readable else 0) | (W_OK if writable or flags & os.O_TRUNC else 0)
        check_access(ident, inode, mask, f"inode {ino}")
        if inode.is_dir:
            raise FsError(errno.EISDIR, "open directories with listdir, not open")
        fh = self._attach(inode, ident, readable, writable, bool(flags & os.O_APPEND))
        if flags & os.O_TRUNC:  # like do_truncate(): times and set-ID bits even at size 0
            try:
                await self._set_size(ino, 0, drop=write_drops_privs(ident, inode.mode))
            except BaseException:
                await self.release(fh)
                raise
            async with self.meta.asnapshot() as tx:
                inode = self._get(tx, ino)
        return fh, self._live(inode)

    async def read(self, fh: int, offset: int, size: int) -> bytes | bytearray:
        """Bytes of an open file; a ``bytearray`` when that saves a copy (read-only use)."""
        h = self._handle(fh)
        if not h.readable:
            raise FsError(errno.EBADF, "file handle was not opened for reading")
        if offset < 0:
            raise FsError(errno.EINVAL, "negative offset")
        end = min(h.ofile.size, offset + size)
        if end <= offset:
            return b""
        # from hot, or from warm for blocks only warm holds (docs/placement.md)
        data = await self.placement.read(h.ino, offset, end - offset)
        if len(data) < end - offset:  # a hole past the data file's end reads as zeros
            data += bytes(end - offset - len(data))
        return data

    async def write(self, fh: int, offset: int, data: bytes | memoryview) -> int:
        h = self._handle(fh)
        if not h.writable:
            raise FsError(errno.EBADF, "file handle was not opened for writing")
        of = h.ofile
        if h.append:
            offset = of.size
        if offset < 0:
            raise FsError(errno.EINVAL, "negative offset")
        n = len(data)
        if n == 0:
            return 0
        while (resizing := self._resizing.get(of.ino)) is not None:
            await asyncio.shield(resizing)  # a truncate cuts committed bytes once durable
        if not of.dirty:
            # first write since the last commit: backpressure, and the old content local
            await self.placement.admit(n)
            await self._prepare_write(of.ino, of.size)
        if not of.opened:  # a new file's data file is made off the loop (LocalTier.apin)
            await of.open_async(self.hot.apin)
        # Each await below lets other coroutines run (over PostgreSQL a transaction's begin
        # and commit leave the loop): an fsync's commit may settle the file meanwhile and
        # drop its in-place intention.  So both conditions are checked again after every
        # await, and the bytes change only once neither needs one, with no await between.
        while True:
            if of.privs and not h.ident.is_root:
                await self._drop_privs(of)
            elif offset < of.committed_size and not of.intent:
                await self._intend(of)  # bytes a committed version names change in place
            else:
                break
        if offset > of.size:
            self._cut_stale(of.fd, of.size)  # the gap must read as zeros
        # claim the range synchronously so later writes see the new size
        old_size = of.size
        of.size = max(of.size, offset + n)
        of.touch()
        try:  # a full hot tier evicts clean data and the write is tried again
            await retry_full(self.placement, n, lambda: fileio.pwrite(of.fd, data, offset))
        except OSError:
            # ENOSPC/EIO: do not leave a size that promises bytes that were never written
            if of.size == offset + n and old_size < of.size:
                of.size = max(old_size, os.fstat(of.fd).st_size)
            raise
        crashpoint("write.done")
        return n

    async def flush(self, fh: int) -> int | None:
        """close(2) of a descriptor: the design's durability point for FUSE writers.
        The content version this call committed (None when it had nothing to commit)."""
        of = self._handle(fh).ofile
        return await self._durable_version(of) if await self._durable(of) else None

    async def fsync(self, fh: int, datasync: bool = False) -> int | None:
        """fsync(2): the writes and the file's metadata durable -- its existence too, as on
        ext4, when nothing was written (a new file's create may not be flushed yet: a
        passthrough CREATE waits for no flush).  A flush with nothing pending costs no I/O."""
        of = self._handle(fh).ofile
        if await self._durable(of):
            return await self._durable_version(of)
        await self._sync_meta()
        return None

    async def _durable_version(self, of: OpenFile) -> int | None:
        """After :meth:`_durable` made ``of``'s writes durable: the content version they
        are, as the door's kernel cache records it for the pages the writer left.  The
        version the open file's last commit wrote (``committed_version``): over PostgreSQL
        a read after the commit cost every close of a written file a read transaction, and
        it could return a newer version another door committed meanwhile, whose bytes those
        pages do not hold.  Read only when no content commit went through this open
        file (a durability point that only removed an intention over unwritten bytes)."""
        if of.committed_version:
            return of.committed_version
        async with self.meta.asnapshot() as tx:
            inode = tx.get_inode(of.ino)
        return None if inode is None else inode.version

    async def release(self, fh: int) -> int | None:
        h = self._handles.pop(fh, None)
        if h is None:
            raise FsError(errno.EBADF, f"file handle {fh} is not open")
        of = h.ofile
        version = None
        try:
            if ((of.dirty or of.synced_gen != of.gen or of.intent)
                    and await self._durable(of)):
                version = await self._durable_version(of)
        finally:
            of.refs -= 1
            if of.refs == 0 and self._open.get(of.ino) is of:
                del self._open[of.ino]
                of.close_fd()
                if of.dropped:  # deleted while it was open (see _forget_data)
                    self.garbage.add(of.ino)
                elif of.unnamed or self.meta.engine.remote:
                    await self._reap_if_orphan(of.ino)
        return version

    async def _reap_if_orphan(self, ino: int) -> None:
        """After the last handle of ``ino`` went, when it may have lost its last name
        meanwhile (``OpenFile.unnamed``; over a shared engine, always): delete it if it has
        no name left.  A read first: nearly every such close finds names over a shared
        engine, and a snapshot is cheaper than a write transaction (over PostgreSQL a
        writer also waits for the cluster's lock)."""
        if self.meta.engine.remote:
            # (bounded: over PostgreSQL the node's cache answers while the change feed is
            # current, as it is for a file no node unlinked: no read at all, pg_quiet)
            async with self.meta.asnapshot(warm=lambda tx: tx.get_inode(ino),
                                           bounded=True) as tx:
                inode = tx.get_inode(ino)
        else:
            with self.meta.snapshot() as tx:  # a point read: no thread, no wait
                inode = tx.get_inode(ino)
        if inode is None or inode.nlink > 0:
            return
        async with self.meta.awrite() as tx:
            inode = tx.get_inode(ino)
            if inode is None or inode.nlink > 0:
                return
            if ino in self._open:  # opened again while this waited for its begin
                return
            tx.delete_inode(ino)
            tx.add_garbage(ino)
        self._forget_data(ino)

    async def _intend(self, of: OpenFile) -> None:
        """Before the first in-place change of committed bytes since the last durable
        point: the inode's ``V`` key, durable (concurrent writers share one flush).  A
        crash from here until the commit that removes it gives the file a new version at
        start (``Namespace._recover``): never the old version's ETag over new bytes."""
        if of.intending is None:
            of.intending = asyncio.ensure_future(self._write_intent(of))
        await asyncio.shield(of.intending)

    async def _write_intent(self, of: OpenFile) -> None:
        try:
            await keep_committed(self, of.ino)  # a versioned bucket keeps the old bytes
            async with self.meta.awrite() as tx:
                tx.add_intent(of.ino)
            crashpoint("write.intent")
            await self._sync_meta()
            of.intent = True
            crashpoint("write.intended")
        finally:
            of.intending = None

    async def _durable(self, of: OpenFile) -> bool:
        """Data fsynced, then size/version/ETag committed (and the in-place intention
        removed, when no write came in meanwhile), then metadata synced; False when
        there was nothing to make durable."""
        gen = of.gen
        if of.synced_gen == gen and (not of.intent or of.external):
            return False  # nothing new (the kernel's writers keep their intention)
        if of.synced_gen == gen and of.size == 0 == of.committed_size:
            # an intention over no bytes (a file created for the kernel to write, left
            # empty): its removal needs no flush -- a crash that keeps it only gives the
            # empty file a new version at start
            async with self.meta.awrite() as tx:
                if of.gen == gen and not of.external:
                    tx.remove_intent(of.ino)
                    of.intent = False
            return False
        if of.opened:  # else nothing was written through it
            await asyncio.to_thread(os.fdatasync, of.fd)
        crashpoint("durable.synced")
        if of.committed_gen < gen:
            await self._commit_open(of, synced=gen)
        elif of.intent and of.gen == gen and not of.external:
            async with self.meta.awrite() as tx:
                if of.gen == gen:  # (a write came while this began: it keeps the intent)
                    tx.remove_intent(of.ino)
                    # off before the commit returns: a write meanwhile takes a new one
                    of.intent = False
        crashpoint("durable.committed")
        await self._sync_meta()
        of.synced_gen = max(of.synced_gen, gen)
        await self._write_through(of.ino)
        return True

    async def _write_through(self, ino: int) -> None:
        """Under a write-through policy the durability point waits for cold."""
        p = self.placement
        if not any(q.mode == "write-through" for q in p.policies.values()):
            return
        async with self.meta.asnapshot() as tx:
            policy = file_policy(tx, ino, p.policy_for)
        if policy is not None and policy.mode == "write-through":
            await p.wait_persisted(ino)

    async def _drop_privs(self, of: OpenFile) -> None:
        """A write by an unprivileged caller clears setuid (and setgid with group exec)."""
        async with self.meta.awrite() as tx:
            inode = self._get(tx, of.ino)
            if has_privs(inode.mode):
                inode.mode = drop_privs(inode.mode)
                inode.ctime_ns = now_ns()
                tx.put_inode(inode)
        of.privs = False

    async def _commit_open(self, of: OpenFile, synced: int = -1) -> None:
        """Record an open file's live size and a new content version (no fsync).
        ``synced``: the data file was fsynced at that generation; if no write came in
        since, the commit also removes the in-place intention (its bytes are now the
        recorded version's).

        The ETag is left unknown (``""``) unless the file is empty: hashing every byte as it
        is written competed with the writer for the CPU (a sequential writer ran at half
        speed on two cores).  It is computed when first asked for (:meth:`etag`: S3 HEAD,
        GET, listings, conditions) or by the persister, whose upload reads the bytes anyway
        and records the MD5 with the cold record if the version is still this one."""
        async with self.meta.awrite() as tx:
            # the open file as it is now that the transaction began (writes may have come
            # while it waited for the database's lock)
            gen = of.gen
            etag = EMPTY_MD5 if of.size == 0 else ""
            settled = of.intent and gen == synced and not of.external
            inode = tx.get_inode(of.ino)
            if inode is None:
                return
            inode.size = of.size
            inode.mtime_ns, inode.ctime_ns = of.mtime_ns, of.ctime_ns
            inode.version = tx.next_version()
            forget_content_meta(inode)
            inode.etag = etag
            inode.state = STATE_DIRTY
            tx.put_inode(inode)
            self._queue(tx, inode)
            if settled:
                tx.remove_intent(of.ino)
                of.intent = False  # before the commit returns: a write meanwhile takes a
                # new intention, which waits for this commit (the writers' lock)
            # a write below this size changes bytes the new version names: from now on it
            # needs an intention (a failed commit leaves a larger value: one intention more)
            of.committed_size = max(of.committed_size, inode.size)
        of.committed_gen = max(of.committed_gen, gen)
        of.committed_size = inode.size
        of.committed_version = inode.version

    async def etag(self, ino: int) -> str:
        """The MD5 ETag of a file, computed (in a thread) and cached when it is unknown
        (FUSE writes leave it so: :meth:`_commit_open`).  A file changed meanwhile gets the
        hash of its new version.  The bytes are brought to hot first and held there while
        hashed (a clean file may have been evicted, or be another node's)."""
        while True:
            async with self.meta.asnapshot() as tx:
                inode = self._get(tx, ino)
            of = self._open.get(ino)
            if of is not None and of.external:
                self._external_look(of)  # what the kernel wrote since (fuse/kpass.py)
            if of is not None and of.dirty:
                await self._commit_open(of)
                continue
            if inode.etag or not inode.is_reg:
                return inode.etag
            with self.placement.hold(ino):
                if inode.size:
                    await self.placement.ensure(ino, 0, inode.size, touch=False)
                digest = await asyncio.to_thread(self._hash_file, ino, inode.size)
            of = self._open.get(ino)
            if of is not None and of.external:
                self._external_look(of)
            if of is not None and of.dirty:
                continue  # written while hashed: commit and hash the new version
            async with self.meta.awrite() as tx:
                cur = self._get(tx, ino)
                if cur.version != inode.version:
                    continue
                cur.etag = digest
                tx.put_inode(cur)
            return digest

    def _hash_file(self, ino: int, size: int) -> str:
        """MD5 of the first ``size`` bytes (what the version holds: a crash may leave bytes
        past it in the data file; a sparse tail reads as zeros)."""
        h = hashlib.md5()
        fd = self.hot.open(ino)
        try:
            pos = 0
            while pos < size:
                chunk = os.pread(fd, min(4 << 20, size - pos), pos)
                if not chunk:
                    chunk = bytes(min(4 << 20, size - pos))
                h.update(chunk)
                pos += len(chunk)
        finally:
            os.close(fd)
        return h.hexdigest()

