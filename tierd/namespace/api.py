"""The namespace API: every call the doors make on the namespace, in one place.

The doors -- the FUSE mount (``fuse/``), the S3 gateway (``tierd/s3/``), the admin API
(``tierd/admin/``), the checkpoint service (``tierd/checkpoint/``) and the pool socket --
hold a :class:`NamespaceAPI` and import the namespace's value types from here (or from
:mod:`tierd.namespace`, which re-exports them).  What stands behind it -- the metadata
store, the hot data files, the placement engine, open-file state -- is the namespace's
own and may change without a door noticing; ``tests/test_layering.py`` fails when a door
reaches behind it.  :class:`tierd.namespace.Namespace` is the one implementation (mypy
checks that it satisfies this Protocol: ``tierd/namespace/__init__.py``).

Conventions shared by every call: ``ident`` is the caller as the door authenticated it
(permissions are checked here, with :mod:`tierd.acl`); refusals raise
:class:`~tierd.errors.FsError` with an errno (and an S3 ``reason`` where S3 has a name for
it); names are bytes on the POSIX side and ``str`` keys (``surrogateescape`` for non-UTF-8
bytes) on the object side; a call returns once its change is durable unless it says
otherwise (writes through an open file become durable at flush, fsync and release).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from tierd.acl import Identity
from tierd.errors import FsError
from tierd.meta import ROOT_INO, Bucket, Inode, MultipartUpload, UploadPart
from tierd.namespace.base import Change, Notified, StatFs
from tierd.namespace.bucketconf import BucketConfig
from tierd.namespace.crashpoint import crashpoint
from tierd.namespace.entries import RENAME_EXCHANGE, RENAME_NOREPLACE, UTIME_NOW
from tierd.namespace.keylisting import Listing
from tierd.namespace.lifecycle import CONFIG_NAME as LIFECYCLE_CONFIG
from tierd.namespace.lifecycle import Filter as LifecycleFilter
from tierd.namespace.lifecycle import Rule as LifecycleRule
from tierd.namespace.lifecycle import decode as decode_lifecycle
from tierd.namespace.lifecycle import encode as encode_lifecycle
from tierd.namespace.mpu_parts import Hasher, Payload
from tierd.namespace.names import check_bucket_name, split_key
from tierd.namespace.objects import ObjectReader
from tierd.namespace.staging import close_source
from tierd.namespace.tags import TAGS_META, Tags, decode_tags, encode_tags, tags_of
from tierd.namespace.versionops import Deleted, DeleteMarkerHit, VersionInfo, VersionListing
from tierd.namespace.versions import CONFIG as VERSIONING_CONFIG
from tierd.namespace.versions import ENABLED, SUSPENDED, Version, current_vid, valid_vid
from tierd.namespace.xattrs import XATTR_CREATE, XATTR_REPLACE

__all__ = [
    "ENABLED",
    "LIFECYCLE_CONFIG",
    "RENAME_EXCHANGE",
    "RENAME_NOREPLACE",
    "ROOT_INO",
    "SUSPENDED",
    "TAGS_META",
    "UTIME_NOW",
    "VERSIONING_CONFIG",
    "XATTR_CREATE",
    "XATTR_REPLACE",
    "Bucket",
    "BucketConfig",
    "Change",
    "DeleteMarkerHit",
    "Deleted",
    "FsError",
    "Hasher",
    "Inode",
    "LifecycleFilter",
    "LifecycleRule",
    "Listing",
    "MultipartUpload",
    "NamespaceAPI",
    "ObjectReader",
    "Payload",
    "StatFs",
    "Tags",
    "UploadPart",
    "Version",
    "VersionInfo",
    "VersionListing",
    "check_bucket_name",
    "close_source",
    "crashpoint",
    "current_vid",
    "decode_lifecycle",
    "decode_tags",
    "encode_lifecycle",
    "encode_tags",
    "split_key",
    "tags_of",
    "valid_vid",
]


class NamespaceAPI(Protocol):
    """What a door may call on the namespace, grouped by concern."""

    # -- durability and notifications ----------------------------------------------------
    async def sync(self) -> None:
        """Make every metadata change so far durable (fsync of a directory; shared flush)."""
        ...

    def subscribe(self, callback: Callable[[Change], Notified]) -> None:
        """Call ``callback`` on the loop after each object-door change (cache invalidation);
        the call waits for the awaitable it may return before it answers."""
        ...

    def unsubscribe(self, callback: Callable[[Change], Notified]) -> None:
        """Stop calling a callback given to :meth:`subscribe` (a door that closes)."""
        ...

    # -- entries (POSIX tree) --------------------------------------------------------------
    async def lookup(self, ident: Identity, parent: int, name: bytes,
                     bounded: bool = False) -> Inode:
        """The inode named ``name`` in directory ``parent`` (ENOENT when there is none);
        ``bounded``: an answer as new as the change feed's suffices (a FUSE lookup, whose
        kernel caches entries anyway: :mod:`tierd.meta.pg_quiet`)."""
        ...

    async def getattr(self, ident: Identity, ino: int, bounded: bool = False) -> Inode:
        """The inode with the live size and times of unflushed writes (``bounded``: as
        for :meth:`lookup`)."""
        ...

    async def access(self, ident: Identity, ino: int, mask: int) -> None:
        """access(2): raise EACCES unless ``ident`` has the ``R_OK|W_OK|X_OK`` of ``mask``."""
        ...

    async def readlink(self, ident: Identity, ino: int) -> bytes:
        """A symbolic link's target."""
        ...

    async def listdir(
        self, ident: Identity, ino: int, start_after: bytes = b"", limit: int | None = None
    ) -> list[tuple[bytes, Inode]]:
        """Entries after ``start_after`` in S3 key order (a directory sorts as ``name/``)."""
        ...

    async def resolve(self, ident: Identity, path: str, follow: bool = True) -> Inode:
        """The inode at ``bucket/dir/file`` from the root, checking search permission."""
        ...

    async def statfs(self) -> StatFs:
        """Capacity and inode counts of the file system (statvfs)."""
        ...

    async def setattr(
        self,
        ident: Identity,
        ino: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
        fh: int | None = None,
        killpriv: Callable[[], bool] | None = None,
    ) -> Inode:
        """chmod/chown/truncate/utimens in one call, with Linux's ownership rules."""
        ...

    async def mknod(
        self, ident: Identity, parent: int, name: bytes, mode: int, rdev: int = 0,
        umask: int = 0,
    ) -> Inode:
        """A regular file, FIFO, socket or device node (no data: mknod(2))."""
        ...

    async def mkdir(
        self, ident: Identity, parent: int, name: bytes, mode: int, umask: int = 0
    ) -> Inode:
        """A directory; ``umask`` applies unless the parent has a default ACL."""
        ...

    async def symlink(self, ident: Identity, parent: int, name: bytes, target: bytes) -> Inode:
        """A symbolic link to ``target``."""
        ...

    async def link(self, ident: Identity, ino: int, new_parent: int, new_name: bytes) -> Inode:
        """A hard link: another name for ``ino``."""
        ...

    async def unlink(self, ident: Identity, parent: int, name: bytes) -> None:
        """Remove a non-directory name (the data goes when no name or handle holds it)."""
        ...

    async def rmdir(self, ident: Identity, parent: int, name: bytes) -> None:
        """Remove an empty directory."""
        ...

    async def rename(
        self,
        ident: Identity,
        old_parent: int,
        old_name: bytes,
        new_parent: int,
        new_name: bytes,
        flags: int = 0,
    ) -> None:
        """rename(2)/renameat2(2): atomic replace, RENAME_NOREPLACE, RENAME_EXCHANGE."""
        ...

    # -- open files ------------------------------------------------------------------------
    async def create(
        self, ident: Identity, parent: int, name: bytes, mode: int, flags: int,
        umask: int = 0, *, kernel_writes: bool = False,
    ) -> tuple[Inode, int]:
        """open(2) with O_CREAT: the inode and a file handle (``kernel_writes``: the FUSE
        door's write passthrough will write a new file: its intention comes with it)."""
        ...

    async def open(self, ident: Identity, ino: int, flags: int) -> int:
        """Open an existing file (O_TRUNC truncates); a file handle."""
        ...

    async def open_file(self, ident: Identity, ino: int, flags: int) -> tuple[int, Inode]:
        """:meth:`open`, with the inode as the new handle sees it (its content version)."""
        ...

    async def read(self, fh: int, offset: int, size: int) -> bytes | bytearray:
        """Bytes of an open file (read back from cold first where hot lacks them)."""
        ...

    async def write(self, fh: int, offset: int, data: bytes | memoryview) -> int:
        """Write through a handle; durable at the next flush, fsync or release."""
        ...

    async def flush(self, fh: int) -> int | None:
        """close(2) of a descriptor: the handle's writes become durable; the content
        version this call committed (None when there was nothing to commit)."""
        ...

    async def fsync(self, fh: int, datasync: bool = False) -> int | None:
        """fsync(2): the file's writes and metadata become durable; the content version
        this call committed (None when there was nothing to commit)."""
        ...

    async def release(self, fh: int) -> int | None:
        """The last close of a handle: durable, then the handle is gone; the content
        version this call committed (None when there was nothing to commit)."""
        ...

    def advise_read(self, fh: int, offset: int, length: int) -> None:
        """Start reading a range of an open file ahead (fire and forget: read-ahead)."""
        ...

    def hot_fd(self, fh: int) -> int | None:
        """The handle's hot data file descriptor when the file is whole on hot (passthrough)."""
        ...

    async def passthrough_open(self, fh: int, join: bool = False) -> int | None:
        """A writable handle's hot data file descriptor for the kernel to write directly,
        after the in-place write rules are applied for all writes to come; None: refused.
        ``join``: passthrough readers hold the inode (a writer refused would wait for them
        and fail ``ETXTBSY``), so set-id bits do not refuse it: the door watches them."""
        ...

    async def passthrough_readable(self, fh: int) -> bool:
        """A read-only handle may be read through the kernel: a writer could pass through."""
        ...

    def passthrough_sync(self, fh: int, wrote: bool = True) -> None:
        """The kernel may have written the handle's hot file: take its size (and mtime)."""
        ...

    def passthrough_close(self, fh: int) -> None:
        """The kernel writes no more through the handle (before its release)."""
        ...

    async def passthrough_room(self) -> int:
        """Evict clean data when the hot tier's free space is below the headroom that
        passthrough writers need; the bytes evicted."""
        ...

    # -- extended attributes ---------------------------------------------------------------
    async def getxattr(self, ident: Identity, ino: int, name: bytes,
                       bounded: bool = False) -> bytes:
        """One extended attribute (ENODATA when unset); ``bounded``: as for :meth:`lookup`
        (the kernel's ``security.capability`` probe before a file's first write)."""
        ...

    async def setxattr(
        self, ident: Identity, ino: int, name: bytes, value: bytes, flags: int = 0
    ) -> None:
        """Set one (XATTR_CREATE / XATTR_REPLACE); POSIX ACLs change the mode too."""
        ...

    async def listxattr(self, ident: Identity, ino: int) -> list[bytes]:
        """The names of the inode's extended attributes."""
        ...

    async def removexattr(self, ident: Identity, ino: int, name: bytes) -> None:
        """Remove one extended attribute."""
        ...

    # -- buckets and objects ---------------------------------------------------------------
    async def create_bucket(self, ident: Identity, name: str) -> Inode:
        """A bucket (a directory under the root) under S3's naming rules."""
        ...

    async def delete_bucket(self, ident: Identity, name: str) -> None:
        """Remove an empty bucket (no keys, versions or delete markers left)."""
        ...

    async def list_buckets(self, ident: Identity) -> list[Bucket]:
        """Every bucket's record."""
        ...

    async def get_bucket(self, name: str) -> Bucket:
        """One bucket's record (ENOENT when it does not exist)."""
        ...

    @property
    def bucket_config(self) -> BucketConfig:
        """Per-bucket configuration documents (CORS, lifecycle, policy blocks ...)."""
        ...

    async def set_canned_acl(self, ident: Identity, bucket: str, key: str, name: str) -> Inode:
        """PutObjectAcl / PutBucketAcl (``key`` empty): mode bits and ACL of a canned ACL."""
        ...

    def check_put_allowed(self, ident: Identity, bucket: str, segments: list[bytes]) -> None:
        """Would a PUT of this key be allowed now?  Asked before a door reads the body."""
        ...

    async def head_object(self, ident: Identity, bucket: str, key: str) -> Inode:
        """The current inode of ``key`` (GetObject's permission checks)."""
        ...

    async def get_object(
        self, ident: Identity, bucket: str, key: str, *, ensure: bool = True
    ) -> ObjectReader:
        """``key`` open for reading (with ``ensure``, whole on hot before it returns)."""
        ...

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
        """Store ``body`` as ``bucket/key`` atomically (with ETag preconditions)."""
        ...

    async def put_file(self, ident: Identity, bucket: str, key: str, path: str, size: int,
                       etag: str = "", objmeta: dict[str, str] | None = None) -> Inode:
        """Publish a fsynced file from :meth:`staging_file` as ``bucket/key``, no copy."""
        ...

    async def copy_object(
        self,
        ident: Identity,
        src_bucket: str,
        src_key: str,
        dst_bucket: str,
        dst_key: str,
        objmeta: dict[str, str] | None = None,
        *,
        src_ident: Identity | None = None,
        src_version: str | None = None,
    ) -> Inode:
        """Server-side copy; ``objmeta`` None keeps the source's metadata."""
        ...

    async def delete_object(self, ident: Identity, bucket: str, key: str) -> bool:
        """The plain delete (a delete marker when versioned); False when nothing was there."""
        ...

    async def delete_objects(
        self, ident: Identity, bucket: str, keys: list[str]
    ) -> list[tuple[str, bool | FsError]]:
        """Many plain deletes with one metadata sync: per key, existed or the error."""
        ...

    async def list_objects(
        self,
        ident: Identity,
        bucket: str,
        prefix: str = "",
        start_after: str = "",
        delimiter: str = "",
        limit: int = 1000,
    ) -> Listing:
        """One page of keys in S3 order (ListObjects/ListObjectsV2)."""
        ...

    # -- multipart uploads -----------------------------------------------------------------
    async def create_multipart(
        self, ident: Identity, bucket: str, key: str, objmeta: dict[str, str] | None = None
    ) -> MultipartUpload:
        """Start an upload of ``bucket/key``."""
        ...

    async def upload_part(
        self, ident: Identity, upload_id: str, number: int,
        body: AsyncIterable[bytes] | Payload, checksums: dict[str, str] | None = None,
    ) -> UploadPart:
        """Store part ``number`` (a :class:`Payload` is hashed and verified as it is written)."""
        ...

    async def upload_part_copy(
        self, ident: Identity, upload_id: str, number: int, src_bucket: str, src_key: str,
        byte_range: tuple[int, int] | None = None, checksums: dict[str, str] | None = None,
        *, src_ident: Identity | None = None, src_version: str | None = None,
    ) -> UploadPart:
        """A part copied from an existing object (``byte_range`` inclusive)."""
        ...

    async def list_parts(
        self, ident: Identity, upload_id: str, after: int = 0, limit: int = 1000
    ) -> tuple[MultipartUpload, list[UploadPart], bool]:
        """The upload, one page of its parts after part ``after``, and whether more follow."""
        ...

    async def list_multipart_uploads(
        self, ident: Identity, bucket: str, prefix: str = "", key_marker: str = "",
        upload_id_marker: str = "", limit: int = 1000,
    ) -> tuple[list[MultipartUpload], bool]:
        """A bucket's uploads in (key, initiation) order after the markers."""
        ...

    async def get_upload(self, ident: Identity, upload_id: str, *,
                         bucket_owner: bool = False) -> MultipartUpload:
        """One upload (NoSuchUpload when unknown, EACCES when another user's)."""
        ...

    async def abort_multipart(self, ident: Identity, upload_id: str) -> None:
        """Drop an upload and its parts."""
        ...

    async def complete_multipart(
        self, ident: Identity, upload_id: str, parts: list[tuple[int, str]],
        objmeta: dict[str, str] | None = None, *, if_match: str | None = None,
        if_none_match: str | None = None,
    ) -> Inode:
        """Assemble the listed parts into the object (ETag MD5-of-MD5s-N)."""
        ...

    # -- versions and tags -----------------------------------------------------------------
    def versioning(self, bucket: str) -> str:
        """``""`` (never enabled), ``Enabled`` or ``Suspended``; ENOENT without the bucket."""
        ...

    async def set_versioning(self, bucket: str, status: str) -> None:
        """Enable or suspend versioning (never back to unversioned)."""
        ...

    def latest_marker(self, bucket: str, key: str) -> Version | None:
        """The delete marker that is the latest version of ``key``, if one is."""
        ...

    def current_version(self, ident: Identity, bucket: str, key: str) -> Inode | None:
        """The current (plain) inode of ``key``, None when there is none."""
        ...

    async def head_version(self, ident: Identity, bucket: str, key: str, vid: str) -> Inode:
        """Version ``vid`` of ``key`` (NoSuchVersion; a marker raises DeleteMarkerHit)."""
        ...

    async def get_version(self, ident: Identity, bucket: str, key: str, vid: str, *,
                          ensure: bool = True) -> ObjectReader:
        """Version ``vid`` of ``key`` open for reading."""
        ...

    async def delete_version(self, ident: Identity, bucket: str, key: str,
                             vid: str | None) -> Deleted:
        """A versioned DELETE: a marker without ``vid``, else that version removed."""
        ...

    async def delete_versions(self, ident: Identity, bucket: str,
                              items: list[tuple[str, str | None]]
                              ) -> list[Deleted | FsError]:
        """Many versioned deletes with one metadata sync (DeleteObjects)."""
        ...

    async def list_versions(self, ident: Identity, bucket: str, prefix: str = "",
                            key_marker: str = "", vid_marker: str = "",
                            delimiter: str = "", limit: int = 1000) -> VersionListing:
        """One page of ListObjectVersions."""
        ...

    async def tagged_object(self, ident: Identity, bucket: str, key: str,
                            vid: str | None = None) -> Inode:
        """The inode whose tags GetObjectTagging answers (:func:`tags_of`)."""
        ...

    async def set_object_tags(self, ident: Identity, bucket: str, key: str, tags: Tags,
                              action: str = "PutObjectTagging",
                              vid: str | None = None) -> Inode:
        """Replace the tags of ``key`` (version ``vid``); empty ``tags`` removes them."""
        ...

    def peek_object_tags(self, bucket: str, key: str, vid: str | None = None) -> Tags | None:
        """The stored tags without permission checks (policy conditions), None if no key."""
        ...

    # -- where bytes live (checkpoints) ----------------------------------------------------
    def staging_file(self) -> tuple[str, int]:
        """A new empty file on hot, (path, descriptor), to fill and :meth:`put_file`."""
        ...

    def publishing(self, prefix: str) -> AbstractContextManager[None]:
        """While open, the persister leaves ``prefix`` (written only to be renamed) alone."""
        ...

    async def open_held(self, ino: int) -> tuple[int, str]:
        """A read-only descriptor of the file whole on hot, held; and ``hot`` or ``cold``."""
        ...

    def hold(self, ino: int) -> None:
        """Keep the file's bytes on hot (no eviction) until :meth:`release_held`."""
        ...

    def release_held(self, ino: int) -> None:
        """Let go of one hold of :meth:`open_held` or :meth:`hold`."""
        ...

    async def evict_hot(self, ino: int) -> None:
        """Drop the file's bytes from hot when cold has them."""
        ...

    async def wait_persisted(self, ino: int) -> None:
        """Return once the file's current content is in cold."""
        ...

    def all_persisted(self, inos: list[int]) -> bool:
        """Whether ``inos`` is not empty and none of them waits for the persister."""
        ...

    async def cold_size(self, key: str) -> int | None:
        """The size of ``bucket/key`` in the cold store, None when it has none."""
        ...

    async def cold_read(self, key: str, offset: int, length: int) -> bytes:
        """Bytes of ``bucket/key`` as the cold store has them."""
        ...

    # -- import ----------------------------------------------------------------------------
    async def import_prefix(self, prefix: str) -> None:
        """Make the cold store's objects under ``bucket/prefix`` names here now."""
        ...

    # -- memory pool records ---------------------------------------------------------------
    def pool_quotas(self) -> dict[int, int]:
        """The memory pool's stored per-tenant (uid) quotas, in bytes."""
        ...

    async def set_pool_quota(self, tenant: int, nbytes: int) -> None:
        """Store a tenant's pool quota (``0`` removes it); durable on return."""
        ...


def iter_api_methods() -> Iterator[str]:
    """The names :class:`NamespaceAPI` declares (what ``tests/test_layering.py`` allows a
    door to call on a namespace)."""
    for name, value in vars(NamespaceAPI).items():
        if not name.startswith("_") and (callable(value) or isinstance(value, property)):
            yield name
