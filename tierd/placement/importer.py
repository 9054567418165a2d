"""Transparent import: objects in the cold store that tierd does not know appear in the
namespace without a copy -- and objects tierd knows that cold lost.

A directory is refreshed (cold listed with delimiter ``/`` at its prefix) when its import
stamp (``S`` key) is older than ``import_ttl``; missing files become CLEAN inodes with the
object's size, ETag and mtime, no local blocks (an empty ``hot`` bitmap) and a cold record;
missing common prefixes become implicit directories.  Local entries are never replaced: what
tierd wrote wins over what it finds.  New entries belong to the bucket's owner.

**Never resurrect**: a key with a pending delete (``intents``), or one this node deleted
after the listing began (:class:`~tierd.placement.intents.RecentDeletes`), is not imported,
nor a common prefix holding such keys.

**Lost objects** (a clean file the listing no longer has, or a read that got NoSuchKey) are
judged by :func:`lost`: re-uploaded when a complete local copy exists, dropped ("deleted
outside tierd", with the evidence) only when the content exists nowhere local.
"""

from __future__ import annotations

import logging
import stat
import time
from collections.abc import Callable

from tierd.acl.posix_acl import inherit
from tierd.errors import FsError
from tierd.logs import LogBudget
from tierd.meta import (
    ROOT_INO,
    STATE_CLEAN,
    STATE_DIRTY,
    Bucket,
    ColdRecord,
    Dirent,
    Inode,
    MetaStore,
    MetaTxn,
)
from tierd.placement import bitmap, intents
from tierd.placement.intents import RecentDeletes
from tierd.placement.paths import file_keys, files_under, is_version_key, queue_token
from tierd.tiers import ObjectInfo, ObjectTier

#: what placement says about an inode: open with unflushed writes / wholly local
Judge = Callable[[Inode], bool]


def _local_blocks(inode: Inode) -> int:
    hot, warm = inode.blocks.get("hot"), inode.blocks.get("warm", b"")
    blocks = set(bitmap.present(hot, inode.size)) | set(bitmap.present(warm, inode.size))
    return len(blocks)


