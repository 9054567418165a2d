"""Buckets and whole objects: the S3 view of the same inodes the mount shows.

A key is a path inside its bucket (rules in :mod:`tierd.namespace.names`).  A PUT streams the
body to a staging file while hashing it, fsyncs it, then in one transaction creates missing
parent directories and swaps the new inode in (an overwrite keeps the old owner and mode, and
open handles keep reading the old bytes, as after rename over a file).  Directories created
only to hold a key are marked implicit and vanish with their last key, so S3 clients never
see directories they did not make; directories made through the mount list as ``a/b/``
markers while empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import stat
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from tierd.acl import Identity, canned
from tierd.acl.modes import has_privs
from tierd.acl.s3map import enforce
from tierd.errors import FsError, Reason
from tierd.meta import EMPTY_MD5, ROOT_INO, STATE_DIRTY, Bucket, Dirent, Inode, MetaTxn
from tierd.meta.reads import path_reads, put_reads
from tierd.namespace import versions
from tierd.namespace.base import IMPLICIT, Change, now_ns
from tierd.namespace.crashpoint import crashpoint
from tierd.namespace.keylisting import KeyListing
from tierd.namespace.names import check_bucket_name, split_key
from tierd.namespace.staging import close_source, refuse_over_dirty_limit, stage_body
from tierd.preconditions import etag_matches
from tierd.tiers import fileio

READ_CHUNK = 1 << 20


@dataclass
class ObjectReader:
    """An open object: its attributes and a streamed body (ranges allowed)."""

    inode: Inode
    fd: int
    _closed: bool = False
    # fetches missing blocks of a range from cold, and releases the eviction hold
    _ensure: Callable[[int, int], Awaitable[None]] | None = None
    _release: Callable[[], None] | None = None

    @property
    def size(self) -> int:
        return self.inode.size

    async def ensure(self, offset: int = 0, length: int | None = None) -> None:
        """Make ``[offset, offset+length)`` readable from :attr:`fd` (blocks fetched from
        cold); a door that reads ``fd`` itself (sendfile) calls this first.  ``iter``
        does it per chunk.  Raises FsError EIO (reason ServiceUnavailable) when cold is
        down and the range is not cached."""
        if self._ensure is not None:
            n = self.inode.size - offset if length is None else length
            await self._ensure(offset, n)

    async def iter(
        self, offset: int = 0, length: int | None = None, chunk: int = READ_CHUNK
    ) -> AsyncIterator[bytes]:
        end = self.inode.size if length is None else min(self.inode.size, offset + length)
        pos = offset
        while pos < end and self.fd >= 0:
            await self.ensure(pos, min(chunk, end - pos))
            data = await fileio.pread(self.fd, min(chunk, end - pos), pos)
            if not data:  # shorter than recorded (sparse tail): zeros
                data = bytes(min(chunk, end - pos))
            pos += len(data)
            yield data

    async def read_all(self) -> bytes:
        return b"".join([c async for c in self.iter()])

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._release is not None:
                self._release()
            if self.fd >= 0:
                os.close(self.fd)


def _check_conditions(
    key: str, old: Inode | None, if_match: str | None, if_none_match: str | None
) -> None:
    """A conditional write's ETag preconditions against the object it would replace,
    inside the commit (:func:`tierd.preconditions.etag_matches`, as the S3 door's early
    check): atomic against concurrent writers."""
    if old is None or not old.is_reg:
        if if_match is not None:
            raise FsError(errno.ENOENT, f"no such key {key!r} (If-Match)")
        return
    if if_none_match is not None and etag_matches(if_none_match, old.etag):
        raise FsError(errno.EEXIST, f"key {key!r} exists (If-None-Match)",
                      reason=Reason.PRECONDITION_FAILED)
    if if_match is not None and not etag_matches(if_match, old.etag):
        raise FsError(errno.EINVAL, f"key {key!r} has another ETag (If-Match)",
                      reason=Reason.PRECONDITION_FAILED)


class ObjectOps(KeyListing):
    # -- buckets ---------------------------------------------------------------------------
    async def create_bucket(self, ident: Identity, name: str) -> Inode:
        check_bucket_name(name)
        # private unless a canned ACL follows (tierd.acl.canned.S3_UMASK)
        d = await self.mkdir(ident, ROOT_INO, name.encode(),
                             0o777 & ~(self.umask | canned.S3_UMASK))
        await self._announce(Change(parent=ROOT_INO, name=name.encode()))
        return d

    async def delete_bucket(self, ident: Identity, name: str) -> None:
        await self._bucket(name)
        await self.rmdir(ident, ROOT_INO, name.encode())

    async def list_buckets(self, ident: Identity) -> list[Bucket]:
        async with self.meta.asnapshot() as tx:
            return list(tx.list_buckets())

    async def get_bucket(self, name: str) -> Bucket:
        return await self._bucket(name)

    async def _bucket(self, name: str) -> Bucket:
        async with self.meta.asnapshot() as tx:
            b = tx.get_bucket(name)
        if b is None:
            raise FsError(errno.ENOENT, f"bucket {name!r} does not exist")
        return b

    # -- walking keys ----------------------------------------------------------------------
    def _parent_dirs(
        self, tx: MetaTxn, ident: Identity, bucket: str, segments: list[bytes], create: bool,
        implicit: bool = True,
    ) -> Inode:
        """The directory that holds the key's last segment, creating missing directories
        (owned by the caller) when ``create``."""
        cur = self._bucket_dir(tx, bucket)
        for i, seg in enumerate(segments):
            child = self._child(tx, ident, cur, seg)
            if child is None:
                if not create:
                    raise FsError(errno.ENOENT, "no such key")
                enforce(ident, "PutObject", parent=cur)  # a new entry in cur
                child = self._new_inode(
                    tx, ident, cur, stat.S_IFDIR | 0o777, nlink=2,
                    parent=cur.ino, objmeta={IMPLICIT: "1"} if implicit else {},
                )
                canned.new_prefix(child, cur)  # an S3 prefix: its parent's permissions
                self._link_new(tx, cur, seg, child)
                self._dir_created(cur.ino, seg)
            elif child.is_lnk:
                child = self._resolve(tx, ident, self._path_of(bucket, segments[: i + 1]), True)
            if not child.is_dir:
                shown = b"/".join(segments[: i + 1]).decode(errors="replace")
                raise FsError(errno.ENOTDIR, f"{shown!r} is an object, so it cannot also be a "
                              "prefix of other keys (objects 'a' and 'a/b' cannot both exist)")
            cur = child
        return cur

    @staticmethod
    def _path_of(bucket: str, segments: list[bytes]) -> bytes:
        return b"/".join([bucket.encode(), *segments])

    def _object(self, tx: MetaTxn, ident: Identity, bucket: str, key: str,
                action: str = "GetObject") -> Inode:
        """The inode of ``key`` with the POSIX checks of S3 action ``action``."""
        segments, marker = split_key(key)
        self._bucket_dir(tx, bucket)
        try:
            inode = self._resolve(tx, ident, self._path_of(bucket, segments), follow=True)
        except FsError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                raise FsError(errno.ENOENT, f"no such key {key!r}") from e
            raise
        if marker != inode.is_dir:
            raise FsError(errno.ENOENT, f"no such key {key!r}" + (
                " (it is a directory: its marker key ends with '/')" if inode.is_dir else ""))
        enforce(ident, action, obj=inode, key=key)  # HeadObject's checks are GetObject's
        return inode

    async def set_canned_acl(self, ident: Identity, bucket: str, key: str, name: str) -> Inode:
        """PutObjectAcl / PutBucketAcl (``key`` empty: the bucket's directory): the mode
        bits and access ACL of canned ACL ``name`` (:mod:`tierd.acl.canned`), in one
        transaction; only the owner or root (EPERM), as chmod."""
        async with self.meta.awrite() as tx:
            b = tx.get_bucket(bucket)
            if b is None:
                raise FsError(errno.ENOENT, f"bucket {bucket!r} does not exist")
            if key:
                segments, marker = split_key(key)
                inode = self._resolve(tx, ident, self._path_of(bucket, segments), follow=True)
                if marker != inode.is_dir:
                    raise FsError(errno.ENOENT, f"no such key {key!r}")
            else:
                inode = self._get(tx, b.ino)
            canned.apply_on_commit(ident, inode, name, b.owner_uid, key or bucket)
            inode.ctime_ns = now_ns()
            tx.put_inode(inode)
        of = self._open.get(inode.ino)
        if of is not None:
            of.privs = has_privs(inode.mode)
        await self._announce(Change(ino=inode.ino))
        await self._sync_meta()
        return inode

    # -- whole objects ---------------------------------------------------------------------
    async def head_object(self, ident: Identity, bucket: str, key: str) -> Inode:
        warm = functools.partial(path_reads, bucket=bucket, segments=split_key(key)[0])
        try:
            async with self.meta.asnapshot(warm=warm) as tx:
                inode = self._live(self._object(tx, ident, bucket, key))
        except FsError as e:
            if e.errno != errno.ENOENT or not key:
                raise
            await self.placement.refresh_key(bucket, key.rstrip("/"))  # put into cold?
            async with self.meta.asnapshot() as tx:
                inode = self._live(self._object(tx, ident, bucket, key))
        if inode.is_reg and not inode.etag:
            inode.etag = await self.etag(inode.ino)
        if inode.is_dir:
            inode.etag, inode.size = EMPTY_MD5, 0
        return inode

    async def get_object(
        self, ident: Identity, bucket: str, key: str, *, ensure: bool = True
    ) -> ObjectReader:
        """An open object.  With ``ensure`` (the default) the whole content
        is on the hot tier when this returns, so ``reader.fd`` can be sent as is; a door
        serving ranges passes ``ensure=False`` and calls ``await reader.ensure(off, n)``
        before reading ``fd`` itself (``iter`` ensures per chunk)."""
        inode = await self.head_object(ident, bucket, key)
        if not inode.is_reg and not inode.is_dir:
            raise FsError(errno.ENOENT, f"key {key!r} is not a regular file")
        return await self._reader(inode, ensure)

    async def _reader(self, inode: Inode, ensure: bool) -> ObjectReader:
        """``inode`` (a file, or a directory marker) open for reading (see get_object)."""
        if inode.is_dir:
            return ObjectReader(inode, -1)
        p = self.placement
        ino = inode.ino
        p.acquire(ino)  # no eviction under a reader (a door may sendfile from fd)
        reader = ObjectReader(inode, self.hot.open(ino),
                              _ensure=lambda off, n: p.ensure(ino, off, n),
                              _release=lambda: p.release(ino))
        if ensure:
            try:
                await reader.ensure()
            except BaseException:
                await reader.close()
                raise
        return reader

    async def put_object(
        self,
        ident: Identity,
        bucket: str,
        key: str,
        body: AsyncIterable[bytes],
        objmeta: dict[str, str] | None = None,
        *,
        if_match: str | None = None,
        if_none_match: str | None = None,
    ) -> Inode:
        """Store ``body`` as ``bucket/key`` atomically (see the module doc).

        ``objmeta`` is read only after the body is consumed, so a door may fill in values
        known only at the end (trailing checksums).  ``if_match`` (an ETag) and
        ``if_none_match`` (``"*"``) are checked inside the commit transaction: a failed
        condition raises with reason ``PreconditionFailed`` and leaves the old object."""
        segments, marker = split_key(key)
        warm = functools.partial(path_reads, bucket=bucket, segments=[])
        async with self.meta.asnapshot(warm=warm) as tx:  # fail fast, before the body
            self._bucket_dir(tx, bucket)
        refuse_over_dirty_limit(self.placement)
        if marker:
            chunks = aiter(body)
            async for chunk in chunks:
                if chunk:
                    await close_source(chunks)
                    raise FsError(errno.EINVAL, f"key {key!r} ends with '/', which names a "
                                  "directory marker: its body must be empty")
            async with self.meta.awrite() as tx:
                d = self._parent_dirs(tx, ident, bucket, segments, create=True, implicit=False)
                if d.objmeta.pop(IMPLICIT, None):
                    tx.put_inode(d)
                created = self._take_created()
            await self._announce(*created)  # the directories it created
            await self._sync_meta()
            return d
        ino = await self._alloc_ino()
        _, size, md5hex, logged = await stage_body(self.hot, body, install_as=ino,
                                                   smalllog=self.smalllog,
                                                   placement=self.placement)
        try:
            if if_match is not None or if_none_match is not None:
                await self._precondition_etag(ident, bucket, key)
        except BaseException:
            self.hot.remove(ino)
            raise
        return await self._publish_put(ident, bucket, key, segments, ino, size, md5hex,
                                       objmeta if objmeta is not None else {},
                                       if_match=if_match, if_none_match=if_none_match,
                                       logged=logged)

    async def put_file(self, ident: Identity, bucket: str, key: str, path: str, size: int,
                       etag: str = "", objmeta: dict[str, str] | None = None) -> Inode:
        """Publish a file the caller wrote and fsynced at ``path`` (inside the hot tier's
        staging directory, :meth:`HotDir.new_temp`) as ``bucket/key``, without reading it
        again: how the checkpoint service publishes gigabytes it copied out of the pool.
        An empty ``etag`` is computed on first use (:meth:`etag`), like a POSIX write's."""
        segments, marker = split_key(key)
        if marker:
            raise FsError(errno.EINVAL, f"key {key!r} names a directory marker, not a file")
        await self.placement.admit(size)  # dirty_limit: a background publisher waits
        return await self._install_put(ident, bucket, key, segments, path, size, etag,
                                       objmeta or {})

    async def _precondition_etag(self, ident: Identity, bucket: str, key: str) -> None:
        """Make sure the current object's ETag is known before a conditional commit."""
        try:
            await self.head_object(ident, bucket, key)
        except FsError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise

    async def _install_put(
        self, ident: Identity, bucket: str, key: str, segments: list[bytes], path: str,
        size: int, etag: str, objmeta: dict[str, str], *, if_match: str | None = None,
        if_none_match: str | None = None, in_txn: Callable[[MetaTxn], None] | None = None,
    ) -> Inode:
        """Swap a fsynced staging file in as ``bucket/key`` (the tail of every PUT).

        The data file takes its final name (a fresh inode number's) and that rename is made
        durable *before* the metadata commit: with group commit the metadata may reach disk
        at any moment after it, and it must never name a data file a crash could lose.
        ``in_txn`` runs first inside the commit transaction (multipart completion deletes
        its upload there, so the object and the upload never both exist); raising aborts."""
        ino = await self._alloc_ino()
        try:
            await asyncio.to_thread(self.hot.install_durable, path, ino)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        return await self._publish_put(ident, bucket, key, segments, ino, size, etag, objmeta,
                                       if_match=if_match, if_none_match=if_none_match,
                                       in_txn=in_txn)

    def _named(self, ino: int) -> bool:
        """After a failed or cancelled put commit: does committed metadata name ``ino``
        anyway?  (Over PostgreSQL a COMMIT whose connection broke may have been applied,
        and a commit once sent completes even if its caller is cancelled.)  Unknown counts
        as yes: an unnamed data file is a leak, a removed named one a lost object."""
        try:
            with self.meta.snapshot() as tx:
                return tx.get_stored_inode(ino) is not None
        except Exception:
            return True

    async def _publish_put(
        self, ident: Identity, bucket: str, key: str, segments: list[bytes], ino: int,
        size: int, etag: str, objmeta: dict[str, str], *, if_match: str | None = None,
        if_none_match: str | None = None, in_txn: Callable[[MetaTxn], None] | None = None,
        logged: bytes | None = None,
    ) -> Inode:
        """Commit an installed data file (inode ``ino``'s, durable) as ``bucket/key``;
        ``logged``: the file is only in the page cache and these are its bytes, logged in
        the same commit (:mod:`tierd.namespace.smalllog`)."""
        crashpoint("put.installed")
        try:
            inode, dropped, created = await self._commit_put(
                ident, bucket, key, segments, ino, size, etag, objmeta, if_match,
                if_none_match, in_txn, logged)
        except BaseException:
            if not self._named(ino):
                self.hot.remove(ino)
            raise
        crashpoint("put.committed")
        if logged is not None:
            self.smalllog.logged(ino, len(logged))
        for gone in dropped:
            self._forget_data(gone)
        await self._announce(*created, Change(ino=dropped[0] if dropped else None,
                                              parent=inode.parent, name=segments[-1]))
        inode.parent = 0
        await self._sync_meta()
        crashpoint("put.durable")
        await self._write_through(inode.ino)
        return inode

    async def _commit_put(
        self, ident: Identity, bucket: str, key: str, segments: list[bytes], ino: int,
        size: int, etag: str, objmeta: dict[str, str], if_match: str | None = None,
        if_none_match: str | None = None, in_txn: Callable[[MetaTxn], None] | None = None,
        logged: bytes | None = None,
    ) -> tuple[Inode, list[int], list[Change]]:
        """The PUT's transaction: its inode, the versions it dropped, the dirs it made."""
        warm = functools.partial(put_reads, bucket, segments, ino)
        async with self.meta.awrite(warm=warm) as tx:
            if in_txn is not None:
                in_txn(tx)
            d = self._parent_dirs(tx, ident, bucket, segments[:-1], create=True)
            name = segments[-1]
            old = self._child(tx, ident, d, name)
            _check_conditions(key, old, if_match, if_none_match)
            if old is not None and old.is_dir:
                raise FsError(errno.EISDIR, f"key {key!r} is a directory (it has keys below "
                              "it), so it cannot also be an object")
            enforce(ident, "PutObject", parent=d, obj=old if old is not None and old.is_reg
                    else None, key=key)
            inode = self._new_inode(tx, ident, d, stat.S_IFREG | 0o666,
                                    ino=ino, size=size, etag=etag, objmeta=dict(objmeta),
                                    state=STATE_DIRTY)
            self._inherit_acl(inode, d, self.umask | canned.S3_UMASK)  # private by default
            inode.version = tx.next_version()
            if old is not None:
                if old.is_reg:  # an overwrite keeps who owns the key, its mode and ACL
                    inode.uid, inode.gid, inode.mode = old.uid, old.gid, old.mode
                    inode.acl_access, inode.anon = old.acl_access, old.anon
                tx.remove_dirent(d.ino, name)
            # a versioned bucket keeps ``old`` as a noncurrent version (no G key)
            dropped = versions.supersede(self, tx, d, name, old, inode, stamp=True)
            acl = inode.objmeta.pop(canned.META_KEY, None)
            if acl is not None:  # x-amz-acl: the new object's mode and ACL, atomically
                bucket_owner = tx.get_bucket(bucket)
                canned.apply_on_commit(
                    ident, inode, acl,
                    bucket_owner.owner_uid if bucket_owner is not None else inode.uid, key)
            tx.put_inode(inode)
            tx.add_dirent(d.ino, name, Dirent(inode.ino, stat.S_IFREG))
            self._touch_dir(tx, d)
            self._queue(tx, inode)
            if logged is not None:
                tx.put_logged(inode.ino, inode.version, logged)
            created = self._take_created()
        inode.parent = d.ino  # (only in the returned copy) which directory changed
        return inode, dropped, created

    async def delete_object(self, ident: Identity, bucket: str, key: str) -> bool:
        """Remove a key; False when it did not exist (S3 answers success either way).
        Implicit parent directories left empty go too.  A missing bucket is ENOENT."""
        existed = await self._delete_one(ident, bucket, key)
        await self._sync_meta()
        return existed

    async def delete_objects(
        self, ident: Identity, bucket: str, keys: list[str]
    ) -> list[tuple[str, bool | FsError]]:
        """Delete many keys with one metadata sync: per key, existed or the error."""
        await self._bucket(bucket)
        out: list[tuple[str, bool | FsError]] = []
        for key in keys:
            try:
                out.append((key, await self._delete_one(ident, bucket, key)))
            except FsError as e:
                out.append((key, e))
        await self._sync_meta()
        return out

    async def _delete_one(self, ident: Identity, bucket: str, key: str) -> bool:
        segments, marker = split_key(key)
        drop: int | None = None
        async with self.meta.awrite() as tx:
            self._bucket_dir(tx, bucket)
            try:
                d = self._parent_dirs(tx, ident, bucket, segments[:-1], create=False)
            except FsError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    return False
                raise
            name = segments[-1]
            child = self._child(tx, ident, d, name)
            if child is None or child.is_dir != marker:
                return False
            if child.is_dir:
                if tx.has_children(child.ino):
                    return True  # the marker is implied by the keys below it
                enforce(ident, "DeleteObject", parent=d, obj=child, key=key)
                self._rmdir_locked(tx, d, name, child)
            else:
                enforce(ident, "DeleteObject", parent=d, obj=child, key=key)
                tx.remove_dirent(d.ino, name)
                self._touch_dir(tx, d)
                if self._unref(tx, child):
                    drop = child.ino
            pruned = self._prune_implicit(tx, d.ino)
        crashpoint("delete.committed")
        if drop is not None:
            self._forget_data(drop)
        await self._announce(Change(ino=child.ino, parent=d.ino, name=name), *pruned)
        return True

    def _prune_implicit(self, tx: MetaTxn, ino: int) -> list[Change]:
        """Remove implicit directories emptied by a delete, bottom up."""
        removed: list[Change] = []
        while True:
            d = tx.get_inode(ino)
            if d is None or not d.objmeta.get(IMPLICIT) or tx.has_children(ino):
                return removed
            parent = self._get(tx, d.parent)
            if parent.ino == ROOT_INO:
                return removed
            for name, _, dirent in tx.list_dirents(parent.ino):
                if dirent.ino == ino:
                    tx.remove_dirent(parent.ino, name)
                    removed.append(Change(ino=ino, parent=parent.ino, name=name))
                    break
            tx.delete_inode(ino)
            self._touch_dir(tx, parent, -1)
            ino = parent.ino
