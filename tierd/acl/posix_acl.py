"""Linux POSIX ACLs: the kernel's xattr format and its algorithms, in one place.

What is stored: an inode carries its access ACL and (directories) its default ACL as the
exact blobs the kernel exchanges through ``system.posix_acl_access`` and
``system.posix_acl_default`` (a version-2 header, then 8-byte entries of tag, perm, id),
always valid and in canonical order, so ``getfattr``/``getfacl`` read back what was set.
An access ACL that says no more than the mode bits (only the three base entries) is never
stored: it *is* the mode, as on ext4.

The algorithms follow ``fs/posix_acl.c`` and ``fs/namei.c`` so that the daemon, which decides
every S3 access alone (and every FUSE access together with the kernel), gives the kernel's
answer:

* :func:`permission` is ``acl_permission_check()`` + ``posix_acl_permission()``, including the
  kernel's shortcuts: the owner is judged by the owner bits only, and an ACL whose mask (the
  mode's group bits) is empty is not consulted at all (the group/other mode bits decide).
* :func:`create_masq` / :func:`inherit` is ``posix_acl_create()`` (the umask is not applied
  when the parent has a default ACL).
* :func:`chmod_acl` is ``posix_acl_chmod()``; :func:`equiv_mode` is
  ``posix_acl_equiv_mode()`` (used as ``posix_acl_update_mode()`` when an ACL is set).

Every malformed input raises :class:`~tierd.errors.FsError` (EINVAL, or EOPNOTSUPP for an
unknown header version, as the kernel does) and nothing else.
"""

from __future__ import annotations

import errno
import functools
import stat
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tierd.errors import FsError

ACCESS_XATTR = b"system.posix_acl_access"
DEFAULT_XATTR = b"system.posix_acl_default"
ACL_XATTRS = (ACCESS_XATTR, DEFAULT_XATTR)

VERSION = 2
UNDEFINED_ID = 0xFFFFFFFF

USER_OBJ = 0x01
USER = 0x02
GROUP_OBJ = 0x04
GROUP = 0x08
MASK = 0x10
OTHER = 0x20

READ, WRITE, EXECUTE = 4, 2, 1

# canonical order of tags (the kernel's posix_acl_valid state machine and libacl's sort)
_TAG_ORDER = {USER_OBJ: 0, USER: 1, GROUP_OBJ: 2, GROUP: 3, MASK: 4, OTHER: 5}
TAG_NAMES = {USER_OBJ: "user_obj", USER: "user", GROUP_OBJ: "group_obj", GROUP: "group",
             MASK: "mask", OTHER: "other"}

_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
#: entries in one blob at most: the kernel's xattr value limit (64 KiB) allows 8191; ext4
#: allows about 500.  FUSE hands at most a page, so more never arrives through the mount.
MAX_ENTRIES = 8191


@dataclass(frozen=True, slots=True, order=True)
class AclEntry:
    """One entry; ``id`` is a uid (USER), a gid (GROUP), else :data:`UNDEFINED_ID`."""

    tag: int
    perm: int
    id: int = UNDEFINED_ID

    @property
    def key(self) -> tuple[int, int]:
        named = self.tag in (USER, GROUP)
        return _TAG_ORDER.get(self.tag, 99), self.id if named else 0


Acl = tuple[AclEntry, ...]


def _bad(msg: str) -> FsError:
    return FsError(errno.EINVAL, f"invalid POSIX ACL: {msg}")


# -- the xattr format ----------------------------------------------------------------------
def parse(blob: bytes) -> Acl:
    """Entries of a ``system.posix_acl_*`` value, validated (:func:`validate`).  A header
    with no entries is the empty ACL (setting it removes the ACL, as on Linux)."""
    if len(blob) < _HEADER.size:
        raise _bad(f"{len(blob)} bytes is shorter than the 4-byte header")
    (version,) = _HEADER.unpack_from(blob)
    if version != VERSION:
        raise FsError(errno.EOPNOTSUPP, f"POSIX ACL version {version} is not supported "
                      f"(only {VERSION})")
    body = len(blob) - _HEADER.size
    if body % _ENTRY.size:
        raise _bad(f"{body} bytes of entries is not a multiple of {_ENTRY.size}")
    count = body // _ENTRY.size
    if count > MAX_ENTRIES:
        raise _bad(f"{count} entries; at most {MAX_ENTRIES}")
    acl = tuple(
        _entry(*_ENTRY.unpack_from(blob, _HEADER.size + i * _ENTRY.size)) for i in range(count)
    )
    if acl:
        validate(acl)
    return acl


