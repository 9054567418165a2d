"""Versioned objects for the doors and the lifecycle job: reads, deletes and listings by
version id over the records of :mod:`tierd.namespace.versions`.

The current version is the plain inode (every unversioned call keeps working on it); what
is here adds the history: a delete that leaves a marker, reads and permanent deletes of one
version (the newest remaining version becomes current again at the plain key), the merged
listing of current inodes and records, and the expiry of noncurrent versions.
"""

from __future__ import annotations

import asyncio
import errno
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from tierd.acl import Identity
from tierd.acl.s3map import enforce
from tierd.errors import FsError, Reason
from tierd.meta import EMPTY_MD5, Dirent, Inode, MetaTxn
from tierd.namespace import versions
from tierd.namespace.base import Change
from tierd.namespace.crashpoint import crashpoint
from tierd.namespace.multipart import MultipartOps
from tierd.namespace.names import split_key
from tierd.namespace.objects import ObjectReader
from tierd.namespace.versions import ENABLED, NULL, SUSPENDED, Version

_SKIP = b"\xff\xff\xff\xff"  # after a common prefix: past every key below it
_EXPIRE_PAGE = 256  # keys per read transaction of expire_noncurrent


class DeleteMarkerHit(FsError):
    """The version asked for (or the latest one) is a delete marker."""

    def __init__(self, marker: Version, latest: bool) -> None:
        super().__init__(errno.ENOENT if latest else errno.EPERM,
                         f"version {marker.vid} of {marker.key!r} is a delete marker",
                         reason=Reason.NO_SUCH_KEY if latest else Reason.METHOD_NOT_ALLOWED)
        self.marker = marker


@dataclass(slots=True)
class VersionInfo:
    """One entry of a key's history: the current inode, a noncurrent version or a marker."""

    key: str
    vid: str
    is_latest: bool
    current: bool
    mtime_ns: int
    uid: int
    inode: Inode | None = None  # None: a delete marker
    noncurrent_since_ns: int = 0  # when the next newer version was written (0: latest)

    @property
    def marker(self) -> bool:
        return self.inode is None


@dataclass
class VersionListing:
    """One page of ListObjectVersions."""

    entries: list[VersionInfo] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    next_key: str = ""
    next_vid: str = ""


@dataclass(frozen=True, slots=True)
class Deleted:
    """What a versioned delete did: the version id it made or removed, and whether that
    is a delete marker (the ``x-amz-version-id`` / ``x-amz-delete-marker`` answers)."""

    vid: str | None
    marker: bool


