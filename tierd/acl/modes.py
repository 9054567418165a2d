"""Permission decisions from POSIX mode bits and ACLs, with Linux's rules for root and
sticky directories, and the ownership rules of changing them.

This is the one place a door's request becomes allow/deny: FUSE (whose kernel checks the
same modes and ACLs as well), S3 (through :mod:`tierd.acl.s3map`) and the checkpoint service
all ask :func:`may_access`, so one identity gets one answer through every door.  The rules
of who may chown, chmod or set times, what a chmod or an access ACL keeps of setgid, the
group and setgid bit a new inode inherits, and the set-id bits a write clears live here too
(the namespace applies them inside its transactions), each as Linux has it.
"""

from __future__ import annotations

import errno
import functools
import stat
from collections.abc import Callable

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


@functools.cache
def protected_hardlinks() -> bool:
    """Whether this host sets ``fs.protected_hardlinks`` (read once): the namespace then
    applies :func:`may_hardlink` to every door, as the kernel does for a local file system."""
    try:
        with open("/proc/sys/fs/protected_hardlinks") as f:
            return int(f.read().strip()) == 1
    except (OSError, ValueError):
        return False


def may_hardlink(ident: Identity, inode: Inode) -> bool:
    """The ``fs.protected_hardlinks`` rule (Linux's ``may_linkat``): root and the owner may
    link anything; anyone else only a regular file that is neither setuid nor
    setgid-executable and that they may both read and write -- so a user cannot pin
    another's setuid program or private file under a name of their own."""
    if ident.is_root or ident.uid == inode.uid:
        return True
    mode = inode.mode
    sgid_exec = stat.S_ISGID | stat.S_IXGRP
    return (stat.S_ISREG(mode) and not mode & stat.S_ISUID and mode & sgid_exec != sgid_exec
            and may_access(ident, inode, R_OK | W_OK))


def is_owner(ident: Identity, inode: Inode) -> bool:
    """Ownership rights (chmod, utimens with explicit times): root or the owner."""
    return ident.is_root or ident.uid == inode.uid


# -- set-id bits ----------------------------------------------------------------------------
def has_privs(mode: int) -> bool:
    """Whether ``mode`` has bits Linux clears when an unprivileged caller writes or
    truncates the file: setuid, and setgid with group execute (setgid without it marks
    mandatory locking, which a write leaves alone)."""
    return bool(mode & stat.S_ISUID or (mode & stat.S_ISGID and mode & stat.S_IXGRP))


def drop_privs(mode: int) -> int:
    """``mode`` without the bits :func:`has_privs` names."""
    mode &= ~stat.S_ISUID
    if mode & stat.S_IXGRP:
        mode &= ~stat.S_ISGID
    return mode


def write_drops_privs(ident: Identity, mode: int) -> bool:
    """Whether a write or truncate by ``ident`` must clear the set-id bits of a file of
    ``mode`` first (Linux's ``should_remove_suid``: never for root)."""
    return not ident.is_root and has_privs(mode)


def keep_setgid(ident: Identity, inode: Inode, mode: int) -> int:
    """``mode`` as a chmod or a new access ACL by ``ident`` sets it on ``inode``: setgid is
    kept only for root or a member of the inode's group (``setattr_should_drop_sgid``)."""
    if not ident.is_root and not ident.in_group(inode.gid):
        mode &= ~stat.S_ISGID
    return mode


def created_mode_gid(ident: Identity, parent: Inode, mode: int) -> tuple[int, int]:
    """The mode and group of an inode ``ident`` creates in ``parent`` (``inode_init_owner``):
    a setgid parent passes on its group, and to directories the setgid bit; a
    non-directory keeps a requested setgid only for root or a member of its group."""
    gid = ident.gid
    if parent.mode & stat.S_ISGID:
        gid = parent.gid
        if stat.S_ISDIR(mode):
            mode |= stat.S_ISGID
    if (mode & stat.S_ISGID and not stat.S_ISDIR(mode) and not ident.is_root
            and not ident.in_group(gid)):
        mode &= ~stat.S_ISGID
    return mode, gid


# -- ownership changes ----------------------------------------------------------------------
def chown(ident: Identity, inode: Inode, uid: int | None,
          gid: int | None) -> tuple[int, int, int]:
    """The ``(uid, gid, mode)`` of ``inode`` after a chown by ``ident`` (``None`` or -1:
    unchanged), as Linux's ``chown_common``: only root changes the owner; the owner may
    change the group to one they belong to; EPERM otherwise.  Every chown of a
    non-directory that names an id clears the set-id bits :func:`has_privs` names."""
    new_uid = inode.uid if uid is None or uid == -1 else uid
    new_gid = inode.gid if gid is None or gid == -1 else gid
    if not ident.is_root:
        if new_uid != inode.uid:
            raise FsError(errno.EPERM, "only root may change a file's owner")
        if ident.uid != inode.uid or (new_gid != inode.gid and not ident.in_group(new_gid)):
            raise FsError(errno.EPERM, "only the owner may change the group, "
                          "and only to a group they belong to")
    mode = inode.mode
    if not inode.is_dir and any(v is not None and v != -1 for v in (uid, gid)):
        mode = drop_privs(mode)
    return new_uid, new_gid, mode


def chmod(ident: Identity, inode: Inode, mode: int, *, current: int | None = None,
          writer: bool = False, killpriv: Callable[[], bool] | None = None) -> int:
    """The permission bits (``0o7777``) ``inode`` gets from a chmod to ``mode`` by
    ``ident``: only the owner or root may (EPERM), except that a change dropping nothing
    but set-id bits is a writer's right -- ``writer`` (the same request truncates, which
    was checked as a write) or ``killpriv()`` (the door vouches that the kernel sends it for
    a process writing the file).  ``current``: the bits to judge that against, when a
    truncate in the same request already changed them.  Setgid as :func:`keep_setgid`."""
    perm = mode & 0o7777
    cur = stat.S_IMODE(inode.mode) if current is None else current
    drops = perm != cur and perm == drop_privs(cur)  # set-id bits only
    if not is_owner(ident, inode) and not (drops and (
            writer or (killpriv is not None and killpriv()))):
        raise FsError(errno.EPERM, f"only the owner may chmod inode {inode.ino}")
    return keep_setgid(ident, inode, perm)


def check_set_times(ident: Identity, inode: Inode, explicit: bool) -> None:
    """Whether ``ident`` may set ``inode``'s times (``utimensat``): explicit times only the
    owner or root (EPERM); "now" also anyone who may write it (EACCES otherwise)."""
    if is_owner(ident, inode):
        return
    if explicit:
        raise FsError(errno.EPERM, "only the owner may set explicit times")
    if not may_access(ident, inode, W_OK):
        raise FsError(errno.EACCES, "setting times to now needs write access")
