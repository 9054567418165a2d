"""S3 canned ACLs as POSIX state, and the S3 grants that POSIX state really gives.

tierd has one permission system: a canned ACL (``x-amz-acl`` on PUT, copy, multipart create,
CreateBucket, PutObjectAcl, PutBucketAcl) is translated into mode bits and, where it names
a second user, a POSIX access ACL; GetObjectAcl/GetBucketAcl translate the POSIX state back
(:func:`grants`), so they show what is really allowed, whoever set it and through which door.

========================  ===================  ==================================  =========
canned ACL                files / directories  POSIX ACL entry                     anonymous
========================  ===================  ==================================  =========
private                   0600 / 0700          --                                  --
public-read               0644 / 0755          --                                  r (r-x)
public-read-write         0666 / 0777          --                                  rw (rwx)
authenticated-read        0644 / 0755          --                                  --
bucket-owner-read         0600 / 0700          ``user:<bucket owner>:r--`` (r-x)   --
bucket-owner-full-control 0600 / 0700          ``user:<bucket owner>:rw-`` (rwx)   --
========================  ===================  ==================================  =========

"Other" bits are for every user with an identity -- that is every signed request.  An
anonymous request has no POSIX identity and never gets them (:mod:`tierd.acl.modes`): it
gets the inode's **anonymous grant** (:attr:`tierd.meta.Inode.anon`), within the other
bits, or what a bucket policy for ``*`` allows.  ``public-read`` sets that grant to read
(read and search on directories), ``public-read-write`` to read and write; every other
canned ACL clears it.  So ``public-read`` and ``authenticated-read`` give the same mode and
differ in the grant, and GetObjectAcl answers ``AuthenticatedUsers`` for the other bits and
``AllUsers`` for the grant (or when the bucket policy lets anonymous requests read).  The
bucket-owner ACLs name the bucket owner in an ACL entry (the mask follows, so the mode's
group bits show it, as ``ls -l`` does); when the writer owns the bucket they are
``private``.

Without a canned ACL an S3 creation is private (:data:`S3_UMASK`: 0600 objects, 0700
buckets) unless the directory's default ACL says otherwise, and the directories a PUT
creates for its key are S3 prefixes: they take their parent's permissions
(:func:`new_prefix`).
"""

from __future__ import annotations

import errno
import stat
from dataclasses import dataclass

from tierd.acl import posix_acl as pacl
from tierd.acl import s3map
from tierd.acl.identity import Identity
from tierd.acl.modes import is_owner
from tierd.acl.s3map import ALL_USERS, AUTHENTICATED_USERS
from tierd.errors import FsError
from tierd.meta.records import Inode

CANNED = ("private", "public-read", "public-read-write", "authenticated-read",
          "bucket-owner-read", "bucket-owner-full-control")
#: the objmeta key by which an S3 write asks the namespace to apply a canned ACL to the
#: object it commits (removed before the inode is stored)
META_KEY = "tierd.acl"

_OTHER = {"private": 0, "public-read": 4, "public-read-write": 6, "authenticated-read": 4,
          "bucket-owner-read": 0, "bucket-owner-full-control": 0}
_BUCKET_OWNER = {"bucket-owner-read": 4, "bucket-owner-full-control": 6}
#: the anonymous grant of each canned ACL (absent: none)
_ANONYMOUS = {"public-read": 4, "public-read-write": 6}
#: what an S3 creation without a canned ACL takes away (with the daemon's umask): objects
#: and buckets are their owner's alone unless a default ACL shares the directory
S3_UMASK = 0o077



class UnknownCannedAcl(ValueError):
    """Not one of :data:`CANNED` (S3's InvalidArgument)."""


def check(name: str) -> str:
    if name not in CANNED:
        raise UnknownCannedAcl(f"unknown canned ACL {name!r}; use one of {', '.join(CANNED)}")
    return name


def _dirbits(perm: int, is_dir: bool) -> int:
    """Directories get search wherever they get read."""
    return perm | 1 if is_dir and perm & 4 else perm


def access_acl(name: str, *, is_dir: bool, owner: int, bucket_owner: int) -> pacl.Acl:
    """The access ACL (mode bits included) of canned ACL ``name`` for an inode of ``owner``
    in a bucket of ``bucket_owner``.  Base entries only, unless it names the bucket owner."""
    check(name)
    own = _dirbits(6, is_dir)
    other = _dirbits(_OTHER[name], is_dir)
    group = other  # group members would otherwise get less than everyone else
    extra = _BUCKET_OWNER.get(name)
    if extra is None or bucket_owner == owner:
        return (pacl.AclEntry(pacl.USER_OBJ, own), pacl.AclEntry(pacl.GROUP_OBJ, group),
                pacl.AclEntry(pacl.OTHER, other))
    named = _dirbits(extra, is_dir)
    return (pacl.AclEntry(pacl.USER_OBJ, own), pacl.AclEntry(pacl.USER, named, bucket_owner),
            pacl.AclEntry(pacl.GROUP_OBJ, group), pacl.AclEntry(pacl.MASK, named | group),
            pacl.AclEntry(pacl.OTHER, other))


def apply(mode: int, name: str, *, owner: int, bucket_owner: int) -> tuple[int, bytes, int]:
    """(new mode, stored access-ACL blob, anonymous grant) for an inode of ``mode`` getting
    canned ACL ``name``: the permission bits are replaced (setuid/setgid/sticky cleared),
    the blob is empty when the mode says it all."""
    is_dir = stat.S_ISDIR(mode)
    acl = access_acl(name, is_dir=is_dir, owner=owner, bucket_owner=bucket_owner)
    new, not_equiv = pacl.equiv_mode(acl, stat.S_IFMT(mode))
    return (new, pacl.serialize(acl) if not_equiv else b"",
            _dirbits(_ANONYMOUS.get(name, 0), is_dir))


