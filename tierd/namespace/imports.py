"""The tree-changing half of transparent import: entries for what the cold store has, and
the removal of files whose object vanished from it.

Placement lists cold and decides *what* to import or drop (:mod:`tierd.placement.importer`:
the listing, pending deletes, keys deleted during a listing, the judgement of a lost
object); the file tree changes only here, through the namespace's own rules and helpers --
keys split by :func:`~tierd.namespace.names.split_key`, bucket names checked by
:func:`~tierd.namespace.names.check_bucket_name`, entries linked by ``_link_new`` and
implicit directories pruned by ``_prune_implicit`` as a delete does.  Placement calls these
methods inside its own write transaction, so its checks of pending deletes and the entries
they allow commit together (an import never resurrects a key deleted meanwhile:
``docs/durability.md``).

Imported entries take the permissions a create in their directory would: its default ACL,
else the namespace's umask; they belong to the directory's owner.  Buckets found in cold are
root-owned, mode 0755.  Local entries always win: an existing name is never replaced.  A key
or bucket name the namespace refuses is skipped with a rate-limited warning: it would
become an entry no path or request can reach.
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterable

from tierd.acl.posix_acl import inherit
from tierd.errors import FsError
from tierd.logs import LogBudget
from tierd.meta import ROOT_INO, STATE_CLEAN, Bucket, ColdRecord, Inode, MetaTxn
from tierd.namespace.base import IMPLICIT, now_ns
from tierd.namespace.names import check_bucket_name, split_key
from tierd.namespace.objects import ObjectOps
from tierd.tiers import ObjectInfo

log = logging.getLogger("tierd.namespace")
#: refused names logged per minute at most (a cold store full of them must not flood the log)
REFUSED_PER_MINUTE = 20
_refusals = LogBudget(REFUSED_PER_MINUTE, 60.0)


def _refused(what: str, e: FsError) -> None:
    skipped = _refusals.take()
    if skipped is not None:
        log.warning("%s is not imported: %s%s", what, e.message,
                    f" ({skipped} more not logged)" if skipped else "")


class ImportOps(ObjectOps):
    """What :mod:`tierd.placement.importer` calls, inside its write transaction ``tx``."""

    def import_buckets(self, tx: MetaTxn, names: Iterable[str]) -> int:
        """A bucket for each name the namespace lacks (a top-level prefix of cold); a name
        S3 could not create is refused.  Returns how many were created."""
        n = 0
        root = self._get(tx, ROOT_INO)
        for name in names:
            if tx.get_bucket(name) is not None or tx.lookup(ROOT_INO, name.encode()) is not None:
                continue
            try:
                check_bucket_name(name)
            except FsError as e:
                _refused(f"cold prefix {name + '/'!r}", e)
                continue
            t = now_ns()
            d = Inode(ino=tx.next_ino(), mode=stat.S_IFDIR | 0o755, uid=0, gid=0, nlink=2,
                      atime_ns=t, mtime_ns=t, ctime_ns=t, btime_ns=t, parent=ROOT_INO)
            self._link_new(tx, root, name.encode(), d)
            tx.put_bucket(Bucket(name, d.ino, 0, t))
            n += 1
        return n

    def import_objects(self, tx: MetaTxn, objects: Iterable[tuple[str, ObjectInfo | None]]
                       ) -> int:
        """Entries for cold keys ``bucket/key``: a CLEAN file with the object's size, ETag
        and mtime, no local blocks and a cold record (an :class:`ObjectInfo`), or a
        directory (None: a common prefix), with the implicit directories above it.
        Returns the entries created."""
        return sum(self._import_one(tx, key, info) for key, info in objects)

    def _import_one(self, tx: MetaTxn, key: str, info: ObjectInfo | None) -> int:
        bucket, _, rest = key.partition("/")
        b = tx.get_bucket(bucket)
        if b is None or not rest:
            return 0
        try:
            segments, _ = split_key(rest if info is not None else rest + "/")
        except FsError as e:
            _refused(f"cold object {key!r}", e)
            return 0
        d = tx.get_inode(b.ino)
        added = 0
        for i, name in enumerate(segments):
            if d is None or not d.is_dir:
                return added
            ent = tx.lookup(d.ino, name)
            if ent is not None:
                if i == len(segments) - 1:
                    return added  # there already (a refresh re-lists every known key)
                d = tx.get_inode(ent.ino)
                continue
            if i == len(segments) - 1 and info is not None:
                self._link_new(tx, d, name, self._imported_file(tx, d, key, info))
                return added + 1
            got = inherit(d.acl_default, stat.S_IFDIR | 0o777, self.umask)
            t = now_ns()
            sub = Inode(ino=tx.next_ino(), mode=got.mode, uid=d.uid, gid=d.gid, nlink=2,
                        atime_ns=t, mtime_ns=t, ctime_ns=t, btime_ns=t, parent=d.ino,
                        objmeta={IMPLICIT: "1"}, acl_access=got.access,
                        acl_default=got.default)
            self._link_new(tx, d, name, sub)
            added += 1
            d = sub
        return added

    def _imported_file(self, tx: MetaTxn, d: Inode, key: str, info: ObjectInfo) -> Inode:
        """A new CLEAN inode for cold object ``key`` in directory ``d``, with its record."""
        version = tx.next_version()
        # as a create in that directory would: its default ACL, else the umask
        got = inherit(d.acl_default, stat.S_IFREG | 0o666, self.umask)
        f = Inode(ino=tx.next_ino(), mode=got.mode, uid=d.uid, gid=d.gid, size=info.size,
                  atime_ns=info.mtime_ns, mtime_ns=info.mtime_ns, ctime_ns=info.mtime_ns,
                  btime_ns=now_ns(), version=version, etag=info.etag, state=STATE_CLEAN,
                  blocks={"hot": b""}, acl_access=got.access)
        tx.put_cold(f.ino, ColdRecord(version, info.size, {key: info.etag}, info.mtime_ns))
        return f

    def vanished(self, tx: MetaTxn, ino: int) -> None:
        """File ``ino``'s object was deleted outside tierd and nothing local holds its
        content (placement judged it: :func:`tierd.placement.importer.lost`): its names go,
        with the implicit directories they leave empty, and it becomes an orphan (nlink
        0): an open handle keeps it until release, when it is reaped, else the next start
        does.  No change notification is sent (the caller's transaction is still open)."""
        inode = self._get(tx, ino)
        parents: list[Inode] = []
        for parent, name in tx.links(ino):
            tx.remove_dirent(parent, name)
            d = tx.get_inode(parent)
            if d is not None:
                self._touch_dir(tx, d)
                parents.append(d)
        inode.nlink = 0
        inode.ctime_ns = now_ns()
        self._orphan(tx, inode)
        for d in parents:
            self._prune_implicit(tx, d.ino)
