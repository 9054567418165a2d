"""Permission decisions from POSIX mode bits and ACLs, with Linux's rules for root and
sticky directories.

This is the one place a door's request becomes allow/deny: FUSE (whose kernel checks the
same modes and ACLs as well), S3 (through :mod:`tierd.acl.s3map`) and the checkpoint service
all ask :func:`may_access`, so one identity gets one answer through every door.
"""

from __future__ import annotations

import errno
import stat

from tierd.acl.identity import Identity
from tierd.acl.posix_acl import permission
from tierd.errors import FsError
from tierd.meta.records import Inode
from tierd.meta.store import ROOT_INO

R_OK = 4
W_OK = 2
X_OK = 1


class AccessDenied(FsError):
    """Raised with errno EACCES (mode bits) or EPERM (ownership rules)."""


def may_access(ident: Identity, inode: Inode, mask: int) -> bool:
    """True when ``ident`` may read/write/execute (``mask`` of R_OK|W_OK|X_OK) ``inode``.

    Root passes read and write checks (CAP_DAC_OVERRIDE) and execute when the inode is a
    directory or has any execute bit, as on Linux.  Everyone else gets the kernel's
    ``acl_permission_check``: the mode bits, and the inode's POSIX access ACL when it has one
    (:func:`tierd.acl.posix_acl.permission`).  An anonymous (unsigned S3) request is no
    POSIX identity: it gets only :func:`anonymous_bits`.
    """
    if mask == 0:
        return True
    if ident.grant is not None and ident.grant.covers(mask):
        return True  # a bucket policy allowed this request (tierd.acl.authorize)
    if ident.anonymous:  # no POSIX identity: what the inode's anonymous grant opens
        return not mask & ~anonymous_bits(inode)
    mode = inode.mode
    if ident.is_root:
        return not (mask & X_OK and not stat.S_ISDIR(mode) and not mode & 0o111)
    return permission(ident.uid, ident.in_group, mode, inode.uid, inode.gid,
                      inode.acl_access, mask)


def check_access(ident: Identity, inode: Inode, mask: int, what: str = "") -> None:
    """Raise EACCES unless :func:`may_access` allows."""
    if not may_access(ident, inode, mask):
        need = "".join(c for c, b in (("r", R_OK), ("w", W_OK), ("x", X_OK)) if mask & b)
        raise AccessDenied(
            errno.EACCES,
            f"permission denied: uid {ident.uid} lacks '{need}' on {what or f'inode {inode.ino}'}",
        )


def anonymous_bits(inode: Inode) -> int:
    """What unsigned S3 requests may do with ``inode``: its anonymous grant (the
    ``public-read``/``public-read-write`` canned ACLs set it) within what its "other" bits
    give, so a chmod that closes the inode to other users closes it to anonymous ones.
    The namespace root lets them search it (a bucket is found by its name, and its own
    permissions decide), as it lets every other user."""
    if inode.ino == ROOT_INO:
        return inode.mode & X_OK
    return inode.anon & inode.mode & 0o7


def may_delete(ident: Identity, directory: Inode, victim: Inode) -> bool:
    """The sticky-bit rule: in a sticky directory only root, the directory's owner and the
    entry's owner may remove or rename an entry."""
    if not directory.mode & stat.S_ISVTX or ident.is_root:
        return True
    return ident.uid in (directory.uid, victim.uid)


def is_owner(ident: Identity, inode: Inode) -> bool:
    """Ownership rights (chmod, utimens with explicit times): root or the owner."""
    return ident.is_root or ident.uid == inode.uid