def new_prefix(child: Inode, parent: Inode) -> None:
    """The permissions of a directory an S3 PUT creates to hold its key (``a/`` of
    ``a/b``): S3 has no permissions on prefixes, so the new directory takes its parent's
    -- mode bits (sticky included), access ACL and anonymous grant -- and a key below it
    is as reachable as one beside it.  Where the parent has a default ACL, that decides
    instead (``posix_acl_create``, as for any create there).  ``child`` comes from the
    namespace's ``_new_inode`` (its owner, its setgid bit inherited)."""
    if parent.acl_default:
        inh = pacl.inherit(parent.acl_default, child.mode, 0)
        child.mode, child.acl_access, child.acl_default = inh.mode, inh.access, inh.default
        return
    child.mode = (stat.S_IFDIR | (parent.mode & (0o777 | stat.S_ISVTX))
                  | (child.mode & stat.S_ISGID))
    child.acl_access, child.anon = parent.acl_access, parent.anon


def describe(inode: Inode, bucket_owner: int) -> str:
    """The canned ACL whose POSIX state ``inode`` has (mode bits, access ACL, anonymous
    grant), whoever set it and through which door; ``custom`` when none does (a chmod or
    setfacl of another shape).  What the admin API reports as a bucket's access."""
    for name in CANNED:
        mode, blob, anon = apply(inode.mode, name, owner=inode.uid, bucket_owner=bucket_owner)
        if (stat.S_IMODE(mode), blob, anon) == (
                stat.S_IMODE(inode.mode), inode.acl_access, inode.anon & inode.mode & 7):
            return name
    return "custom"


# -- POSIX state -> S3 grants ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Grant:
    """One S3 grant: a user (``uid``) or a group URI, and a permission (READ, WRITE,
    FULL_CONTROL)."""

    permission: str
    uid: int | None = None
    group: str = ""


def _perm(bits: int, is_dir: bool) -> list[str]:
    """S3 permissions of rwx bits for someone who is not the owner (only the owner may
    chmod, so only the owner has FULL_CONTROL): on objects READ needs r and WRITE w; on
    buckets (directories) READ (list) needs r+x and WRITE (create/delete keys) w+x."""
    if is_dir:
        read, write = bits & 5 == 5, bits & 3 == 3
    else:
        read, write = bool(bits & 4), bool(bits & 2)
    return (["READ"] if read else []) + (["WRITE"] if write else [])


def grants(mode: int, owner: int, acl_blob: bytes, *, anonymous: int = 0,
           anonymous_read: bool = False) -> list[Grant]:
    """The grants the POSIX state of an inode gives: the owner FULL_CONTROL, named users of
    its ACL (through the mask) their permissions, ``AuthenticatedUsers`` what "other" gives,
    ``AllUsers`` what the anonymous grant gives (``anonymous``: its effective bits) and READ
    when ``anonymous_read`` (a bucket policy lets ``*`` read).  Group entries have no S3
    equivalent and are not listed (docs/permissions.md)."""
    is_dir = stat.S_ISDIR(mode)
    out = [Grant("FULL_CONTROL", uid=owner)]
    if acl_blob:
        try:
            acl = pacl.cached_parse(acl_blob)
        except FsError:
            acl = ()
        mask = next((e.perm for e in acl if e.tag == pacl.MASK), 7)
        for e in acl:
            if e.tag == pacl.USER and e.id != owner:
                out += [Grant(p, uid=e.id) for p in _perm(e.perm & mask, is_dir)]
    out += [Grant(p, group=AUTHENTICATED_USERS) for p in _perm(mode & 7, is_dir)]
    public = _perm(anonymous, is_dir)
    if anonymous_read and "READ" not in public:
        public.insert(0, "READ")
    out += [Grant(p, group=ALL_USERS) for p in public]
    return out


def apply_on_commit(ident: Identity, inode: Inode, name: str, bucket_owner: int,
                    key: str) -> None:
    """For the namespace, inside the transaction that commits an S3 write carrying
    ``x-amz-acl`` or ``x-amz-grant-*`` (or PutObjectAcl/PutBucketAcl): set the inode's mode,
    access ACL and anonymous grant.  Setting an ACL is chmod, so only the object's owner or
    root may (an overwrite keeps the old owner): EPERM else.  ``name`` is a canned ACL, a
    grant list (:class:`tierd.acl.s3map.GrantSet`), or either after
    :data:`~tierd.acl.s3map.TO_BUCKET_OWNER`: the bucket's ownership controls give the
    object to the bucket's owner (who accepted that by setting them), then the ACL applies
    for that owner (an empty one keeps the mode)."""
    if name.startswith(s3map.TO_BUCKET_OWNER):
        inode.uid, name = bucket_owner, name.removeprefix(s3map.TO_BUCKET_OWNER)
        if not name:
            return
    elif not is_owner(ident, inode):
        raise FsError(errno.EPERM, f"only the owner of key {key!r} (uid {inode.uid}) or root "
                      "may set its ACL (x-amz-acl)")
    if name.startswith(s3map.GRANTS_PREFIX):
        inode.mode, inode.acl_access, inode.anon = s3map.apply_grants(
            inode.mode, s3map.GrantSet.decode(name), inode.uid)
        return
    inode.mode, inode.acl_access, inode.anon = apply(
        inode.mode, check(name), owner=inode.uid, bucket_owner=bucket_owner)