def _entry(tag: int, perm: int, ident: int) -> AclEntry:
    if tag not in _TAG_ORDER:
        raise _bad(f"unknown tag {tag:#x}")
    if perm & ~7:
        raise _bad(f"permission {perm:#o} has bits other than rwx")
    if tag in (USER, GROUP):
        if ident == UNDEFINED_ID:
            raise _bad(f"a {TAG_NAMES[tag]} entry needs an id (not -1)")
    else:
        ident = UNDEFINED_ID  # the kernel ignores (and never returns) ids of these entries
    return AclEntry(tag, perm, ident)


def serialize(acl: Iterable[AclEntry]) -> bytes:
    """The kernel's xattr value for ``acl`` (ids of unnamed entries written as -1)."""
    out = bytearray(_HEADER.pack(VERSION))
    for e in acl:
        out += _ENTRY.pack(e.tag, e.perm, e.id if e.tag in (USER, GROUP) else UNDEFINED_ID)
    return bytes(out)


def validate(acl: Acl) -> None:
    """EINVAL unless ``acl`` is a valid access/default ACL: exactly one USER_OBJ, GROUP_OBJ
    and OTHER; named USER/GROUP entries sorted by id without duplicates; one MASK, required
    when named entries exist; entries in tag order (what ``posix_acl_valid`` and libacl's
    ``acl_valid`` demand together)."""
    counts = dict.fromkeys(_TAG_ORDER, 0)
    prev: tuple[int, int] | None = None
    for e in acl:
        if e.tag not in _TAG_ORDER:
            raise _bad(f"unknown tag {e.tag:#x}")
        if e.perm & ~7:
            raise _bad(f"permission {e.perm:#o} has bits other than rwx")
        if e.tag in (USER, GROUP) and not 0 <= e.id < UNDEFINED_ID:
            raise _bad(f"{TAG_NAMES[e.tag]} id {e.id} is not a valid id")
        k = e.key
        if prev is not None and k <= prev:
            raise _bad("entries are out of order or duplicated "
                       f"({TAG_NAMES[e.tag]} {e.id if e.tag in (USER, GROUP) else ''})")
        prev = k
        counts[e.tag] += 1
    for tag in (USER_OBJ, GROUP_OBJ, OTHER):
        if counts[tag] != 1:
            raise _bad(f"needs exactly one {TAG_NAMES[tag]} entry")
    if counts[USER] + counts[GROUP] and not counts[MASK]:
        raise _bad("named user or group entries need a mask entry")


@functools.lru_cache(maxsize=4096)
def cached_parse(blob: bytes) -> Acl:
    """:func:`parse` of a stored (hence valid) blob, memoized: evaluated on every access."""
    return parse(blob)


# -- mode <-> ACL --------------------------------------------------------------------------
def from_mode(mode: int) -> Acl:
    """The minimal ACL the mode bits stand for."""
    return (AclEntry(USER_OBJ, (mode >> 6) & 7), AclEntry(GROUP_OBJ, (mode >> 3) & 7),
            AclEntry(OTHER, mode & 7))


def equiv_mode(acl: Acl, mode: int) -> tuple[int, bool]:
    """``posix_acl_equiv_mode``: the mode ``acl`` sets (special and type bits of ``mode``
    kept; with a mask, the group bits are the mask) and whether the ACL says more than the
    mode (named entries or a mask), i.e. must be stored."""
    bits = 0
    not_equiv = False
    for e in acl:
        if e.tag == USER_OBJ:
            bits |= e.perm << 6
        elif e.tag == GROUP_OBJ:
            bits |= e.perm << 3
        elif e.tag == OTHER:
            bits |= e.perm
        elif e.tag == MASK:
            bits = (bits & ~0o070) | (e.perm << 3)
            not_equiv = True
        else:
            not_equiv = True
    return (mode & ~0o777) | bits, not_equiv


def chmod_acl(acl: Acl, mode: int) -> Acl:
    """``posix_acl_chmod``: the owner and other entries take the mode's bits, and the
    group bits go to the mask (or to the owning group's entry when there is no mask)."""
    has_mask = any(e.tag == MASK for e in acl)
    out = []
    for e in acl:
        if e.tag == USER_OBJ:
            e = AclEntry(USER_OBJ, (mode >> 6) & 7)
        elif e.tag == OTHER:
            e = AclEntry(OTHER, mode & 7)
        elif e.tag == MASK or (e.tag == GROUP_OBJ and not has_mask):
            e = AclEntry(e.tag, (mode >> 3) & 7)
        out.append(e)
    return tuple(out)


