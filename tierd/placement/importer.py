"""Transparent import: objects in the cold store that tierd does not know appear in the
namespace without a copy.

A directory is refreshed (cold listed with delimiter ``/`` at its prefix) when its import
stamp (``S`` key) is older than ``import_ttl``; missing files become CLEAN inodes with the
object's size, ETag and mtime, no local blocks (an empty ``hot`` bitmap) and a cold record;
missing common prefixes become implicit directories.  Local entries are never replaced: what
tierd wrote wins over what it finds.  New entries belong to the bucket's owner.
"""

from __future__ import annotations

import logging
import stat
import time
from collections.abc import Callable

from tierd.acl.posix_acl import inherit
from tierd.errors import FsError
from tierd.meta import (
    ROOT_INO,
    STATE_CLEAN,
    Bucket,
    ColdRecord,
    Dirent,
    Inode,
    MetaStore,
    MetaTxn,
)
from tierd.placement.paths import file_keys, files_under
from tierd.tiers import ObjectInfo, ObjectTier


def pending_deletes(tx: MetaTxn) -> set[str]:
    """Cold keys the persister has yet to delete (names removed or renamed away): an
    import must not bring those back.  Costs one pass over the persist queue."""
    out: set[str] = set()
    for ino in tx.list_queue():
        rec = tx.get_cold(ino)
        if rec is not None:
            out.update(set(rec.keys) - set(file_keys(tx, ino)))
    return out

def drop_vanished(tx: MetaTxn, ino: int, key: str, *, busy: bool,
                  listed_after: int | None = None) -> bool:
    """Remove file ``ino`` from the namespace because its cold object ``key`` is gone --
    only when that loses nothing: a regular file, CLEAN, not queued, not open with unflushed
    writes (``busy``), whose cold record is its current version under that one key (and,
    for a listing that missed it, recorded before the listing began: ``listed_after``).
    Its names go and it becomes an orphan (nlink 0): an open handle keeps it until release
    (the namespace reaps orphans then, or at the next start).  True if dropped."""
    inode = tx.get_inode(ino)
    rec = tx.get_cold(ino)
    if (inode is None or not inode.is_reg or inode.nlink == 0 or busy
            or inode.state != STATE_CLEAN or tx.queued(ino) is not None or rec is None
            or rec.version != inode.version or list(rec.keys) != [key]):
        return False
    if listed_after is not None and rec.mtime_ns >= listed_after:
        return False
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
    return True


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
_refusals = {"start": 0.0, "logged": 0, "skipped": 0}


def refused_key(key: str, rest: str) -> bool:
    """True (and a rate-limited warning) when ``rest``, the part of cold key ``key`` below
    its bucket, breaks the namespace's key rules (:func:`tierd.namespace.names.split_key`:
    empty, ``.`` or ``..`` segments, NUL, over-long): such an object is never imported,
    since it would become an entry named ``""`` or ``..`` that no path can open."""
    from tierd.namespace.names import split_key  # here: the namespace imports placement

    try:
        split_key(rest)
    except FsError as e:
        now = time.monotonic()
        if now - _refusals["start"] >= 60:
            _refusals.update(start=now, logged=0)
        if _refusals["logged"] < REFUSED_PER_MINUTE:
            _refusals["logged"] += 1
            skipped, _refusals["skipped"] = _refusals["skipped"], 0
            log.warning("cold object %r is not imported: %s%s", key, e.message,
                        f" ({skipped} more not logged)" if skipped else "")
        else:
            _refusals["skipped"] += 1
        return True
    return False


