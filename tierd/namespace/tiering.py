"""The namespace's calls for doors that care where bytes live: read advice, staging files,
whole-file reads held against eviction, persistence waits, the cold store's copy, and the
memory pool's quota records.

The FUSE door's read-ahead, the checkpoint service and the memory door used to reach for
the namespace's handle table, its hot directory, its placement engine and its metadata store
themselves.  They call these instead, so that the data files, the placement engine and the
store stay behind :class:`tierd.namespace.api.NamespaceAPI` and can change without the
doors noticing (``tests/test_layering.py`` keeps it so).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator

from tierd.namespace import versions
from tierd.namespace.base import NamespaceBase, OpenFile

#: free bytes the hot file system keeps for writes the kernel passes through (at most 1/8
#: of the hot tier): they are never admitted first, and ENOSPC goes to the writer; below
#: twice this, clean data is evicted back to twice this (docs/fuse.md, "Write passthrough")
PT_HEADROOM = 1 << 30


def _willneed(fd: int, offset: int, length: int) -> None:
    with contextlib.suppress(OSError):  # the handle was closed meanwhile: nothing to do
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)


def _ignore_result(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


class TieringOps(NamespaceBase):
    #: :func:`versions.marks` when a passthrough open last saw no bucket ever versioned
    #: (-1: not seen yet); :meth:`_pt_refused` skips its snapshot while it is current
    _unversioned_at = -1

    # -- open files ------------------------------------------------------------------------
    def advise_read(self, fh: int, offset: int, length: int) -> None:
        """Ask the hot data file of open file ``fh`` to read ``[offset, offset+length)``
        ahead (``POSIX_FADV_WILLNEED``, in a thread: it may block while submitting the
        I/O); fire and forget, nothing when ``fh`` is not open."""
        h = self._handles.get(fh)
        if h is None:
            return
        fd = h.ofile.fd
        task = asyncio.get_running_loop().run_in_executor(None, _willneed, fd, offset, length)
        task.add_done_callback(_ignore_result)

    def hot_fd(self, fh: int) -> int | None:
        """The descriptor of open file ``fh``'s hot data file when the whole file is on hot
        (the kernel's read passthrough can serve it), else None.  Also None when the hot
        file is not exactly the file's size: a crash can leave bytes past the committed size,
        which a reader served from the hot file would see.  It stays the namespace's: valid
        until the handle's release, never to be closed by the caller."""
        h = self._handles.get(fh)
        if h is None or not self.placement.hot_complete(h.ino):
            return None
        try:
            if os.fstat(h.ofile.fd).st_size != h.ofile.size:
                return None
        except OSError:
            return None
        return h.ofile.fd

    # -- kernel write passthrough (the FUSE door) ------------------------------------------
    async def passthrough_open(self, fh: int, join: bool = False) -> int | None:
        """For handle ``fh`` opened for writing: the hot data file's descriptor when the
        kernel may write it directly, else None (the handle keeps the normal write path).

        Writes the kernel passes through never reach :meth:`write`, so what a write below
        the committed size does first is done here, once, for every write to come: the
        whole content local, a versioned bucket's committed version kept, the ``V``
        intention durable (``files.FileOps._intend``).  Until :meth:`passthrough_close`
        the intention stays (no durability point removes it) and the file counts as being
        written: the persister does not upload it, nothing evicts it, no peer reads it.
        Refused: files not whole on hot or whose hot file is not exactly their size, the
        memory tier's files (the pool's copy would go stale), a cluster's files (other
        nodes learn of changes from commits the kernel's writes would not make), files with
        set-id bits (a write by another user must clear them, and no write is seen) --
        unless ``join``: passthrough readers already hold the inode (the bits, the
        memory-tier policy or the bucket's versioning were set while they were open), the
        kernel lets no other writer in, and the door clears the bits after the kernel's
        writes as it does for a chmod made while writers are open (fuse/files.py
        ``pt_watch_privs``), rather than the open failing ``ETXTBSY``.  A joining writer
        of a versioned file keeps the version committed before it opened (``_intend``
        above); the states its own fsyncs commit are not kept as versions of their own,
        as they are on the WRITE path (:meth:`_pt_refused`)."""
        h = self._handles.get(fh)
        if h is None or not h.writable:
            return None
        of = h.ofile
        if of.external:  # the kernel writes it already: one more writer
            of.external += 1
            return of.fd
        fresh, of.kernel_intent = of.kernel_intent and of.intent, False
        if await self._pt_refused(of, join):
            return None
        st = os.fstat(await of.open_async(self.hot.apin))
        if st.st_size != of.size:
            return None
        await self.passthrough_room()  # clean data out first, as a WRITE would evict it
        of.external_seen = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        of.external += 1  # busy from here: nothing uploads or evicts it meanwhile
        try:
            await self._prepare_write(of.ino, of.size)
            if fresh:
                # a file this handle created: its kernel-marked ``V`` key was committed
                # with the create, in one transaction (files.FileOps.create), so no flush
                # is needed -- a crash keeps both (the start detaches the data file) or
                # neither (the file never existed; its data file, under a number the
                # start never hands out again, is removed as no inode's: ``load``)
                return of.fd
            if of.committed_size and not of.intent:
                await self._intend(of)  # what the WRITE path does first: keep the old
            # and, whatever intention there is, one marked as the kernel's: a process may
            # go on writing through the kernel after this daemon died, and the next start
            # gives the files with such a ``V`` key a data file of their own
            # (``Namespace._recover``), out of that writer's reach
            async with self.meta.awrite() as tx:
                tx.add_intent(of.ino, kernel=True)
            await self._sync_meta()
            of.intent = True
        except BaseException:
            of.external -= 1
            raise
        return of.fd

    async def _pt_refused(self, of: OpenFile, join: bool = False) -> bool:
        """Whether the kernel must not write ``of``'s hot file itself: files not whole on
        hot, a cluster node's files, set-id files, the memory tier's files (the reasons in
        :meth:`passthrough_open`), and files of a bucket whose versioning was ever set: in
        an ``Enabled`` bucket every commit's version is kept before the next in-place
        write changes its bytes (:mod:`tierd.namespace.keepversion`, at the WRITE path's
        first write after each commit), and the kernel's writes pass no such point (a
        ``Suspended`` bucket may be enabled while a writer is open).  ``join``: see
        :meth:`passthrough_open`; it lifts the set-id, memory-tier and versioning refusals,
        where the writer would otherwise wait for the readers and fail ``ETXTBSY``."""
        if self.meta.node or self.meta.engine.remote or (of.privs and not join):
            return True
        if of.size and not self.placement.hot_complete(of.ino):  # (empty: nothing to
            return True  # fetch, and no metadata read for each new file a create opens)
        mem = self.placement.mem_policies()
        marks = versions.marks()
        if not mem and self._unversioned_at == marks:
            # no bucket was versioned when last looked, and no mark committed since (one
            # node: every mark is this process's, counted after its commit): no snapshot
            # on every passthrough open of a store that never used versioning
            return False
        async with self.meta.asnapshot() as tx:
            if not versions.in_use(tx):
                self._unversioned_at = marks
            elif versions.configured(tx, of.ino) and not join:
                return True
            # a memory-tier file's writer joins readers already passing through: the
            # pool keeps a copy of the committed version only (each commit drops it, and
            # none is made while the kernel writes the file: Placement.busy)
            return mem and not join and self.placement.wants_mem(tx, of.ino)

    async def passthrough_readable(self, fh: int) -> bool:
        """For read-only handle ``fh``, with write passthrough on: whether a writer of the
        file could pass through too.  While an inode has passthrough readers every writer
        of it must be passthrough with the same backing file, or it waits for them and
        fails ``ETXTBSY`` (the kernel's I/O modes, fuse/kpass.py); so a file whose writers
        :meth:`passthrough_open` would refuse is not read through the kernel either."""
        h = self._handles.get(fh)
        return h is not None and not await self._pt_refused(h.ofile)

    def passthrough_sync(self, fh: int, wrote: bool = True) -> None:
        """The kernel may have written handle ``fh``'s hot file: its size and mtime become
        the live ones; ``wrote`` (flush, fsync, a truncate), or a size, mtime or ctime seen
        to change since the last look: count it as a write (a new content version at the
        next durability point; flush and fsync count one whatever they see, since a coarse
        clock may not tell)."""
        h = self._handles.get(fh)
        if h is None or not h.ofile.external:
            return
        # (a change seen: getattr overlays the live size of a file being written)
        self._external_look(h.ofile, wrote)

    async def passthrough_room(self) -> int:
        """Headroom on the hot file system for writes the kernel passes through: below
        twice :data:`PT_HEADROOM` (at most 1/8 of the tier) free -- a ``statvfs``, a few
        microseconds, on the loop -- clean data is evicted as before a WRITE
        (``Placement.room_for_write``: the watermarks, and the bytes free on the file
        system) back to twice it.  The bytes evicted.  Called at a writable passthrough
        open and by the door while such a writer is open (fuse/ptspace.py): the kernel's
        writes are seen only once they are made."""
        p = self.placement
        want = min(PT_HEADROOM, p.hotc.capacity // 8)
        if p.hot.fs_free() >= 2 * want:
            return 0
        return await p.room_for_write(2 * want)  # (in one batch, to the watermarks too)

    def passthrough_close(self, fh: int) -> None:
        """The kernel writes no more through ``fh`` (before its release, after a
        :meth:`passthrough_sync`): the release's commit may remove the intention."""
        h = self._handles.get(fh)
        if h is not None and h.ofile.external > 0:
            h.ofile.external -= 1

    # -- files written outside the namespace, then published ----------------------------
    def staging_file(self) -> tuple[str, int]:
        """A new empty file in the hot tier's staging area, (path, O_RDWR descriptor): the
        caller fills and fsyncs it, then publishes it with ``put_file`` (or unlinks it)."""
        return self.hot.new_temp()

    @contextlib.contextmanager
    def publishing(self, prefix: str) -> Iterator[None]:
        """Files under ``prefix`` (``bucket/key-prefix/``) are written only to be renamed:
        the persister leaves them alone until the block ends (one upload, under the final
        key)."""
        with self.placement.publishing(prefix):
            yield

    # -- whole files held on hot ---------------------------------------------------------
    async def open_held(self, ino: int) -> tuple[int, str]:
        """A read-only descriptor of regular file ``ino``, whole on hot, and where its bytes
        were (``hot``, or ``cold`` when they were read back first).  The file is held
        against eviction until :meth:`release_held`; the caller closes the descriptor."""
        async with self.meta.asnapshot() as tx:
            size = self._live(self._get(tx, ino)).size
        p = self.placement
        where = "hot"
        p.acquire(ino)
        try:
            if not p.hot_complete(ino):
                where = "cold"
                await p.ensure(ino, 0, size, touch=False)
            fd = os.open(self.hot.path(ino), os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            p.release(ino)
            raise
        return fd, where

    def hold(self, ino: int) -> None:
        """Keep the file's bytes on hot (no eviction) until :meth:`release_held`."""
        self.placement.acquire(ino)

    def release_held(self, ino: int) -> None:
        """Let go of one hold that :meth:`open_held` or :meth:`hold` took."""
        self.placement.release(ino)

    async def evict_hot(self, ino: int) -> None:
        """Drop the file's bytes from hot when cold has them (a retention pass: no demotion
        to warm)."""
        await self.placement.evict_file(ino, "hot", demote=False)

    # -- persistence -----------------------------------------------------------------------
    async def wait_persisted(self, ino: int) -> None:
        """Return once the file's current content is in cold."""
        await self.placement.wait_persisted(ino)

    def all_persisted(self, inos: list[int]) -> bool:
        """Whether ``inos`` is not empty and none of them waits for the persister (read from
        the store's queue: true after a restart too)."""
        with self.meta.snapshot() as tx:
            return bool(inos) and all(tx.queued(i) is None for i in inos)

    # -- the cold store's copy -------------------------------------------------------------
    async def cold_size(self, key: str) -> int | None:
        """The size of ``bucket/key`` in the cold store (written there by any node), or None
        when it has no such object."""
        info = await self.placement.cold.head(key)
        return None if info is None else info.size

    async def cold_read(self, key: str, offset: int, length: int) -> bytes:
        """Bytes of ``bucket/key`` as the cold store has them (a small object: a manifest)."""
        return await self.placement.cold.get_range(key, offset, length)

    async def import_prefix(self, prefix: str) -> None:
        """Make what the cold store holds under ``bucket/prefix`` (another node's files)
        names here now, rather than at the next TTL-limited listing."""
        await self.placement.importer.import_prefix(prefix)
        await self.placement.forget_dropped()

    # -- memory pool quotas ----------------------------------------------------------------
    def pool_quotas(self) -> dict[int, int]:
        """The memory pool's per-tenant (uid) quotas, in bytes, as stored."""
        with self.meta.snapshot() as tx:
            return tx.list_pool_quotas()

    async def set_pool_quota(self, tenant: int, nbytes: int) -> None:
        """Store tenant ``tenant``'s pool quota (``0``: remove it, the default applies),
        durable on return: the admin API acknowledges it as set."""
        async with self.meta.awrite() as tx:
            if nbytes == 0:
                tx.delete_pool_quota(tenant)
            else:
                tx.put_pool_quota(tenant, nbytes)
        await self._sync_meta()
