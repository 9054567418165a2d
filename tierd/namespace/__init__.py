"""The one namespace every door calls: POSIX operations and S3 objects on the same inodes.

Doors translate their protocol into these calls and map :class:`FsError` back; every rule
about names, permissions and semantics lives here or in :mod:`tierd.acl`.  What a door may
call is declared in :mod:`tierd.namespace.api` (:class:`NamespaceAPI`, with the value types
doors use); :class:`Namespace` is its implementation.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from tierd.errors import FsError
from tierd.meta import ROOT_INO, STATE_DIRTY, Inode, MetaStore, MetaTxn
from tierd.namespace.api import NamespaceAPI
from tierd.namespace.base import ROOT_MODE, Change, StatFs, now_ns
from tierd.namespace.contentmeta import forget_content_meta
from tierd.namespace.entries import RENAME_EXCHANGE, RENAME_NOREPLACE, UTIME_NOW
from tierd.namespace.imports import ImportOps
from tierd.namespace.keylisting import Listing
from tierd.namespace.objects import ObjectReader
from tierd.namespace.tags import TagOps
from tierd.namespace.tiering import TieringOps
from tierd.namespace.versionops import VersionOps
from tierd.namespace.xattrs import XATTR_CREATE, XATTR_REPLACE, XattrOps
from tierd.placement import Placement
from tierd.tiers.hotdir import HotDir

log = logging.getLogger("tierd.namespace")

__all__ = [
    "RENAME_EXCHANGE",
    "RENAME_NOREPLACE",
    "ROOT_INO",
    "UTIME_NOW",
    "XATTR_CREATE",
    "XATTR_REPLACE",
    "Change",
    "FsError",
    "Listing",
    "Namespace",
    "NamespaceAPI",
    "ObjectReader",
    "StatFs",
]


# Far more numbers than one group-commit interval can hand out (see _recover).
COUNTER_SKIP = 1 << 20


class Namespace(VersionOps, TagOps, XattrOps, ImportOps, TieringOps):
    """Assembled namespace; build it with :meth:`load` (``open`` opens files)."""

    @classmethod
    async def load(cls, meta: MetaStore, hot_dir: Path, *, placement: Placement,
                   umask: int = 0o022) -> Namespace:
        """``placement`` (started by the caller, over the same ``hot_dir``; see
        :func:`tierd.placement.ops.placement_from_config`) makes cold the system of record
        and ``hot_dir`` its block cache."""
        if Path(placement.hot.root).resolve() != Path(hot_dir).resolve():
            raise ValueError(f"placement's hot tier is {placement.hot.root}, not {hot_dir}")
        ns = cls(meta, HotDir(placement.hot), umask, placement)  # the tier owns the files
        placement.importer.attach(ns)  # import changes the tree through ns (imports.py)
        unclean_below = ns._recover()
        await ns._sync_meta()  # what recovery changed, durable before a file goes
        reclaimed = ns.garbage.recover()
        unnamed = 0
        if unclean_below:
            unnamed = await asyncio.to_thread(ns.garbage.remove_unnamed, unclean_below)
        if reclaimed or unnamed:
            log.info("recovered: %d dropped data files reclaimed, %d data files no inode "
                     "names removed", reclaimed, unnamed)
        await placement.import_buckets()
        return ns

    @property
    def _running(self) -> str:
        """The counter that says this node's daemon runs (a crash leaves it set): one per
        node of a cluster, since the others run on while this one restarts."""
        return "running" if not self.meta.node else f"running@{self.meta.node}"

    def _recover(self) -> int:
        """Create the root on first start; after a crash, drop staged uploads and the
        files that were unlinked while open (nothing can hold them any more), and give
        every file changed in place since its last durable point a new version.  First of
        all, small files whose data only the metadata log holds get it back.

        Returns 0 after a clean stop, else the first inode number this start may hand out
        (data files of lower numbers that no inode names are leftovers of the crash)."""
        self.smalllog.replay()
        with self.meta.snapshot() as tx:  # before the commit that removes their V keys
            kernel_written = tx.list_intents(kernel=True)
        for ino in kernel_written:
            # a live process may still write the old file through the kernel's write
            # passthrough of the last daemon (fuse/kpass.py): not the new version's.
            # Only those files: a copy of every file changed in place could fill the hot
            # tier, and a start that fails on it serves nothing.
            try:
                self.hot.detach(ino)
            except OSError as e:
                log.error("could not give inode %d a data file of its own at start (%s): "
                          "a process that still writes it through the last daemon's "
                          "passthrough changes its new version", ino, e)
        unclean_below = 0
        with self.meta.write() as tx:
            if tx.get_inode(ROOT_INO) is None:
                t = now_ns()
                tx.put_inode(Inode(ino=ROOT_INO, mode=ROOT_MODE, uid=0, gid=0, nlink=2,
                                   atime_ns=t, mtime_ns=t, ctime_ns=t, btime_ns=t,
                                   parent=ROOT_INO))
                if tx.counter("next_ino") < ROOT_INO:
                    tx.add_counter("next_ino", ROOT_INO)
            if tx.counter(self._running):
                # The last daemon did not close the store: changes of its last moments that
                # nobody waited for may be lost (group commit), including counter increments.
                # Numbers handed out then must never be handed out again (a data file of a
                # lost inode may still exist), so skip well past them.
                unclean_below = tx.add_counter("next_ino", COUNTER_SKIP) + 1
                tx.add_counter("next_version", COUNTER_SKIP)
                log.warning("the metadata store was not closed cleanly: inode and version "
                            "numbers skip ahead by %d", COUNTER_SKIP)
            else:
                tx.add_counter(self._running, 1)
            orphans = tx.list_orphans()
            for ino in orphans:
                self.placement.deleted(tx, ino)
                tx.delete_inode(ino)
                tx.add_garbage(ino)  # reclaimed once this is durable (load)
            changed = self._bump_changed(tx)
        staged = self.hot.clear_temp()
        self._recover_uploads()
        if orphans or staged or changed:
            log.info("recovered: %d orphaned files and %d staged uploads removed, %d files "
                     "changed in place given a new version", len(orphans), staged, changed)
        return unclean_below

    def _bump_changed(self, tx: MetaTxn) -> int:
        """Files whose in-place change was cut short by the crash (their ``V`` key is
        durable, the commit that would have removed it is not): the data file may hold
        any mix of the recorded version and the new bytes, so it becomes a new version
        with an unknown ETag (computed on demand), dirty and queued for the persister.
        Their whole content is on hot: the writer made it local before the intention."""
        n = 0
        for ino in tx.list_intents():
            tx.remove_intent(ino)
            inode = tx.get_inode(ino)
            if inode is None or not inode.is_reg:
                continue
            inode.version = tx.next_version()
            forget_content_meta(inode)  # its checksums described the old bytes
            inode.etag = ""
            inode.state = STATE_DIRTY
            inode.ctime_ns = now_ns()
            tx.put_inode(inode)
            self._queue(tx, inode)
            n += 1
        return n

    async def close(self) -> None:
        """Make every open file durable and release it."""
        if self._closed:
            return
        self._closed = True
        for fh in list(self._handles):
            try:
                await self.release(fh)
            except OSError:
                log.exception("releasing handle %d at shutdown", fh)
        await self.spares.close()
        await self.garbage.drain(closing=True)
        await self.smalllog.close()
        await asyncio.to_thread(self.hot.small.close)  # every small file already handed in
        async with self.meta.awrite() as tx:
            tx.add_counter(self._running, -1)
        await self._sync_meta()

    def stats(self) -> dict[str, int]:
        with self.meta.snapshot() as tx:
            inodes = tx.counter("inodes")
            nbytes = tx.counter("bytes")
            buckets = sum(1 for _ in tx.list_buckets())
        return {"inodes": inodes, "bytes": nbytes, "buckets": buckets,
                "open_files": len(self._open)}


if TYPE_CHECKING:
    def _implements_api(ns: Namespace) -> NamespaceAPI:
        """Never called: mypy proves here that :class:`Namespace` satisfies the declared
        API (a missing call or a changed signature fails the type check)."""
        return ns
