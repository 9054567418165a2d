"""Object tags: a small key=value set stored with the object, not with its bytes.

Tags (S3's object tagging) are kept in the inode's object metadata under :data:`TAGS_META`,
as one URL-encoded query string (``k1=v1&k2=v2``, the form of S3's ``x-amz-tagging``
header), so they travel in the same metadata record, transaction and durability point as
the content type and user metadata.  Unlike a checksum they describe the object, not its
bytes: a write through the mount keeps them (:mod:`tierd.namespace.contentmeta` drops only
``tierd.s3.*`` and checksums), and changing them is not a new version -- the ETag, the
version number and the modification time stay, only ``ctime`` moves, as for ``setxattr``.
A new PUT of the key replaces the object and its metadata, tags included (as S3 does).

The key starts with ``tierd.`` so no door ever returns it as a header and a copy does not
take it along implicitly: CopyObject decides by its tagging directive.  Tags are not shown
as extended attributes on the mount (user metadata is not either); they are an S3 notion,
and ``user.*`` attributes belong to the POSIX side.

Which POSIX checks each tagging call needs is :mod:`tierd.acl.s3map`'s (read on the object to
read tags, write on it to change them, as ``getxattr``/``setxattr`` of ``user.*`` names).
"""

from __future__ import annotations

import errno
from urllib.parse import parse_qsl, quote, urlencode

from tierd.acl import Identity
from tierd.acl.s3map import enforce
from tierd.errors import FsError, Reason
from tierd.meta import Inode, MetaTxn
from tierd.namespace import versions
from tierd.namespace.base import Change, now_ns
from tierd.namespace.objects import ObjectOps
from tierd.namespace.versionops import DeleteMarkerHit

#: objmeta key of an object's tags (module doc)
TAGS_META = "tierd.tags"

Tags = list[tuple[str, str]]


def encode_tags(tags: Tags) -> str:
    """The stored form of ``tags``: a URL-encoded query string (order kept)."""
    return urlencode(tags, quote_via=quote)


def decode_tags(text: str) -> Tags:
    """The tags of a stored string (:func:`encode_tags`); empty for ""."""
    return parse_qsl(text, keep_blank_values=True) if text else []


def tags_of(inode: Inode) -> Tags:
    """The tags of ``inode`` (empty when it has none)."""
    return decode_tags(inode.objmeta.get(TAGS_META, ""))


def with_tags(objmeta: dict[str, str], tags: Tags) -> dict[str, str]:
    """``objmeta`` with its tags replaced by ``tags`` (removed when empty)."""
    out = {k: v for k, v in objmeta.items() if k != TAGS_META}
    if tags:
        out[TAGS_META] = encode_tags(tags)
    return out


class TagOps(ObjectOps):
    """Reading and replacing the tags of an existing object or of one of its versions."""

    async def _imported(self, bucket: str, key: str) -> None:
        """Before a second lookup of a key the namespace did not have: import it from the
        cold store when placement knows it (the same step as HeadObject's)."""
        if not key:
            raise FsError(errno.ENOENT, f"no such key {key!r}")
        await self.placement.refresh_key(bucket, key.rstrip("/"))

    def _tag_target(self, tx: MetaTxn, ident: Identity, bucket: str, key: str,
                    vid: str | None, action: str) -> Inode:
        """The inode of ``key`` (``vid`` None: the current object; else that version:
        NoSuchVersion, or a :class:`DeleteMarkerHit` for a marker), with the POSIX checks
        of S3 action ``action``."""
        if vid is None:
            return self._object(tx, ident, bucket, key, action)
        versions.require_bucket(tx, bucket)
        v = versions.find(tx, bucket, key, vid)
        if v is not None and v.marker:
            raise DeleteMarkerHit(v, latest=False)
        found = tx.get_inode(v.ino) if v is not None else None
        if found is not None:
            enforce(ident, action, obj=found, key=key)
            return found
        try:  # the current object's own version id (null for an unversioned one)
            cur = self._object(tx, ident, bucket, key, action)
        except FsError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
            cur = None
        if v is None and cur is not None and (versions.current_vid(cur) == vid
                                              or (cur.is_dir and vid == versions.NULL)):
            return cur
        raise FsError(errno.ENOENT, f"no version {vid} of {key!r}", reason=Reason.NO_SUCH_VERSION)

    async def tagged_object(self, ident: Identity, bucket: str, key: str,
                            vid: str | None = None) -> Inode:
        """GetObjectTagging: the inode whose tags (:func:`tags_of`) ``key`` (version ``vid``)
        has; ENOENT when there is no such key."""
        for attempt in (0, 1):
            try:
                async with self.meta.asnapshot() as tx:
                    return self._tag_target(tx, ident, bucket, key, vid, "GetObjectTagging")
            except FsError as e:
                if e.errno != errno.ENOENT or e.reason or vid is not None or attempt:
                    raise
                await self._imported(bucket, key)
        raise AssertionError("unreachable")

    async def set_object_tags(self, ident: Identity, bucket: str, key: str, tags: Tags,
                              action: str = "PutObjectTagging",
                              vid: str | None = None) -> Inode:
        """Put/DeleteObjectTagging: replace the tags of ``key`` (version ``vid``; ``tags``
        empty removes them), durable on return; the version, ETag and mtime stay (module
        doc)."""
        for attempt in (0, 1):
            try:
                async with self.meta.awrite() as tx:
                    inode = self._tag_target(tx, ident, bucket, key, vid, action)
                    inode.objmeta = with_tags(inode.objmeta, tags)
                    inode.ctime_ns = now_ns()
                    tx.put_inode(inode)
                break
            except FsError as e:
                if e.errno != errno.ENOENT or e.reason or vid is not None or attempt:
                    raise
                await self._imported(bucket, key)
        await self._announce(Change(ino=inode.ino))
        await self._sync_meta()
        return inode

    def peek_object_tags(self, bucket: str, key: str, vid: str | None = None) -> Tags | None:
        """The stored tags of ``key`` (version ``vid``) without permission checks, None when
        there is no such key or version: for bucket-policy conditions
        (``s3:ExistingObjectTag/<key>``), which S3 judges on the object's tags whoever asks,
        before the request's own checks run."""
        try:
            with self.meta.snapshot() as tx:
                return tags_of(self._tag_target(tx, Identity.ROOT, bucket, key, vid,
                                                "GetObjectTagging"))
        except FsError:
            return None
