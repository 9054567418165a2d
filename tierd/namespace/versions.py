"""Bucket versioning records: noncurrent versions and delete markers in the metadata store.

The current version of a key stays the plain inode at ``<bucket>/<key>`` (what the mount
shows, what the cold store's transparent layout holds).  Everything older is a record:

==============================================  =========================================
``H<bucket>\\0<key head>\\0<u64 MAX - seq>``     :class:`Version` (msgpack: key, inode or 0
                                                for a delete marker, null flag, time, uid)
``J<ino>``                                      the record key naming inode ``ino`` (the
                                                cold store's path for it, :func:`cold_keys`)
==============================================  =========================================

``seq`` is the inode's content version (``tx.next_version()``, one global counter), so records
of one key sort newest first and a version id -- ``MAX - seq`` as 16 hex digits -- is
unique, sortable and opaque.  A version id ``null`` is kept in the record (objects from
before versioning was enabled, and writes while it is suspended).  A key longer than
:data:`HEAD` bytes is cut and followed by a digest, as the cold-delete intentions do.

**Durability.**  The transaction that supersedes a current version (a PUT over it, an S3
DELETE, an unlink or a rename over it through the mount) writes its record *instead of* the
``G<ino>`` garbage key (:mod:`tierd.namespace.garbage`): the inode keeps ``nlink`` 1 (its
one name is the record) and its data file stays.  Only a permanent delete of the version
(DELETE with ``versionId``, lifecycle expiry, a ``null`` version replaced) drops the inode
and writes the ``G`` key, in the transaction that removes the record.

**Cold store.**  A noncurrent version's cold key is ``<bucket>/.tierd-versions/<key>/<vid>``
(:func:`cold_keys`, used by :func:`tierd.placement.paths.file_keys`; the importer skips that
prefix).  Retiring a version is, for placement, a rename of the inode to that key: the
persister copies the object there before the pending delete of the plain key runs, and a new
current version's upload rescues the old bytes first (``placement/deletes.py``).
"""

from __future__ import annotations

import errno
import hashlib
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgpack

from tierd.errors import FsError
from tierd.meta import Inode, MetaTxn
from tierd.meta.kv import prefix_end
from tierd.placement.paths import VERSIONS_DIR, dir_path

if TYPE_CHECKING:
    from tierd.namespace.entries import EntryOps

PREFIX = b"H"
BACK = b"J"
HEAD = 400
NULL = "null"
FLAG = "tierd.versioned"  # objmeta of a current inode that has a real version id
ENABLED, SUSPENDED = "Enabled", "Suspended"
CONFIG = "versioning"  # the bucket configuration document (tierd.namespace.bucketconf)
_MAX = (1 << 64) - 1
_U64 = struct.Struct(">Q")
_HEX = frozenset("0123456789abcdef")


def vid_of(seq: int) -> str:
    """The version id of content version ``seq`` (newer sorts first)."""
    return f"{_MAX - seq:016x}"


def seq_of(vid: str) -> int | None:
    """The content version a non-null version id names; None when malformed."""
    if len(vid) != 16 or not set(vid) <= _HEX:
        return None
    return _MAX - int(vid, 16)


def valid_vid(vid: str) -> bool:
    return vid == NULL or seq_of(vid) is not None


def current_vid(inode: Inode) -> str:
    """The version id of a current (plain) inode."""
    return vid_of(inode.version) if inode.objmeta.get(FLAG) else NULL


@dataclass(slots=True)
class Version:
    """One noncurrent version (``ino`` its inode) or delete marker (``ino`` 0) of a key."""

    key: str
    vid: str
    seq: int
    ino: int
    mtime_ns: int
    uid: int

    @property
    def marker(self) -> bool:
        return self.ino == 0

    @property
    def null(self) -> bool:
        return self.vid == NULL


def _key_head(key: str) -> bytes:
    raw = key.encode("utf-8", "surrogateescape")
    if len(raw) <= HEAD:
        return raw
    return raw[:HEAD] + hashlib.sha256(raw).digest()[:16]


def _base(bucket: str, key: str) -> bytes:
    return PREFIX + bucket.encode() + b"\0" + _key_head(key) + b"\0"


def _rkey(bucket: str, v: Version) -> bytes:
    return _base(bucket, v.key) + _U64.pack(_MAX - v.seq)


def _decode(rk: bytes, raw: bytes) -> Version:
    key, ino, null, t, uid = msgpack.unpackb(raw)
    seq = _MAX - int(_U64.unpack(rk[-8:])[0])
    return Version(key, NULL if null else vid_of(seq), seq, ino, t, uid)


def put(tx: MetaTxn, bucket: str, v: Version) -> None:
    rk = _rkey(bucket, v)
    tx.kv.put(rk, msgpack.packb([v.key, v.ino, v.null, v.mtime_ns, v.uid]))
    if v.ino:
        tx.kv.put(BACK + _U64.pack(v.ino), rk)


def remove(tx: MetaTxn, bucket: str, v: Version) -> None:
    tx.kv.delete(_rkey(bucket, v))
    if v.ino:
        tx.kv.delete(BACK + _U64.pack(v.ino))