class Importer:
    def __init__(self, meta: MetaStore, cold: ObjectTier, ttl: float, umask: int) -> None:
        self.meta, self.cold, self.ttl, self.umask = meta, cold, ttl, umask
        self.dropped: list[int] = []  # inodes dropped as vanished, for placement to forget

    async def import_buckets(self) -> int:
        """Create buckets for top-level prefixes of the cold store (at start)."""
        n, after = 0, ""
        while True:
            page = await self.cold.list("", start_after=after, delimiter="/")
            with self.meta.write() as tx:
                for cp in page.common_prefixes:
                    name = cp.rstrip("/")
                    if tx.get_bucket(name) is None and tx.lookup(ROOT_INO, name.encode()) is None:
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

    def stale(self, dir_ino: int) -> bool:
        with self.meta.snapshot() as tx:
            return time.time_ns() - tx.get_stamp(dir_ino) > self.ttl * 1e9

    async def refresh_dir(self, dir_ino: int, path: str,
                          busy: Callable[[int], bool] = lambda ino: True) -> int:
        """List ``path/`` in cold (one level) and add what is missing; clean files the
        listing no longer has were deleted from cold by someone else and are dropped
        (:func:`drop_vanished`; ``busy`` tells which inodes have unflushed writes).
        Returns entries added."""
        n, after, prefix = 0, "", path + "/"
        started = time.time_ns()
        listed: set[bytes] = set()
        while True:
            page = await self.cold.list(prefix, start_after=after, delimiter="/")
            with self.meta.write() as tx:
                gone = pending_deletes(tx)
                for info in page.objects:
                    listed.add(info.key[len(prefix):].encode("utf-8", "surrogateescape"))
                    if info.key not in gone:
                        n += self._add(tx, info.key, info)
                for cp in page.common_prefixes:
                    if not any(k.startswith(cp) for k in gone):
                        n += self._add(tx, cp.rstrip("/"), None)
                if not page.truncated:
                    self._drop_unlisted(tx, dir_ino, prefix, listed, started, busy)
                    tx.set_stamp(dir_ino, time.time_ns())
            if not page.truncated:
                return n
            after = page.next_start_after

    def _drop_unlisted(self, tx: MetaTxn, dir_ino: int, prefix: str, listed: set[bytes],
                       started: int, busy: Callable[[int], bool]) -> None:
        gone = []
        for name, _, ent in tx.list_dirents(dir_ino):
            if stat.S_ISREG(ent.kind) and name not in listed:
                gone.append((name, ent.ino))
        for name, ino in gone:
            key = prefix + name.decode("utf-8", "surrogateescape")
            if drop_vanished(tx, ino, key, busy=busy(ino), listed_after=started):
                self.dropped.append(ino)

    async def import_prefix(self, prefix: str,
                            busy: Callable[[int], bool] = lambda ino: True) -> int:
        """Everything under ``bucket/prefix`` (recursive), eagerly; clean files under the
        prefix that the listing no longer has are dropped (see :meth:`refresh_dir`)."""
        n, after = 0, ""
        started = time.time_ns()
        listed: set[str] = set()
        while True:
            page = await self.cold.list(prefix, start_after=after)
            with self.meta.write() as tx:
                gone = pending_deletes(tx)
                for info in page.objects:
                    listed.add(info.key)
                    if info.key not in gone:
                        n += self._add(tx, info.key, info)
                if not page.truncated and "/" in prefix:  # a bucket's subtree, walked only
                    for f in list(files_under(tx, prefix)):
                        keys = file_keys(tx, f.ino)
                        if (len(keys) == 1 and keys[0] not in listed and drop_vanished(
                                tx, f.ino, keys[0], busy=busy(f.ino), listed_after=started)):
                            self.dropped.append(f.ino)
            if not page.truncated:
                return n
            after = page.next_start_after

    async def import_key(self, key: str) -> bool:
        """One object by key (a lookup miss through S3); True if it now exists."""
        try:
            info = await self.cold.head(key)
        except ValueError:  # InvalidKey: not an object name
            return False
        if info is None:
            return False
        with self.meta.write() as tx:
            if key in pending_deletes(tx):
                return False
            self._add(tx, key, info)
        return True

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
