"""The S3 -> POSIX mapping: one table saying what each S3 action needs of the file system.

An S3 request is allowed by the POSIX side exactly when the checks of its action pass for
the key's user, with the same :func:`tierd.acl.may_access` (mode bits and POSIX ACLs) the
mount uses, so a user gets the same answer through both doors.  The namespace enforces the
table (:func:`enforce`); the S3 door and bucket policies read it (:data:`S3_ACTIONS`,
:func:`requirement`, :func:`describe`) to know which POSIX checks an action stands for.

Targets of a check:

* ``PATH``: every directory walked from the bucket down to the key's parent needs search
  (``x``).  The namespace's lookup enforces it on each step (``_child``), so a key under a
  directory the caller cannot search does not exist for them, exactly as ``open`` sees it.
* ``PARENT``: the directory holding the key.  For a new key also every directory a PUT
  creates on the way (implicit directories): each is a create in its parent.
* ``OBJECT``: the key's file (or directory, for ``a/b/`` marker keys).
* ``DIRECTORY``: the directory a listing reads (the bucket's, and each subdirectory walked;
  a subtree the caller cannot read and search is skipped, as ``find`` does).

``when`` limits a check to new keys (``NEW``) or existing ones (``EXISTING``): a PUT over an
existing object needs write on that object only, as ``open(O_WRONLY|O_TRUNC)`` does; a new
one needs write+search on the parent, as ``creat`` does.  ``sticky`` adds the sticky-bit
rule of ``unlink`` (in a sticky directory only the owner of the entry or of the directory,
or root, may remove it).  Composite actions (CopyObject, UploadPartCopy) name the actions
whose checks apply to their source and destination in ``parts``.

The second half of the module is the grant table: what each S3 permission of a grant
(``x-amz-grant-*`` headers, AccessControlPolicy bodies) becomes in mode bits, named ACL
entries and the anonymous grant (:data:`GRANT_PERMISSIONS`, :func:`resolve_grants`,
:func:`apply_grants`).
"""

from __future__ import annotations

import errno
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum

from tierd.acl import posix_acl as pacl
from tierd.acl.identity import Identity
from tierd.acl.modes import R_OK, W_OK, X_OK, AccessDenied, check_access, may_access, may_delete
from tierd.meta.records import Inode


class Target(Enum):
    PATH = "every directory above the key"
    PARENT = "the key's parent directory"
    OBJECT = "the object"
    DIRECTORY = "the listed directory"


class When(Enum):
    ALWAYS = "always"
    NEW = "when the key does not exist yet"
    EXISTING = "when the key exists"


@dataclass(frozen=True, slots=True)
class Check:
    """One POSIX check: ``mask`` (R_OK|W_OK|X_OK) on ``target``."""

    target: Target
    mask: int
    when: When = When.ALWAYS
    sticky: bool = False

    def __str__(self) -> str:
        need = "+".join(n for n, b in (("read", R_OK), ("write", W_OK), ("search", X_OK))
                        if self.mask & b)
        text = f"{need} on {self.target.value}"
        if self.when is not When.ALWAYS:
            text += f" ({self.when.value})"
        if self.sticky:
            text += ", obeying the sticky bit"
        return text


@dataclass(frozen=True, slots=True)
class Requirement:
    """What an S3 action needs: its own ``checks``, and for composite actions the actions
    whose requirements apply to each side (``parts``: role -> action)."""

    action: str
    checks: tuple[Check, ...] = ()
    parts: tuple[tuple[str, str], ...] = ()
    note: str = ""


_SEARCH = Check(Target.PATH, X_OK)
_READ_OBJECT = (_SEARCH, Check(Target.OBJECT, R_OK))
_WRITE_OBJECT = (
    _SEARCH,
    Check(Target.PARENT, W_OK | X_OK, When.NEW),
    Check(Target.OBJECT, W_OK, When.EXISTING),
)
_CHANGE_OBJECT = (_SEARCH, Check(Target.OBJECT, W_OK))  # an existing object's metadata
_DELETE_OBJECT = (_SEARCH, Check(Target.PARENT, W_OK | X_OK, sticky=True))
_LIST = (Check(Target.DIRECTORY, R_OK | X_OK),)
_UPLOAD_OWNER = "only the user who created the upload (or root)"