def _stamp(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def lost(tx: MetaTxn, ino: int, key: str, *, busy: bool, local: Judge,
         evidence: str, listed_after: int | None = None) -> tuple[str, str] | None:
    """File ``ino``'s cold object ``key`` is gone.  Only a file that loses nothing is
    touched: a regular file, CLEAN, not queued, not open with unflushed writes (``busy``),
    whose cold record is its current version under that one key (and, for a listing that
    missed it, recorded before the listing began: ``listed_after``).  Then:

    * with a **complete local copy** (``local``: hot, warm or the memory tier hold every
      block) it is **re-uploaded**: DIRTY, queued, its record's version reset -- a cold store
      that came back empty or lost objects never makes tierd drop its own data;
    * otherwise its content exists nowhere tierd can reach: it was **deleted outside
      tierd**, and is dropped (:func:`drop`).

    Returns ``("reupload" | "dropped", evidence)`` or None when nothing was done; the
    evidence (``evidence``: what showed the object gone, plus the record and local blocks)
    is for the log."""
    inode = tx.get_inode(ino)
    rec = tx.get_cold(ino)
    if (inode is None or not inode.is_reg or inode.nlink == 0 or busy
            or inode.state != STATE_CLEAN or tx.queued(ino) is not None or rec is None
            or rec.version != inode.version or list(rec.keys) != [key]):
        return None
    if listed_after is not None and rec.mtime_ns >= listed_after:
        return None
    whole = local(inode)
    why = (f"{evidence}; tierd stored it as version {rec.version} (ETag {rec.keys[key]}, "
           f"{rec.size} bytes) at {_stamp(rec.mtime_ns)}; "
           + (f"a complete local copy exists ({inode.size} bytes)" if whole else
              f"{_local_blocks(inode)} of {bitmap.nblocks(inode.size)} blocks local"))
    if whole:
        inode.state = STATE_DIRTY
        tx.put_inode(inode)
        rec.version = 0  # cold no longer has this version: the persister uploads it
        tx.put_cold(ino, rec)
        tx.enqueue(ino, queue_token(None))
        return "reupload", why
    drop(tx, ino)
    return "dropped", why


def drop(tx: MetaTxn, ino: int) -> None:
    """Remove file ``ino`` from the namespace (its object was deleted outside tierd and no
    local copy is complete): its names go and it becomes an orphan (nlink 0): an open
    handle keeps it until release (the namespace reaps orphans then, or at the next
    start)."""
    inode = tx.get_inode(ino)
    assert inode is not None
    t = time.time_ns()
    parents = []
    for parent, name in tx.links(ino):
        tx.remove_dirent(parent, name)
        d = tx.get_inode(parent)
        if d is not None:
            d.mtime_ns = d.ctime_ns = t
            tx.put_inode(d)
            parents.append(parent)
    tx.delete_cold(ino)
    inode.nlink = 0
    inode.ctime_ns = t
    inode.blocks = {"hot": b""}  # its local blocks are freed: a reader still holding it
    tx.put_inode(inode)          # gets ENOENT, never the zeros of a punched hole
    tx.add_orphan(ino)
    for parent in parents:
        _prune_implicit(tx, parent, t)


def _prune_implicit(tx: MetaTxn, ino: int, t: int) -> None:
    """Implicit directories (created only to hold keys) emptied by a drop go too, bottom
    up, as when the namespace deletes their last key: S3 clients never see a prefix marker
    that nobody made."""
    while True:
        d = tx.get_inode(ino)
        if d is None or not d.is_dir or not d.objmeta.get(IMPLICIT) or tx.has_children(ino):
            return
        links = tx.links(ino)
        if not links or links[0][0] == ROOT_INO:
            return
        parent, name = links[0]
        tx.remove_dirent(parent, name)
        tx.delete_inode(ino)
        p = tx.get_inode(parent)
        if p is None:
            return
        p.nlink -= 1
        p.mtime_ns = p.ctime_ns = t
        tx.put_inode(p)
        ino = parent


IMPLICIT = "tierd.implicit"  # same flag as the namespace's implicit directories

log = logging.getLogger("tierd.placement")
#: refused keys logged per minute at most (a cold store full of them must not flood the log)
REFUSED_PER_MINUTE = 20
_refusals = LogBudget(REFUSED_PER_MINUTE, 60.0)


def refused_key(key: str, rest: str) -> bool:
    """True (and a rate-limited warning) when ``rest``, the part of cold key ``key`` below
    its bucket, breaks the namespace's key rules (:func:`tierd.namespace.names.split_key`:
    empty, ``.`` or ``..`` segments, NUL, over-long): such an object is never imported,
    since it would become an entry named ``""`` or ``..`` that no path can open."""
    from tierd.namespace.names import split_key  # here: the namespace imports placement

    try:
        split_key(rest)
    except FsError as e:
        skipped = _refusals.take()
        if skipped is not None:
            log.warning("cold object %r is not imported: %s%s", key, e.message,
                        f" ({skipped} more not logged)" if skipped else "")
        return True
    return False


class Importer:
    """Imports what cold has and judges what it lost (see the module docstring).

    ``busy(ino)`` (open with unflushed writes) and ``local(inode)`` (a complete local copy)
    are placement's; ``recent`` is the delete worker's record of keys it deleted."""

    def __init__(self, meta: MetaStore, cold: ObjectTier, ttl: float, umask: int, *,
                 busy: Callable[[int], bool], local: Judge, recent: RecentDeletes) -> None:
        self.meta, self.cold, self.ttl, self.umask = meta, cold, ttl, umask
        self.busy, self.local, self.recent = busy, local, recent
        # (inode, evidence) judged lost, for placement to forget (dropped) or count dirty
        # and log (re-uploaded)
        self.dropped: list[tuple[int, str]] = []
        self.reuploaded: list[tuple[int, str]] = []

    async def import_buckets(self) -> int:
        """Create buckets for top-level prefixes of the cold store (at start); a prefix
        whose keys are all pending deletes (a bucket removed here) is not one."""
        n, after = 0, ""
        while True:
            page = await self.cold.list("", start_after=after, delimiter="/")
            stale = set()
            for cp in page.common_prefixes:
                with self.meta.snapshot() as tx:
                    pending = intents.pending_under(tx, cp)
                if pending and not await self._live_key_under(cp):
                    stale.add(cp)
            with self.meta.write() as tx:
                for cp in page.common_prefixes:
                    name = cp.rstrip("/")
                    if (tx.get_bucket(name) is None and tx.lookup(ROOT_INO, name.encode()) is None
                            and cp not in stale):
                        t = time.time_ns()
                        d = Inode(ino=tx.next_ino(), mode=stat.S_IFDIR | 0o755, uid=0, gid=0,
                                  nlink=2, atime_ns=t, mtime_ns=t, ctime_ns=t, btime_ns=t,
                                  parent=ROOT_INO)
                        tx.put_inode(d)
                        tx.add_dirent(ROOT_INO, name.encode(), Dirent(d.ino, stat.S_IFDIR))
                        tx.put_bucket(Bucket(name, d.ino, 0, t))
                        n += 1
            if not page.truncated:
                return n
            after = page.next_start_after

    async def _live_key_under(self, prefix: str) -> bool:
        """Whether cold has a key under ``prefix`` that is not pending delete."""
        after = ""
        while True:
            page = await self.cold.list(prefix, start_after=after)
            with self.meta.snapshot() as tx:
                if any(not intents.pending(tx, o.key) for o in page.objects):
                    return True
            if not page.truncated:
                return False
            after = page.next_start_after

    def stale(self, dir_ino: int) -> bool:
        with self.meta.snapshot() as tx:
            return time.time_ns() - tx.get_stamp(dir_ino) > self.ttl * 1e9

    def _wanted(self, tx: MetaTxn, key: str, started: int) -> bool:
        """Not a key this node is deleting or deleted since the listing began, nor a
        noncurrent version's object (those are records, :mod:`tierd.namespace.versions`)."""
        return not (is_version_key(key) or intents.pending(tx, key)
                    or self.recent.deleted_since(key, started))

    def _wanted_prefix(self, tx: MetaTxn, cp: str, started: int) -> bool:
        return not (is_version_key(cp + "x") or intents.pending_under(tx, cp)
                    or self.recent.any_since_under(cp, started))

    def _judge(self, tx: MetaTxn, ino: int, key: str, evidence: str,
               listed_after: int | None) -> None:
        inode = tx.get_inode(ino)
        busy = inode is not None and self.busy(ino)
        got = lost(tx, ino, key, busy=busy, local=self.local, evidence=evidence,
                   listed_after=listed_after)
        if got is not None:
            (self.dropped if got[0] == "dropped" else self.reuploaded).append((ino, got[1]))

    async def refresh_dir(self, dir_ino: int, path: str) -> int:
        """List ``path/`` in cold (one level) and add what is missing; clean files the
        listing no longer has are judged lost (:func:`lost`).  Returns entries added."""
        n, after, prefix = 0, "", path + "/"
        started = time.time_ns()
        listed: set[bytes] = set()
        with self.recent.listing() as mono:
            while True:
                page = await self.cold.list(prefix, start_after=after, delimiter="/")
                with self.meta.write() as tx:
                    for info in page.objects:
                        listed.add(info.key[len(prefix):].encode("utf-8", "surrogateescape"))
                        if self._wanted(tx, info.key, mono):
                            n += self._add(tx, info.key, info)
                    for cp in page.common_prefixes:
                        if self._wanted_prefix(tx, cp, mono):
                            n += self._add(tx, cp.rstrip("/"), None)
                    if not page.truncated:
                        self._judge_unlisted(tx, dir_ino, prefix, listed, started)
                        tx.set_stamp(dir_ino, time.time_ns())
                if not page.truncated:
                    return n
                after = page.next_start_after

    def _judge_unlisted(self, tx: MetaTxn, dir_ino: int, prefix: str, listed: set[bytes],
                        started: int) -> None:
        gone = []
        for name, _, ent in tx.list_dirents(dir_ino):
            if stat.S_ISREG(ent.kind) and name not in listed:
                gone.append((name, ent.ino))
        for name, ino in gone:
            key = prefix + name.decode("utf-8", "surrogateescape")
            self._judge(tx, ino, key, f"the cold store's listing of {prefix!r} begun at "
                        f"{_stamp(started)} lacks {key!r}", started)

    async def import_prefix(self, prefix: str) -> int:
        """Everything under ``bucket/prefix`` (recursive), eagerly; clean files under the
        prefix that the listing no longer has are judged lost (see :meth:`refresh_dir`)."""
        n, after = 0, ""
        started = time.time_ns()
        listed: set[str] = set()
        with self.recent.listing() as mono:
            while True:
                page = await self.cold.list(prefix, start_after=after)
                with self.meta.write() as tx:
                    for info in page.objects:
                        listed.add(info.key)
                        if self._wanted(tx, info.key, mono):
                            n += self._add(tx, info.key, info)
                    if not page.truncated and "/" in prefix:  # a bucket's subtree, walked only
                        for f in list(files_under(tx, prefix)):
                            keys = file_keys(tx, f.ino)
                            if len(keys) == 1 and keys[0] not in listed:
                                self._judge(tx, f.ino, keys[0], "the cold store's listing of "
                                            f"{prefix!r} begun at {_stamp(started)} lacks "
                                            f"{keys[0]!r}", started)
                if not page.truncated:
                    return n
                after = page.next_start_after

    def judge_read_miss(self, ino: int, key: str) -> tuple[str, str] | None:
        """A read of ``ino`` got NoSuchKey for ``key``: judge it lost (:func:`lost`)."""
        with self.meta.write() as tx:
            inode = tx.get_inode(ino)
            return lost(tx, ino, key, busy=inode is not None and self.busy(ino),
                        local=self.local, evidence=f"a read of {key!r} got NoSuchKey")

    def _add(self, tx: MetaTxn, key: str, info: ObjectInfo | None) -> int:
        """Create ``key`` (a file when ``info``, else a directory) and missing parents.
        A key the namespace refuses (:func:`refused_key`) is skipped."""
        bucket, _, rest = key.partition("/")
        b = tx.get_bucket(bucket)
        if b is None or not rest or refused_key(key, rest if info is not None else rest + "/"):
            return 0
        d = tx.get_inode(b.ino)
        segs = rest.split("/")
        added = 0
        for i, seg in enumerate(segs):
            if d is None or not d.is_dir:
                return added
            name = seg.encode("utf-8", "surrogateescape")
            ent = tx.lookup(d.ino, name)
            last = i == len(segs) - 1
            if ent is not None:
                d = tx.get_inode(ent.ino)
                continue
            t = time.time_ns()
            if last and info is not None:
                version = tx.next_version()
                # as a create in that directory would: its default ACL, else the umask
                got = inherit(d.acl_default, stat.S_IFREG | 0o666, self.umask)
                f = Inode(ino=tx.next_ino(), mode=got.mode,
                          uid=d.uid, gid=d.gid, size=info.size, atime_ns=info.mtime_ns,
                          mtime_ns=info.mtime_ns, ctime_ns=info.mtime_ns, btime_ns=t,
                          version=version, etag=info.etag, state=STATE_CLEAN,
                          blocks={"hot": b""}, acl_access=got.access)
                tx.put_inode(f)
                tx.add_dirent(d.ino, name, Dirent(f.ino, stat.S_IFREG))
                tx.put_cold(f.ino, ColdRecord(version, info.size, {key: info.etag},
                                              info.mtime_ns))
                added += 1
                break
            got = inherit(d.acl_default, stat.S_IFDIR | 0o777, self.umask)
            sub = Inode(ino=tx.next_ino(), mode=got.mode,
                        uid=d.uid, gid=d.gid, nlink=2, atime_ns=t, mtime_ns=t, ctime_ns=t,
                        btime_ns=t, parent=d.ino, objmeta={IMPLICIT: "1"},
                        acl_access=got.access, acl_default=got.default)
            tx.put_inode(sub)
            tx.add_dirent(d.ino, name, Dirent(sub.ino, stat.S_IFDIR))
            d.nlink += 1
            d.mtime_ns = d.ctime_ns = t
            tx.put_inode(d)
            added += 1
            d = sub
        return added
