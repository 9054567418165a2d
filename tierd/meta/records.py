"""Typed records stored by the metadata engine, with their compact msgpack encodings.

Records are encoded as msgpack arrays in field order.  New fields are only ever appended
with a default, so an older record decodes into a newer class; anything else bumps
``SCHEMA_VERSION`` in :mod:`tierd.meta.store` with a migration.
"""

from __future__ import annotations

import stat as statmod
from dataclasses import dataclass, field, fields
from typing import Any, Self

import msgpack

# Persistence state of a file's content (DESIGN.md "File states").
STATE_NONE = 0  # directories, symlinks, empty files: nothing to persist
STATE_DIRTY = 1  # content only on local tiers
STATE_PERSISTING = 2  # an upload of this version is in flight
STATE_CLEAN = 3  # the cold tier has this version
#: the MD5 of nothing: the ETag of every empty file and object (kept, never computed)
EMPTY_MD5 = "d41d8cd98f00b204e9800998ecf8427e"


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


class Record:
    """Mixin: msgpack array encoding tolerant of appended fields.

    Encoding reads the fields directly (``dataclasses.astuple`` deep-copies every dict and
    list first: ~50 us per inode, paid on every commit)."""

    def encode(self) -> bytes:
        values = [getattr(self, n) for n in _names(type(self))]
        packed: bytes = msgpack.packb(values, use_bin_type=True)
        return packed

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        values: list[Any] = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        return cls(*values[: len(_names(cls))])


@dataclass(slots=True)
class Inode(Record):
    """One file, directory or symlink.  Times are nanoseconds since the epoch."""

    ino: int
    mode: int  # file type and permission bits, as st_mode
    uid: int
    gid: int
    size: int = 0
    nlink: int = 1
    atime_ns: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    btime_ns: int = 0
    version: int = 0  # content generation: changes whenever the bytes change
    etag: str = ""  # MD5 hex of the content ("" until computed), or md5-N for multipart
    state: int = STATE_NONE
    # tier name -> bitmap of present blocks (bit i = block i), kept by tierd.placement
    blocks: dict[str, bytes] = field(default_factory=dict)
    rdev: int = 0
    parent: int = 0  # directories only: the one parent, for ".." and rename cycle checks
    target: bytes = b""  # symlinks only
    # S3 system and user metadata (content-type, x-amz-meta-*, checksums), set by the doors
    objmeta: dict[str, str] = field(default_factory=dict)
    # POSIX ACLs as the kernel's xattr blobs (tierd.acl.posix_acl), "" when the mode says
    # it all; kept on the inode so every permission check has them without another read
    acl_access: bytes = b""
    acl_default: bytes = b""  # directories only: what new entries inherit
    # what unsigned S3 requests may do (R/W/X bits, as in a mode's "other" class, and never
    # more than those bits give: tierd.acl.modes); set by the public-read(-write) canned ACLs
    anon: int = 0
    # in a cluster: the node that wrote the current version and holds its bytes until they
    # are in cold ("" on a single node; tierd.meta.nodes)
    home: str = ""

    @property
    def is_dir(self) -> bool:
        return statmod.S_ISDIR(self.mode)

    @property
    def is_reg(self) -> bool:
        return statmod.S_ISREG(self.mode)

    @property
    def is_lnk(self) -> bool:
        return statmod.S_ISLNK(self.mode)

    @property
    def perm(self) -> int:
        return statmod.S_IMODE(self.mode)


@dataclass(slots=True)
class Dirent(Record):
    """A name in a directory pointing at an inode; ``kind`` is the S_IFMT bits of the target."""

    ino: int
    kind: int


@dataclass(slots=True)
class Bucket(Record):
    """A top-level directory that S3 sees as a bucket."""

    name: str
    ino: int
    owner_uid: int
    created_ns: int
    region: str = "us-east-1"
    policy: str = ""  # bucket policy JSON (tierd.s3.bucket_policy, tierd.acl.policy)
    acl: str = "private"
    #: the bucket's other S3 sub-resources (versioning, cors, tagging, lifecycle,
    #: publicAccessBlock, ownershipControls, ...): name -> the document as stored by the
    #: module that owns it (:mod:`tierd.namespace.bucketconf`)
    config: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class AccessKey(Record):
    """An S3 access key and the identity it maps to (kept by :mod:`tierd.acl.users`)."""

    access_key: str
    secret: str
    uid: int
    gid: int
    groups: list[int] = field(default_factory=list)
    user: str = ""
    enabled: bool = True
    admin: bool = False
    created_ns: int = 0
    #: the secret encrypted at rest (:mod:`tierd.acl.secrets`); ``secret`` is then "" in the
    #: store and filled in memory by :class:`tierd.acl.keys.KeyStore` after decryption.
    #: Records from before encryption carry ``secret`` in clear until the start-up migration.
    secret_enc: bytes = b""


@dataclass(slots=True)
class User(Record):
    """A tierd user (``N<name>`` keys): the POSIX identity every access key of the user maps
    to, and whether the user may call the admin API with a signed request."""

    name: str
    uid: int
    gid: int
    groups: list[int] = field(default_factory=list)
    admin: bool = False
    created_ns: int = 0


@dataclass(slots=True)
class MultipartUpload(Record):
    """An in-progress multipart upload; its parts are :class:`UploadPart` records."""

    upload_id: str
    bucket: str
    key: str
    uid: int
    gid: int
    initiated_ns: int
    objmeta: dict[str, str] = field(default_factory=dict)
    # in a cluster: the node whose hot tier holds the parts ("" on a single node)
    node: str = ""


@dataclass(slots=True)
class UploadPart(Record):
    """One uploaded part of a multipart upload; its bytes are in the upload's directory of the
    hot tier.  Parts are separate records so uploading part N rewrites nothing of parts
    1..N-1.  Where the bytes are (see :mod:`tierd.namespace.mpu_parts`): with ``slot_size``
    > 0 in the upload's data file at ``(number - 1) * slot_size`` (so completing can rename
    that file into place without copying), else in the file named ``file``, else (records
    written before these fields existed) in the file named after the part number; on the
    hot tier of node ``node`` (:mod:`tierd.namespace.mpu_remote`)."""

    number: int
    etag: str  # MD5 hex of the part
    size: int
    mtime_ns: int
    checksums: dict[str, str] = field(default_factory=dict)
    slot_size: int = 0
    file: str = ""
    # in a cluster: the node whose hot tier holds the bytes ("" = the upload's own ``node``,
    # as every part was before parts could be uploaded through any node)
    node: str = ""


@dataclass(slots=True)
class ColdRecord(Record):
    """What the cold store holds for one inode (``R`` keys): the content ``version`` last
    uploaded, its ``size``, and every key it was stored under with that key's ETag (a
    multipart server-side copy gets a different ETag than its source).  Kept after the inode
    is deleted until the persister has deleted those objects, so nothing leaks in cold."""

    version: int
    size: int
    keys: dict[str, str] = field(default_factory=dict)  # "<bucket>/<key>" -> ETag
    mtime_ns: int = 0


@dataclass(slots=True)
class PlacementPolicy(Record):
    """Per-prefix placement policy (``Y`` keys): how content under the prefix is persisted
    (``write-back``, ``write-through``, ``cache-only``), whether its blocks are pinned on
    the hot tier, and the tier new data lands on."""

    prefix: str
    mode: str = "write-back"
    pin: bool = False
    tier: str = "hot"