#: S3 action (without the ``s3:`` prefix) -> what the POSIX side checks
S3_ACTIONS: dict[str, Requirement] = {
    r.action: r
    for r in (
        Requirement("GetObject", _READ_OBJECT),
        Requirement("HeadObject", _READ_OBJECT),
        Requirement("PutObject", _WRITE_OBJECT,
                    note="an overwrite keeps the object's owner, mode and ACL"),
        Requirement("DeleteObject", _DELETE_OBJECT,
                    note="a missing key succeeds without checks on it"),
        Requirement("DeleteObjects", _DELETE_OBJECT, note="checked per key"),
        Requirement("GetObjectTagging", _READ_OBJECT, note="as getxattr of a user.* name"),
        Requirement("PutObjectTagging", _CHANGE_OBJECT, note="as setxattr of a user.* name"),
        Requirement("DeleteObjectTagging", _CHANGE_OBJECT, note="as removexattr"),
        Requirement("ListObjects", _LIST),
        Requirement("ListObjectsV2", _LIST),
        Requirement("CopyObject", parts=(("source", "GetObject"), ("destination", "PutObject"))),
        Requirement("CreateMultipartUpload", _WRITE_OBJECT,
                    note="checked again at CompleteMultipartUpload"),
        Requirement("CompleteMultipartUpload", _WRITE_OBJECT),
        Requirement("UploadPart", note=_UPLOAD_OWNER),
        Requirement("UploadPartCopy", parts=(("source", "GetObject"),), note=_UPLOAD_OWNER),
        Requirement("ListParts", note=_UPLOAD_OWNER),
        Requirement("AbortMultipartUpload", note=_UPLOAD_OWNER),
        Requirement("CreateBucket", (Check(Target.PARENT, W_OK | X_OK),),
                    note="the parent is the namespace root (mode 1777)"),
        Requirement("DeleteBucket", (Check(Target.PARENT, W_OK | X_OK, sticky=True),),
                    note="the namespace root is sticky: only the bucket's owner or root"),
        Requirement("ListBuckets", note="every caller with an identity"),
    )
}


def requirement(action: str) -> Requirement:
    """The entry of ``action`` ("GetObject" or "s3:GetObject"); KeyError when unknown."""
    return S3_ACTIONS[action.removeprefix("s3:")]


def posix_checks(action: str, role: str = "") -> tuple[Check, ...]:
    """Every POSIX check of ``action``, composite parts expanded (``role``: only that side
    of a composite action, e.g. "source" of CopyObject)."""
    req = requirement(action)
    out = list(req.checks) if not role else []
    for part_role, part in req.parts:
        if not role or role == part_role:
            out.extend(posix_checks(part))
    return tuple(out)


def describe(action: str) -> list[str]:
    """The checks of ``action`` in words (for docs, errors and tools)."""
    req = requirement(action)
    lines = [str(c) for c in req.checks]
    lines += [f"{role}: {'; '.join(describe(part))}" for role, part in req.parts]
    if req.note:
        lines.append(req.note)
    return lines


def _checks(action: str, parent: Inode | None, obj: Inode | None, directory: Inode | None
            ) -> Iterator[tuple[Check, Inode]]:
    """The checks of ``action`` that apply (``obj`` None: the key is new), each with the
    inode it is made on; PATH (the walk's) and targets not given are skipped."""
    exists = obj is not None
    for c in requirement(action).checks:
        if c.when is not When.ALWAYS and (c.when is When.NEW) == exists:
            continue
        target = (obj if c.target is Target.OBJECT else parent if c.target is Target.PARENT
                  else directory if c.target is Target.DIRECTORY else None)
        if target is not None:
            yield c, target


def enforce(
    ident: Identity, action: str, *, parent: Inode | None = None, obj: Inode | None = None,
    directory: Inode | None = None, key: str = "",
) -> None:
    """Apply the checks of ``action`` to the inodes given (PATH is enforced by the walk that
    found them).  ``obj`` None means the key does not exist (NEW checks apply).  Raises
    EACCES, or EPERM for the sticky-bit rule, like the POSIX call the check stands for."""
    for c, inode in _checks(action, parent, obj, directory):
        if c.target is Target.OBJECT:
            check_access(ident, inode, c.mask, f"key {key!r}" if key else "the object")
        elif c.target is Target.PARENT:
            check_access(ident, inode, c.mask, "the key's parent directory")
            if c.sticky and obj is not None and not may_delete(ident, inode, obj):
                raise AccessDenied(errno.EPERM, "the sticky bit protects this entry: only "
                                   "its owner, the directory's owner or root may remove it")
        else:
            check_access(ident, inode, c.mask, f"{key!r}" if key else "the directory")