def of_key(tx: MetaTxn, bucket: str, key: str) -> list[Version]:
    """The records of ``key``, newest first."""
    base = _base(bucket, key)
    out = []
    for rk, raw in tx.kv.scan(base, prefix_end(base)):
        v = _decode(rk, raw)
        if v.key == key:
            out.append(v)
    return out


def find(tx: MetaTxn, bucket: str, key: str, vid: str) -> Version | None:
    """The record of ``key`` with version id ``vid`` (a point read unless ``null``)."""
    if vid == NULL:
        return next((v for v in of_key(tx, bucket, key) if v.null), None)
    seq = seq_of(vid)
    if seq is None:
        return None
    rk = _base(bucket, key) + _U64.pack(_MAX - seq)
    raw = tx.kv.get(rk)
    if raw is None:
        return None
    v = _decode(rk, raw)
    return v if v.key == key and not v.null else None


def scan(tx: MetaTxn, bucket: str, prefix: str = "", after: bytes | None = None
         ) -> Iterator[Version]:
    """Records of keys starting with ``prefix`` (and sorting after the encoded key
    ``after``), in key order, newest first within a key."""
    top = PREFIX + bucket.encode() + b"\0"
    start = top + _key_head(prefix)[:HEAD]
    end = prefix_end(start) if prefix else prefix_end(top)
    if after is not None:
        start = max(start, top + after[:HEAD] + b"\x01")
    for rk, raw in tx.kv.scan(start, end):
        v = _decode(rk, raw)
        if v.key.startswith(prefix) and (after is None
                                         or v.key.encode("utf-8", "surrogateescape") > after):
            yield v


def of_inode(tx: MetaTxn, ino: int) -> tuple[str, Version] | None:
    """(bucket, record) of the noncurrent version held by inode ``ino``."""
    rk = tx.kv.get(BACK + _U64.pack(ino))
    if rk is None:
        return None
    raw = tx.kv.get(rk)
    if raw is None:
        return None
    bucket = rk[1:rk.index(b"\0")].decode()
    return bucket, _decode(rk, raw)


def cold_key(bucket: str, key: str, vid: str) -> str:
    return f"{bucket}/{VERSIONS_DIR}/{key}/{vid}"


def cold_keys(tx: MetaTxn, ino: int) -> list[str]:
    """The cold key of inode ``ino`` when it holds a noncurrent version (else none)."""
    found = of_inode(tx, ino)
    if found is None:
        return []
    bucket, v = found
    return [cold_key(bucket, v.key, v.vid)]


def resolve_cold(tx: MetaTxn, bucket: str, rest: str) -> int | None:
    """The inode a cold key ``<bucket>/.tierd-versions/<rest>`` names now."""
    key, _, vid = rest.rpartition("/")
    v = find(tx, bucket, key, vid)
    return v.ino or None if v is not None else None


_IN_USE = PREFIX + b"\0"  # some bucket has had versioning enabled (bucket names are never empty)


#: how many commits that marked versioning in use this process has seen end: a reader that
#: found no mark at a given count knows none came while the count stays (it is bumped after
#: the commit lands, so a read that began before it and missed the mark is followed by a
#: bump).  Only this process's writes are counted: a cluster's nodes never rely on it.
_marks = [0]


def mark_in_use(tx: MetaTxn) -> None:
    """Versioning is being enabled on a bucket: from now on writes look up their bucket."""
    tx.kv.put(_IN_USE, b"")
    tx.after_commit(_bump_marks)


def _bump_marks() -> None:
    _marks[0] += 1


def marks() -> int:
    """The count of :data:`_marks` now (read it before the snapshot that looks)."""
    return _marks[0]


def in_use(tx: MetaTxn) -> bool:
    """Whether any bucket's versioning was ever set (one point read)."""
    return tx.kv.get(_IN_USE) is not None


def state(tx: MetaTxn, bucket: str) -> str:
    """``""`` (never enabled), ``Enabled`` or ``Suspended``."""
    b = tx.get_bucket(bucket)
    return b.config.get(CONFIG, "") if b is not None else ""


def configured(tx: MetaTxn, ino: int) -> bool:
    """Whether a name of ``ino`` is a key of a bucket whose versioning was ever set
    (``Enabled`` or ``Suspended``); one point read while no bucket ever was."""
    if not in_use(tx):
        return False
    for link in tx.links(ino):
        loc = locate(tx, *link)
        if loc is not None and state(tx, loc[0]):
            return True
    return False


def locate(tx: MetaTxn, d_ino: int, name: bytes) -> tuple[str, str] | None:
    """(bucket, key) of entry ``name`` in directory ``d_ino``; None outside a bucket, and
    None at the cost of one point read while no bucket was ever versioned (a create, an
    unlink or an overwrite then needs no walk up to its bucket)."""
    if not in_use(tx):
        return None
    p = dir_path(tx, d_ino)
    if p is None:
        return None
    bucket, _, rest = p.partition("/")
    n = name.decode("utf-8", "surrogateescape")
    return bucket, f"{rest}/{n}" if rest else n