def _b(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def _take(out: VersionListing, key: str, entries: list[VersionInfo], count: int,
          limit: int) -> int:
    """Add ``entries`` of ``key`` to the page up to ``limit`` rows; the new row count."""
    for e in entries:
        if count >= limit:
            out.truncated = True
            break
        out.entries.append(e)
        count += 1
        out.next_key, out.next_vid = key, e.vid
    return count


class VersionOps(MultipartOps):
    """Adds versioning to the object calls (see the module doc)."""

    # -- state --------------------------------------------------------------------------
    def versioning(self, bucket: str) -> str:
        """``""`` (never enabled), ``Enabled`` or ``Suspended``; ENOENT without the bucket."""
        with self.meta.snapshot() as tx:
            versions.require_bucket(tx, bucket)
            return versions.state(tx, bucket)

    async def set_versioning(self, bucket: str, status: str) -> None:
        """Enable or suspend (never back to unversioned, as S3); durable on return."""
        if status not in (ENABLED, SUSPENDED):
            raise FsError(errno.EINVAL, f"versioning status {status!r} is not Enabled or "
                          "Suspended", reason=Reason.MALFORMED_XML)
        async with self.meta.awrite() as tx:
            versions.require_bucket(tx, bucket)
            versions.mark_in_use(tx)
        await self.bucket_config.put(bucket, versions.CONFIG, status)

    async def delete_bucket(self, ident: Identity, name: str) -> None:
        """A bucket with versions or delete markers left is not empty (as S3)."""
        async with self.meta.asnapshot() as tx:
            if next(versions.scan(tx, name), None) is not None:
                raise FsError(errno.ENOTEMPTY, f"bucket {name!r} still holds object versions "
                              "or delete markers")
        await super().delete_bucket(ident, name)

    # -- reads --------------------------------------------------------------------------
    def latest_marker(self, bucket: str, key: str) -> Version | None:
        """The delete marker that is the latest version of ``key`` (no current inode)."""
        with self.meta.snapshot() as tx:
            if versions.state(tx, bucket) == "":
                return None
            recs = versions.of_key(tx, bucket, key)
        return recs[0] if recs and recs[0].marker else None

    def _current(self, tx: MetaTxn, ident: Identity, bucket: str, key: str) -> Inode | None:
        try:
            return self._object(tx, ident, bucket, key)
        except FsError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise

    def current_version(self, ident: Identity, bucket: str, key: str) -> Inode | None:
        """The current (plain) inode of ``key``, None when there is none."""
        with self.meta.snapshot() as tx:
            versions.require_bucket(tx, bucket)
            return self._current(tx, ident, bucket, key)

    async def head_version(self, ident: Identity, bucket: str, key: str, vid: str) -> Inode:
        """Version ``vid`` of ``key``: NoSuchVersion when it does not exist, a
        :class:`DeleteMarkerHit` (MethodNotAllowed) when it is a delete marker."""
        async with self.meta.asnapshot() as tx:
            versions.require_bucket(tx, bucket)
            v = versions.find(tx, bucket, key, vid)
            if v is None:
                cur = self._current(tx, ident, bucket, key)
                if cur is None or not ((cur.is_reg and versions.current_vid(cur) == vid)
                                       or (cur.is_dir and vid == NULL)):
                    raise FsError(errno.ENOENT, f"no version {vid} of {key!r}",
                                  reason=Reason.NO_SUCH_VERSION)
                inode = self._live(cur)
            elif v.marker:
                raise DeleteMarkerHit(v, latest=False)
            else:
                found = tx.get_inode(v.ino)
                if found is None:
                    raise FsError(errno.ENOENT, f"no version {vid} of {key!r}",
                                  reason=Reason.NO_SUCH_VERSION)
                enforce(ident, "GetObject", obj=found, key=key)
                inode = self._live(found)
        if inode.is_dir:
            inode.etag, inode.size = EMPTY_MD5, 0
        elif not inode.etag:
            inode.etag = await self.etag(inode.ino)
        return inode

    async def get_version(self, ident: Identity, bucket: str, key: str, vid: str, *,
                          ensure: bool = True) -> ObjectReader:
        """Version ``vid`` of ``key`` open for reading (as :meth:`get_object`): a
        noncurrent version evicted from hot is read back from its cold key."""
        inode = await self.head_version(ident, bucket, key, vid)
        return await self._reader(inode, ensure)

    # -- deletes ------------------------------------------------------------------------
    async def delete_object(self, ident: Identity, bucket: str, key: str) -> bool:
        """The plain delete (every door and job that deletes a key): in a versioned bucket
        a delete marker, never the loss of the version (see :meth:`delete_version`)."""
        if not self.versioning(bucket):
            return await super().delete_object(ident, bucket, key)
        await self.delete_version(ident, bucket, key, None)
        return True

    async def delete_objects(self, ident: Identity, bucket: str, keys: list[str]
                             ) -> list[tuple[str, bool | FsError]]:
        """Many plain deletes (as :meth:`delete_object`), one metadata sync."""
        if not self.versioning(bucket):
            return await super().delete_objects(ident, bucket, keys)
        done = await self.delete_versions(ident, bucket, [(k, None) for k in keys])
        return [(k, r if isinstance(r, FsError) else True)
                for k, r in zip(keys, done, strict=True)]

    async def delete_version(self, ident: Identity, bucket: str, key: str,
                             vid: str | None) -> Deleted:
        """DELETE on a versioned bucket (or with a version id): without ``vid`` a delete
        marker becomes the latest version; with it, that version goes for good.  Durable
        on return."""
        out = await self._delete_version(ident, bucket, key, vid)
        await self._sync_meta()
        return out

    async def delete_versions(self, ident: Identity, bucket: str,
                              items: list[tuple[str, str | None]]
                              ) -> list[Deleted | FsError]:
        """Many versioned deletes with one metadata sync (DeleteObjects)."""
        out: list[Deleted | FsError] = []
        for key, vid in items:
            try:
                out.append(await self._delete_version(ident, bucket, key, vid))
            except FsError as e:
                out.append(e)
        await self._sync_meta()
        return out

    async def _delete_version(self, ident: Identity, bucket: str, key: str,
                              vid: str | None) -> Deleted:
        segments, marker_key = split_key(key)
        if marker_key:  # directory markers are never versioned
            await self._delete_one(ident, bucket, key)
            return Deleted(None if vid is None else vid, False)
        if vid is None and not self.versioning(bucket):
            await self._delete_one(ident, bucket, key)
            return Deleted(None, False)
        drops: list[int] = []
        changes: list[Change] = []
        async with self.meta.awrite() as tx:
            root = self._bucket_dir(tx, bucket)
            st = versions.state(tx, bucket)
            try:
                d: Inode | None = self._parent_dirs(tx, ident, bucket, segments[:-1],
                                                    create=False)
            except FsError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                    raise
                d = None
            name = segments[-1]
            child = self._child(tx, ident, d, name) if d is not None else None
            cur = child if child is not None and child.is_reg else None
            if vid is None:
                enforce(ident, "DeleteObject", parent=d or root, obj=cur, key=key)
                if cur is not None and d is not None:
                    tx.remove_dirent(d.ino, name)
                    self._touch_dir(tx, d)
                    drops += versions.retire(self, tx, bucket, key, cur,
                                             replace_null=st != ENABLED)
                    changes.append(Change(ino=cur.ino, parent=d.ino, name=name))
                    changes += self._prune_implicit(tx, d.ino)
                made, more = versions.add_marker(self, tx, bucket, key, ident.uid)
                drops += more
                result = Deleted(made.vid, True)
            else:
                v = versions.find(tx, bucket, key, vid)
                if v is None:
                    if cur is None or d is None or versions.current_vid(cur) != vid:
                        return Deleted(vid, False)  # S3: nothing to delete is a success
                    enforce(ident, "DeleteObject", parent=d, obj=cur, key=key)
                    tx.remove_dirent(d.ino, name)
                    self._touch_dir(tx, d)
                    if self._unref(tx, cur):
                        drops.append(cur.ino)
                    changes.append(Change(ino=cur.ino, parent=d.ino, name=name))
                    result = Deleted(vid, False)
                else:
                    obj = tx.get_inode(v.ino) if v.ino else None
                    enforce(ident, "DeleteObject", parent=d or root, obj=obj, key=key)
                    recs = versions.of_key(tx, bucket, key)
                    drops += versions.drop_version(self, tx, bucket, v)
                    result = Deleted(vid, v.marker)
                    if cur is not None or not recs or recs[0].seq != v.seq:
                        recs = []  # not the latest version: nothing becomes current
                if v is not None and not recs:
                    pass
                elif (promoted := self._promote(tx, ident, bucket, key, segments)) is not None:
                    changes.append(promoted)
                elif d is not None and cur is not None:
                    changes += self._prune_implicit(tx, d.ino)
            changes = self._take_created() + changes  # (a promotion's directories)
        return await self._after_delete(drops, changes, result)

    async def _after_delete(self, drops: list[int], changes: list[Change], result: Deleted
                            ) -> Deleted:
        crashpoint("delete.committed")
        for ino in drops:
            self._forget_data(ino)
        if changes:
            await self._announce(*changes)
        return result

    def _promote(self, tx: MetaTxn, ident: Identity, bucket: str, key: str,
                 segments: list[bytes]) -> Change | None:
        """The latest version of ``key`` went: the newest remaining one, unless it is a
        delete marker, becomes current again at the plain key (the mount shows it)."""
        recs = versions.of_key(tx, bucket, key)
        if not recs or recs[0].marker:
            return None
        v = recs[0]
        inode = tx.get_inode(v.ino)
        if inode is None:
            return None
        try:
            d = self._parent_dirs(tx, ident, bucket, segments[:-1], create=True)
        except FsError:
            return None  # a file is where a parent directory would be: stays noncurrent
        name = segments[-1]
        if tx.lookup(d.ino, name) is not None:
            return None
        versions.remove(tx, bucket, v)
        if v.null:
            inode.objmeta.pop(versions.FLAG, None)
        else:
            inode.objmeta[versions.FLAG] = "1"
        tx.put_inode(inode)
        tx.add_dirent(d.ino, name, Dirent(inode.ino, stat.S_IFREG))
        self._touch_dir(tx, d)
        self._names_changed(tx, inode)  # its cold object moves back to the plain key
        return Change(parent=d.ino, name=name)

    # -- listing ------------------------------------------------------------------------
    def _groups(self, tx: MetaTxn, ident: Identity, root: Inode, bucket: str, prefix: str,
                after: bytes | None) -> Iterator[tuple[str, list[VersionInfo]]]:
        """Every key under ``prefix`` after ``after`` with its history, newest first."""
        p = _b(prefix)
        cur_it = iter(self._walk(tx, ident, root, b"", p, after or b""))
        rec_it = versions.scan(tx, bucket, prefix, after)
        cur = next(cur_it, None)
        rec = next(rec_it, None)
        while cur is not None or rec is not None:
            ck = cur[0] if cur is not None else None
            rk = _b(rec.key) if rec is not None else None
            key_b = min(k for k in (ck, rk) if k is not None)
            key = key_b.decode("utf-8", "surrogateescape")
            entries: list[VersionInfo] = []
            if cur is not None and ck == key_b:
                inode = self._live(cur[1])
                if inode.is_reg or inode.is_dir:
                    entries.append(VersionInfo(key, versions.current_vid(inode) if
                                               inode.is_reg else NULL, True, True,
                                               inode.mtime_ns, inode.uid, inode))
                cur = next(cur_it, None)
            while rec is not None and rk == key_b:
                inode_r = tx.get_inode(rec.ino) if rec.ino else None
                if rec.ino == 0 or inode_r is not None:
                    since = entries[-1].mtime_ns if entries else 0
                    entries.append(VersionInfo(key, rec.vid, not entries, False,
                                               rec.mtime_ns if inode_r is None
                                               else inode_r.mtime_ns,
                                               rec.uid, inode_r, since))
                rec = next(rec_it, None)
                rk = _b(rec.key) if rec is not None else None
            if entries:
                yield key, entries

    def iter_versions(self, bucket: str, prefix: str = "") -> Iterator[VersionInfo]:
        """Every version of every key under ``prefix`` (key order, newest first per key),
        current ones included; for the lifecycle job (root's view: no permission checks).
        One read snapshot while iterating: consume it promptly."""
        with self.meta.snapshot() as tx:
            root = self._bucket_dir(tx, bucket)
            for _, entries in self._groups(tx, Identity.ROOT, root, bucket, prefix, None):
                yield from entries

    async def list_versions(self, ident: Identity, bucket: str, prefix: str = "",
                            key_marker: str = "", vid_marker: str = "",
                            delimiter: str = "", limit: int = 1000) -> VersionListing:
        """One page of ListObjectVersions (see :class:`VersionListing`)."""
        out = VersionListing()
        await self.placement.refresh_key(bucket, prefix, recursive=not delimiter)
        count = 0
        async with self.meta.asnapshot() as tx:
            root = self._bucket_dir(tx, bucket)
            enforce(ident, "ListObjects", directory=root, key=bucket)
            after: bytes | None = None
            if key_marker:
                after = _b(key_marker)
                if vid_marker:  # the rest of the marker key's history first
                    before = _b(key_marker)[:-1] if key_marker else b""
                    for key, entries in self._groups(tx, ident, root, bucket, key_marker,
                                                     before or None):
                        if key != key_marker:
                            break
                        vids = [e.vid for e in entries]
                        rest = entries[vids.index(vid_marker) + 1:] if vid_marker in vids \
                            else []
                        count = _take(out, key, rest, count, limit)
                        break
            last_cp = ""
            while not out.truncated:
                restart: bytes | None = None
                for key, entries in self._groups(tx, ident, root, bucket, prefix, after):
                    if delimiter:
                        i = key.find(delimiter, len(prefix))
                        if i >= 0:
                            cp = key[: i + len(delimiter)]
                            if cp == last_cp or (key_marker and key_marker.startswith(cp)):
                                continue
                            if count >= limit:
                                out.truncated = True
                                break
                            out.prefixes.append(cp)
                            count += 1
                            out.next_key, out.next_vid, last_cp = cp, "", cp
                            restart = _b(cp) + _SKIP
                            break
                    count = _take(out, key, entries, count, limit)
                    if out.truncated:
                        break
                if restart is None:
                    break
                after = restart
        for e in out.entries:
            if e.inode is not None and e.inode.is_reg and not e.inode.etag:
                e.inode.etag = await self.etag(e.inode.ino)
            elif e.inode is not None and e.inode.is_dir:
                e.inode.etag, e.inode.size = EMPTY_MD5, 0
        return out

    # -- lifecycle ----------------------------------------------------------------------
    async def expire_noncurrent(self, bucket: str, prefix: str, older_than_ns: int, *,
                                keep_newer: int = 0, expired_markers: bool = False) -> int:
        """Permanently delete the noncurrent versions (and noncurrent delete markers) of
        keys under ``prefix`` that became noncurrent before ``older_than_ns``, keeping the
        ``keep_newer`` newest noncurrent ones of each key; with ``expired_markers``, also
        a delete marker that is all that is left of a key.  Returns how many went."""
        doomed: list[tuple[str, str]] = []
        after: bytes | None = None
        while True:  # pages of keys, each its own short read: the loop is never held long
            seen = 0
            async with self.meta.asnapshot() as tx:
                root = self._bucket_dir(tx, bucket)
                for key, entries in self._groups(tx, Identity.ROOT, root, bucket, prefix,
                                                 after):
                    old = [e for e in entries if not e.is_latest]
                    gone = [(key, e.vid) for n, e in enumerate(old)
                            if n >= keep_newer and e.noncurrent_since_ns < older_than_ns]
                    doomed += gone
                    if expired_markers and entries[0].marker and len(gone) == len(old):
                        doomed.append((key, entries[0].vid))
                    after, seen = _b(key), seen + 1
                    if seen >= _EXPIRE_PAGE:
                        break
            if seen < _EXPIRE_PAGE:
                break
            await asyncio.sleep(0)
        n = 0
        for i in range(0, len(doomed), 100):
            async with self.meta.awrite() as tx:
                drops: list[int] = []
                for key, vid in doomed[i:i + 100]:
                    v = versions.find(tx, bucket, key, vid)
                    if v is not None:
                        drops += versions.drop_version(self, tx, bucket, v)
                        n += 1
            for ino in drops:
                self._forget_data(ino)
            await asyncio.sleep(0)
        if n:
            await self._sync_meta()
        return n

    async def _open_source(self, ident: Identity, bucket: str, key: str,
                           version: str | None) -> ObjectReader:
        """A copy's source (CopyObject, UploadPartCopy): version ``version`` of it."""
        if version is None:
            return await self.get_object(ident, bucket, key)
        return await self.get_version(ident, bucket, key, version)