def allowed(
    ident: Identity, action: str, *, parent: Inode | None = None, obj: Inode | None = None,
    directory: Inode | None = None,
) -> bool:
    """:func:`enforce` as a yes/no (e.g. whether a listing descends into a subdirectory)."""
    for c, inode in _checks(action, parent, obj, directory):
        if not may_access(ident, inode, c.mask):
            return False
        if c.sticky and c.target is Target.PARENT and obj is not None and not may_delete(
                ident, inode, obj):
            return False
    return True


# -- S3 grants -> POSIX state ---------------------------------------------------------------
#
# The grant half of the table: what each S3 permission (x-amz-grant-* headers, the Grant
# list of an AccessControlPolicy body) becomes on an object (a file) and on a bucket or
# prefix (a directory).  Canned ACLs are grant lists too, and each gives here exactly the
# state tierd.acl.canned gives it, so a grant list and its canned equivalent never differ.

ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
AUTHENTICATED_USERS = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers"
#: a grant list, encoded for the namespace to apply in the commit that creates the object
#: (it rides in :data:`tierd.acl.canned.META_KEY` like a canned ACL name)
GRANTS_PREFIX = "grants:"
#: an ACL spec to apply after the object is given to the bucket's owner (ownership controls)
TO_BUCKET_OWNER = "bucket-owner:"

#: S3 permission -> the rw bits it gives on an object; a directory also gets search with
#: any of them (a bucket's READ is list = r-x, WRITE is create/delete keys = -wx).  None:
#: POSIX cannot give it to anyone but the owner (changing permissions is chmod).
#: READ_ACP gives nothing: whoever reaches a key may already read its ACL (as ``stat``).
#: FULL_CONTROL is READ and WRITE: its ACP half stays the owner's, as for the canned
#: ``bucket-owner-full-control``.  WRITE on an object is overwrite (``w``), as the canned
#: ``public-read-write`` has always given (S3 defines no WRITE on objects).
GRANT_PERMISSIONS: dict[str, int | None] = {
    "READ": R_OK, "WRITE": W_OK, "FULL_CONTROL": R_OK | W_OK, "READ_ACP": 0, "WRITE_ACP": None,
}
#: x-amz-grant-* header -> the permission it grants
GRANT_HEADERS = {"x-amz-grant-read": "READ", "x-amz-grant-write": "WRITE",
                 "x-amz-grant-read-acp": "READ_ACP", "x-amz-grant-write-acp": "WRITE_ACP",
                 "x-amz-grant-full-control": "FULL_CONTROL"}
_GRANTEE = re.compile(r'\s*([A-Za-z]+)\s*=\s*(?:"([^"]*)"|([^,\s]+))\s*(?:,|$)')