# -- the transaction-level operations --------------------------------------------------------

def drop_version(ns: EntryOps, tx: MetaTxn, bucket: str, v: Version) -> list[int]:
    """Remove record ``v`` for good; its inode goes (``G`` key) unless a handle holds it.
    Returns the inodes whose data to forget after the commit."""
    remove(tx, bucket, v)
    if not v.ino:
        return []
    inode = tx.get_inode(v.ino)
    if inode is None:
        return []
    inode.nlink = 0
    inode.ctime_ns = time.time_ns()
    return [inode.ino] if ns._drop_inode(tx, inode) else []


def _drop_null(ns: EntryOps, tx: MetaTxn, bucket: str, key: str) -> list[int]:
    v = find(tx, bucket, key, NULL)
    return drop_version(ns, tx, bucket, v) if v is not None else []


def supersede(ns: EntryOps, tx: MetaTxn, d: Inode, name: bytes, old: Inode | None,
              new: Inode | None, *, stamp: bool = False) -> list[int]:
    """Inside the transaction where ``new`` (None: nothing, a delete) takes entry ``name``
    of ``d`` from ``old`` (its dirent already removed by the caller).  In a versioned bucket
    ``old`` becomes a noncurrent record instead of garbage; a ``null`` newcomer replaces
    the older ``null`` version.  ``stamp``: ``new`` was just written, give it a real version
    id when versioning is enabled.  Returns the inodes to forget after the commit."""
    loc = locate(tx, d.ino, name)
    st = state(tx, loc[0]) if loc is not None else ""
    if not st or loc is None:
        return [old.ino] if old is not None and ns._unref(tx, old) else []
    bucket, key = loc
    if key.split("/", 1)[0] == VERSIONS_DIR:
        raise FsError(errno.EPERM, f"{VERSIONS_DIR!r} is reserved in a versioned bucket: "
                      "the cold store keeps noncurrent versions there")
    if new is not None and stamp:
        if st == ENABLED:
            new.objmeta[FLAG] = "1"
            if not new.version:
                new.version = tx.next_version()
        else:
            new.objmeta.pop(FLAG, None)
    new_null = new is not None and not new.objmeta.get(FLAG)
    drops: list[int] = []
    if new_null:
        drops += _drop_null(ns, tx, bucket, key)
    if old is None:
        return drops
    return drops + retire(ns, tx, bucket, key, old, replace_null=new_null)


def retire(ns: EntryOps, tx: MetaTxn, bucket: str, key: str, old: Inode, *,
           replace_null: bool) -> list[int]:
    """``old`` (its dirent removed) leaves the current position of ``key``: a record, or
    garbage when it is a ``null`` version being replaced (or a hard link, a non-file)."""
    vid = current_vid(old)
    if not old.is_reg or old.nlink != 1 or (vid == NULL and replace_null):
        return [old.ino] if ns._unref(tx, old) else []
    put(tx, bucket, Version(key, vid, old.version, old.ino, old.mtime_ns, old.uid))
    ns._names_changed(tx, old)  # its cold object moves under .tierd-versions
    return []


def add_marker(ns: EntryOps, tx: MetaTxn, bucket: str, key: str, uid: int) -> tuple[
        Version, list[int]]:
    """A delete marker becomes the latest version of ``key`` (null while suspended)."""
    null = state(tx, bucket) != ENABLED
    seq = tx.next_version()
    drops = _drop_null(ns, tx, bucket, key) if null else []
    v = Version(key, NULL if null else vid_of(seq), seq, 0, time.time_ns(), uid)
    put(tx, bucket, v)
    return v, drops


def require_bucket(tx: MetaTxn, bucket: str) -> None:
    if tx.get_bucket(bucket) is None:
        raise FsError(errno.ENOENT, f"bucket {bucket!r} does not exist")


def unlinked(ns: EntryOps, tx: MetaTxn, d: Inode, name: bytes, child: Inode) -> list[int]:
    """An unlink through the mount (dirent removed): in a versioned bucket the file
    becomes a noncurrent version under a new delete marker, as an S3 DELETE."""
    loc = locate(tx, d.ino, name)
    st = state(tx, loc[0]) if loc is not None else ""
    if not st or loc is None or not child.is_reg:
        return [child.ino] if ns._unref(tx, child) else []
    bucket, key = loc
    drops = retire(ns, tx, bucket, key, child, replace_null=st != ENABLED)
    _, more = add_marker(ns, tx, bucket, key, child.uid)
    return drops + more


def moved_away(ns: EntryOps, tx: MetaTxn, d: Inode, name: bytes, src: Inode) -> list[int]:
    """A rename through the mount took file ``src`` (its current version) away from entry
    ``name`` of ``d``: when that key has older versions, a delete marker becomes its latest
    version, as S3's copy-and-delete would leave it (a key without history, such as an
    editor's temporary file, gets none)."""
    if not src.is_reg:
        return []
    loc = locate(tx, d.ino, name)
    if loc is None or not state(tx, loc[0]) or not of_key(tx, *loc):
        return []
    return add_marker(ns, tx, loc[0], loc[1], src.uid)[1]
