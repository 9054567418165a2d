"""Copy-on-write of a versioned file before the mount changes its committed bytes in place.

Through the mount the current version of a key is changed where it lies: ``open(O_TRUNC)``
(``cp``, a shell's ``>``, ``torch.save`` to the same path), ``truncate`` and a write below
the committed size all rewrite the bytes of the inode the kernel caches.  In a bucket whose
versioning is ``Enabled`` that would destroy the previous version, which S3 keeps on every
overwrite.  So before the first such change since the last durable point
(:meth:`FileOps._write_intent <tierd.namespace.files.FileOps._write_intent>`, and
:meth:`ResizeOps._resize <tierd.namespace.resize.ResizeOps._resize>` before a cut),
:func:`keep_committed` preserves the committed version:

1. its bytes are made local (read back from warm or cold when evicted: the simplest
   correct path -- the clone then is an ordinary new inode the persister uploads to the
   version's cold key, with no cold-side copy to order against the plain key's upload);
2. they are cloned, off the event loop, into a staging file (``copy_file_range``: a reflink
   where the file system shares extents), fsynced and installed as the data file of a new
   inode number (name fsynced too);
3. one transaction writes the clone's inode (the old version's size, ETag, metadata,
   xattrs) with the ``H`` record naming it under the old version id, and gives the inode
   the mount uses (its number stays: the kernel caches it) a new version id -- same bytes
   for now, so either version read after a crash is exact;
4. the metadata is flushed before the caller touches a byte.

Crashes: before step 3 commits durably the clone is a staging file (removed at start,
``HotDir.clear_temp``) or a data file no inode names under a number below the counter's
post-crash skip (removed by :meth:`Garbage.remove_unnamed
<tierd.namespace.garbage.Garbage.remove_unnamed>`); after step 4 both versions are complete
(the in-place change then starts under its ``V`` intention, or its truncate commits).
Because the current inode's version changes in step 3, its own data file is made durable
first (a small PUT's bytes may still live only in the small-write log, which replays them
for the logged version only).  Unversioned and ``Suspended`` buckets skip all of this (one
snapshot read; while suspended the ``null`` version is overwritten, as S3 does).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os

from tierd.meta import STATE_DIRTY
from tierd.namespace import versions
from tierd.namespace.base import NamespaceBase
from tierd.namespace.crashpoint import crashpoint
from tierd.namespace.staging import retry_full
from tierd.namespace.versions import ENABLED, FLAG, Version
from tierd.tiers.fileio import copy_range
from tierd.tiers.hotdir import HotDir


async def keep_committed(ns: NamespaceBase, ino: int) -> bool:
    """Before an in-place change of ``ino``'s committed bytes: in an ``Enabled`` bucket,
    the committed version becomes a noncurrent version of its own (the module doc).
    Returns whether one was kept.  The caller keeps other in-place changes of ``ino``
    out meanwhile (the shared intention future, or the resize guard)."""
    async with ns.meta.asnapshot() as tx:
        cur = tx.get_inode(ino)
        if cur is None or not cur.is_reg or cur.nlink != 1:
            return False  # hard links are not kept as versions (versions.retire)
        links = tx.links(ino)
        if len(links) != 1:
            return False
        loc = versions.locate(tx, *links[0])
        if loc is None or versions.state(tx, loc[0]) != ENABLED:
            return False
    bucket, key = loc
    async with ns.meta.awrite() as tx:
        clone_ino = tx.next_ino()
    with ns.placement.hold(ino):  # no eviction between the read-back and the copy
        if cur.size:
            await ns.placement.ensure(ino, 0, cur.size, touch=False)
        await ns.placement.quiesce(ino)
        # a full hot tier evicts clean data (never this file: held) and the copy is retried
        await retry_full(ns.placement, cur.size, lambda: asyncio.to_thread(
            _clone, ns.hot, ino, clone_ino, cur.size), "keeping the previous version")
    crashpoint("keep.cloned")
    async with ns.meta.awrite() as tx:
        now = tx.get_inode(ino)
        stale = now is None or now.version != cur.version or now.size != cur.size
        if now is not None and not stale:
            clone = dataclasses.replace(now, ino=clone_ino, nlink=1, state=STATE_DIRTY,
                                        blocks={}, objmeta=dict(now.objmeta))
            ns._queue(tx, clone)  # uploaded to its .tierd-versions key from hot
            tx.put_inode(clone)
            for name, value in list(tx.list_xattrs(ino)):
                tx.set_xattr(clone_ino, name, value)
            versions.put(tx, bucket, Version(key, versions.current_vid(now), now.version,
                                             clone_ino, now.mtime_ns, now.uid))
            now.version = tx.next_version()  # the mount's inode: a new (equal) version
            now.objmeta[FLAG] = "1"
            now.state = STATE_DIRTY
            ns._queue(tx, now)
            tx.put_inode(now)
    if stale:  # another change committed meanwhile: nothing names the clone
        await asyncio.to_thread(ns.hot.remove, clone_ino)
        return False
    crashpoint("keep.committed")
    await ns.meta.flush()
    crashpoint("keep.durable")
    return True


def _clone(hot: HotDir, ino: int, clone_ino: int, size: int) -> None:
    """The first ``size`` bytes of ``ino``'s data file (a shorter file reads as zeros)
    as the durable data file of ``clone_ino``; ``ino``'s own file made durable too (the
    module doc).  Blocking: a thread."""
    src = hot.open(ino)
    try:
        os.fdatasync(src)
        hot.fsync_dir(ino)
        tmp, dst = hot.new_temp()
        try:
            try:
                copy_range(src, dst, size, 0, 0)
                os.ftruncate(dst, size)
                os.fdatasync(dst)
            finally:
                os.close(dst)
            hot.install_durable(tmp, clone_ino)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    finally:
        os.close(src)