class GrantError(ValueError):
    """A grant tierd cannot apply; ``code`` is the S3 error code to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class GrantSet:
    """A resolved grant list as rw bits per grantee slot: ``other`` for every signed user
    (``AuthenticatedUsers``, and ``AllUsers``, which includes them), ``anonymous`` for
    unsigned requests (``AllUsers``: the inode's anonymous grant), ``users`` for named
    users ((uid, bits), sorted).  The object's owner always keeps read and write."""

    other: int = 0
    anonymous: int = 0
    users: tuple[tuple[int, int], ...] = ()

    @property
    def public(self) -> bool:
        """Grants to AllUsers or AuthenticatedUsers (what BlockPublicAcls refuses)."""
        return bool(self.other or self.anonymous)

    def encode(self) -> str:
        users = ",".join(f"{u}:{b}" for u, b in self.users)
        return f"{GRANTS_PREFIX}o={self.other};a={self.anonymous};u={users}"

    @classmethod
    def decode(cls, text: str) -> GrantSet:
        fields = dict(p.split("=", 1) for p in text.removeprefix(GRANTS_PREFIX).split(";"))
        users = tuple((int(u), int(b)) for u, _, b in
                      (x.partition(":") for x in fields["u"].split(",") if x))
        return cls(int(fields["o"]), int(fields["a"]), users)


def grant_header_pairs(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(grantee, permission) pairs of the ``x-amz-grant-*`` headers: grantee a canonical
    id, a group URI or ``emailAddress:<address>`` (``id="..."``, ``uri="..."``,
    ``emailAddress="..."``, comma separated).  GrantError InvalidArgument when malformed."""
    out: list[tuple[str, str]] = []
    for name, value in headers:
        perm = GRANT_HEADERS.get(name.lower())
        if perm is None:
            continue
        pos, text = 0, value.strip()
        while pos < len(text):
            m = _GRANTEE.match(text, pos)
            if m is None or m.end() == pos:
                raise GrantError("InvalidArgument", f"{name}: cannot parse {text[pos:]!r}; "
                                 'give id="<canonical id>" or uri="<group URI>", comma '
                                 "separated")
            kind, val = m.group(1).lower(), (m.group(2) if m.group(2) is not None
                                             else m.group(3))
            if kind == "emailaddress":
                val = "emailAddress:" + val
            elif kind not in ("id", "uri"):
                raise GrantError("InvalidArgument", f"{name}: unknown grantee type {kind!r} "
                                 "(id, uri or emailAddress)")
            out.append((val.strip(), perm))
            pos = m.end()
        if not text:
            raise GrantError("InvalidArgument", f"{name} names no grantee")
    return out


def resolve_grants(pairs: Iterable[tuple[str, str]], uid_of: Callable[[str], int | None],
                   owner: int) -> GrantSet:
    """The :class:`GrantSet` of (grantee, permission) pairs for an inode of ``owner``;
    ``uid_of`` maps a canonical id to a known user's uid (None: unknown).  GrantError for
    what cannot be applied: an unknown id or group (InvalidArgument), an e-mail grantee
    (UnresolvableGrantByEmailAddress: tierd users have no addresses) and WRITE_ACP to
    anyone but the owner (NotImplemented: only the owner may change permissions)."""
    other = anonymous = 0
    users: dict[int, int] = {}
    for grantee, perm in pairs:
        if perm not in GRANT_PERMISSIONS:
            raise GrantError("MalformedACLError", f"unknown permission {perm!r}")
        if grantee.startswith("emailAddress:"):
            raise GrantError("UnresolvableGrantByEmailAddress", "grants by e-mail address "
                             "are not supported: tierd users have no e-mail address; grant "
                             'to id="<canonical id>" (GetBucketAcl shows them)')
        if grantee in (ALL_USERS, AUTHENTICATED_USERS):
            uid = None
        else:
            uid = uid_of(grantee)
            if uid is None:
                raise GrantError("InvalidArgument", f"grantee {grantee!r} is neither a known "
                                 f"user's canonical id nor a group ({ALL_USERS} or "
                                 f"{AUTHENTICATED_USERS})")
        bits = GRANT_PERMISSIONS[perm]
        if uid == owner:
            continue  # the owner has every permission already
        if bits is None:
            raise GrantError("NotImplemented", f"{perm} can be held only by the owner: tierd "
                             "stores permissions as POSIX modes and ACL entries, which only "
                             "the owner (or root) may change")
        if grantee == ALL_USERS:
            anonymous |= bits
            other |= bits  # every signed user is one of all users
        elif grantee == AUTHENTICATED_USERS:
            other |= bits
        elif uid is not None and bits:
            users[uid] = users.get(uid, 0) | bits
    return GrantSet(other, anonymous, tuple(sorted(users.items())))


def apply_grants(mode: int, grants: GrantSet, owner: int) -> tuple[int, bytes, int]:
    """(new mode, access-ACL blob, anonymous grant) of ``grants`` on an inode of ``mode``
    and ``owner``, as :func:`tierd.acl.canned.apply`: the owner read+write, "other" and the
    owning group what all signed users get, a named ``user:`` entry (with what everyone
    else gets: S3 grants add up, while a POSIX named entry replaces "other") per user."""
    is_dir = stat.S_ISDIR(mode)

    def bits(b: int) -> int:
        return b | X_OK if is_dir and b else b

    own, other = bits(R_OK | W_OK), bits(grants.other | grants.anonymous)
    named = [(uid, bits(b) | other) for uid, b in grants.users if uid != owner]
    acl: list[pacl.AclEntry] = [pacl.AclEntry(pacl.USER_OBJ, own)]
    acl += [pacl.AclEntry(pacl.USER, b, uid) for uid, b in named]
    acl.append(pacl.AclEntry(pacl.GROUP_OBJ, other))
    if named:
        mask = other
        for _, b in named:
            mask |= b
        acl.append(pacl.AclEntry(pacl.MASK, mask))
    acl.append(pacl.AclEntry(pacl.OTHER, other))
    new, not_equiv = pacl.equiv_mode(tuple(acl), stat.S_IFMT(mode))
    return new, pacl.serialize(acl) if not_equiv else b"", bits(grants.anonymous)