def create_masq(acl: Acl, mode: int) -> tuple[Acl, int, bool]:
    """``posix_acl_create_masq``: a parent's default ACL intersected with the create mode.
    Returns the new object's access ACL, its mode, and whether that ACL must be stored."""
    rwx = mode & 0o777
    out: list[AclEntry] = []
    not_equiv = False
    has_mask = any(e.tag == MASK for e in acl)
    for e in acl:
        perm = e.perm
        if e.tag == USER_OBJ:
            perm &= rwx >> 6
            rwx &= (perm << 6) | ~0o700
        elif e.tag in (USER, GROUP):
            not_equiv = True
        elif e.tag == OTHER:
            perm &= rwx & 7
            rwx &= perm | ~0o007
        elif e.tag == MASK:
            not_equiv = True
        out.append(AclEntry(e.tag, perm, e.id))
    for i, e in enumerate(out):  # the group class: the mask, else the owning group
        if e.tag == MASK or (e.tag == GROUP_OBJ and not has_mask):
            perm = e.perm & ((rwx >> 3) & 7)
            rwx &= (perm << 3) | ~0o070
            out[i] = AclEntry(e.tag, perm, e.id)
    return tuple(out), (mode & ~0o777) | (rwx & 0o777), not_equiv


@dataclass(frozen=True, slots=True)
class Inherited:
    """What a new object gets from its parent (:func:`inherit`)."""

    mode: int
    access: bytes = b""  # blob to store as the access ACL ("" = the mode says it all)
    default: bytes = b""  # blob to store as the default ACL (directories only)


def inherit(parent_default: bytes, mode: int, umask: int) -> Inherited:
    """``posix_acl_create``: with no default ACL on the parent the umask applies; with one,
    the new object's access ACL is that ACL masked by the create ``mode`` (umask ignored),
    and a directory also inherits the default ACL itself."""
    if not parent_default:
        return Inherited(mode & ~(umask & 0o777))
    acl, new_mode, not_equiv = create_masq(cached_parse(parent_default), mode)
    return Inherited(
        new_mode,
        serialize(acl) if not_equiv else b"",
        parent_default if stat.S_ISDIR(mode) else b"",
    )


# -- access --------------------------------------------------------------------------------
def permission(uid: int, in_group: Callable[[int], bool], mode: int, owner: int, group: int,
               acl_blob: bytes, want: int) -> bool:
    """The kernel's ``acl_permission_check`` for a non-root caller.

    ``in_group`` is a callable ``gid -> bool`` (the caller's groups); ``mode`` the inode's
    mode, whose owner/group/other bits are authoritative over the ACL's USER_OBJ / MASK (or
    GROUP_OBJ) / OTHER entries (they are kept equal by :func:`chmod_acl`)."""
    want &= 7
    if uid == owner:
        return not want & ~((mode >> 6) & 7)
    if acl_blob and mode & 0o070:
        return _acl_permission(uid, in_group, mode, owner, group,
                               cached_parse(acl_blob), want)
    bits = mode & 7
    if want & (mode ^ (mode >> 3)) and in_group(group):
        bits = (mode >> 3) & 7
    return not want & ~bits


def _acl_permission(uid: int, in_group: Callable[[int], bool], mode: int, owner: int,
                    group: int, acl: Acl, want: int) -> bool:
    """``posix_acl_permission`` (after the owner was handled): a named user's entry, else
    any matching group entry granting all of ``want`` (masked), else other -- but a caller
    in some matching group that grants too little is refused, not given other's bits."""
    has_mask = any(e.tag == MASK for e in acl)
    mask = (mode >> 3) & 7  # the mask entry's perm (kept equal to the group bits)
    found = False
    for e in acl:
        if e.tag == USER:
            if e.id == uid:
                return not want & ~(e.perm & mask)
        elif e.tag in (GROUP_OBJ, GROUP):
            if in_group(group if e.tag == GROUP_OBJ else e.id):
                found = True
                # without a mask the owning group's entry is the mode's group bits
                perm = e.perm & mask if has_mask else mask
                if not want & ~perm:
                    return True
        elif e.tag == OTHER:
            return not found and not want & ~(mode & 7)
    return False


def describe(acl: Acl) -> str:
    """getfacl-like short text (for messages and tests), e.g. ``u::rw-,u:1000:r--,...``."""
    names = {USER_OBJ: "u:", USER: "u:", GROUP_OBJ: "g:", GROUP: "g:", MASK: "m:", OTHER: "o:"}
    parts = []
    for e in acl:
        who = str(e.id) if e.tag in (USER, GROUP) else ""
        perm = "".join(c if e.perm & b else "-" for c, b in (("r", 4), ("w", 2), ("x", 1)))
        parts.append(f"{names[e.tag]}{who}:{perm}")
    return ",".join(parts)
