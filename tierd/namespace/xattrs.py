"""Extended attributes with Linux's namespace rules (user., trusted., security.), and POSIX
ACLs as ``system.posix_acl_access`` / ``system.posix_acl_default``.

ACLs are not stored as xattrs but on the inode (:attr:`Inode.acl_access`,
:attr:`Inode.acl_default`), where every permission check finds them; these calls only
translate, with the kernel's rules for who may set what (``set_posix_acl``).  Other
``system.*`` names answer EOPNOTSUPP, which cp/rsync/tar treat as "not supported here".
"""

from __future__ import annotations

import errno
import stat

from tierd.acl import R_OK, W_OK, Identity, check_access, is_owner
from tierd.acl import posix_acl as pacl
from tierd.acl.modes import has_privs, keep_setgid
from tierd.errors import FsError
from tierd.meta import Inode, MetaTxn
from tierd.namespace.base import NamespaceBase, now_ns
from tierd.namespace.names import XATTR_NAME_MAX, XATTR_SIZE_MAX

XATTR_CREATE = 1
XATTR_REPLACE = 2

_NAMESPACES = (b"user.", b"trusted.", b"security.", b"system.")


def _check_name(name: bytes) -> bytes:
    if not name or len(name) > XATTR_NAME_MAX:
        raise FsError(errno.ERANGE, f"xattr name must be 1 to {XATTR_NAME_MAX} bytes")
    for ns in _NAMESPACES:
        if name.startswith(ns):
            if len(name) == len(ns):
                raise FsError(errno.EINVAL, f"xattr name {name!r} has no name after its prefix")
            return ns
    raise FsError(errno.EOPNOTSUPP, f"xattr name {name!r} must start with user., trusted., "
                  "security. or system.")


class XattrOps(NamespaceBase):
    def _xattr_allowed(self, ident: Identity, inode: Inode, ns: bytes, write: bool) -> None:
        """Linux's xattr_permission(): which caller may touch which namespace."""
        if ns == b"system.":
            raise FsError(errno.EOPNOTSUPP, "system.* attributes other than "
                          "system.posix_acl_access and system.posix_acl_default are not "
                          "supported")
        if ns == b"trusted.":
            if not ident.is_root:
                raise FsError(errno.EPERM if write else errno.ENODATA,
                              "trusted.* attributes are for root only")
            return
        if ns == b"user." and not (inode.is_reg or inode.is_dir):
            raise FsError(errno.EPERM if write else errno.ENODATA,
                          "user.* attributes exist only on files and directories")
        if (ns == b"user." and write and inode.is_dir and inode.mode & stat.S_ISVTX
                and not is_owner(ident, inode)):
            raise FsError(errno.EPERM, "only the owner may change user.* attributes of a "
                          "sticky directory")
        check_access(ident, inode, W_OK if write else R_OK, f"inode {inode.ino}")

    async def getxattr(self, ident: Identity, ino: int, name: bytes,
                       bounded: bool = False) -> bytes:
        ns = _check_name(name)

        def reads(tx: MetaTxn) -> None:  # (the body's, run off the loop: tierd.meta.atxn)
            tx.get_inode(ino)
            if name not in pacl.ACL_XATTRS:
                tx.get_xattr(ino, name)

        async with self.meta.asnapshot(warm=reads if bounded else None,
                                       bounded=bounded) as tx:
            inode = self._get(tx, ino)
            if name in pacl.ACL_XATTRS:  # readable by anyone who reached the inode
                acl = inode.acl_access if name == pacl.ACCESS_XATTR else inode.acl_default
                if not acl:
                    raise FsError(errno.ENODATA, f"no {name.decode()} (the mode bits are "
                                  "the whole story)")
                return acl
            self._xattr_allowed(ident, inode, ns, write=False)
            value = tx.get_xattr(ino, name)
        if value is None:
            raise FsError(errno.ENODATA, f"no attribute {name.decode(errors='replace')!r}")
        return value

    async def setxattr(
        self, ident: Identity, ino: int, name: bytes, value: bytes, flags: int = 0
    ) -> None:
        ns = _check_name(name)
        if flags & ~(XATTR_CREATE | XATTR_REPLACE) or flags == XATTR_CREATE | XATTR_REPLACE:
            raise FsError(errno.EINVAL, f"invalid setxattr flags {flags:#x}")
        if len(value) > XATTR_SIZE_MAX:
            raise FsError(errno.E2BIG, f"xattr value is {len(value)} bytes; the limit is "
                          f"{XATTR_SIZE_MAX}")
        if name in pacl.ACL_XATTRS:
            await self._set_acl(ident, ino, name, pacl.parse(value))
            return
        async with self.meta.awrite() as tx:
            inode = self._get(tx, ino)
            self._xattr_allowed(ident, inode, ns, write=True)
            exists = tx.get_xattr(ino, name) is not None
            if flags & XATTR_CREATE and exists:
                raise FsError(errno.EEXIST, f"attribute {name.decode(errors='replace')!r} "
                              "exists")
            if flags & XATTR_REPLACE and not exists:
                raise FsError(errno.ENODATA, f"no attribute {name.decode(errors='replace')!r}")
            tx.set_xattr(ino, name, bytes(value))
            inode.ctime_ns = now_ns()
            tx.put_inode(inode)

    async def listxattr(self, ident: Identity, ino: int) -> list[bytes]:
        async with self.meta.asnapshot() as tx:
            inode = self._get(tx, ino)
            names = [n for n, _ in tx.list_xattrs(ino)]
        if inode.acl_access:
            names.append(pacl.ACCESS_XATTR)
        if inode.acl_default:
            names.append(pacl.DEFAULT_XATTR)
        if not ident.is_root:
            names = [n for n in names if not n.startswith(b"trusted.")]
        return names

    async def removexattr(self, ident: Identity, ino: int, name: bytes) -> None:
        ns = _check_name(name)
        if name in pacl.ACL_XATTRS:
            await self._set_acl(ident, ino, name, ())
            return
        async with self.meta.awrite() as tx:
            inode = self._get(tx, ino)
            self._xattr_allowed(ident, inode, ns, write=True)
            if not tx.remove_xattr(ino, name):
                raise FsError(errno.ENODATA, f"no attribute {name.decode(errors='replace')!r}")
            inode.ctime_ns = now_ns()
            tx.put_inode(inode)

    async def _set_acl(self, ident: Identity, ino: int, name: bytes, acl: pacl.Acl) -> None:
        """Set (or with an empty ``acl`` remove) an ACL, as Linux's ``set_posix_acl`` and
        ``posix_acl_update_mode``: a default ACL only on directories (EACCES; removing one
        elsewhere succeeds), only the owner or root (EPERM); an access ACL sets the mode bits
        (the group bits become the mask) and is stored only when it says more than they do;
        setting it clears setgid unless the caller is root or in the file's group."""
        async with self.meta.awrite() as tx:
            inode = self._get(tx, ino)
            if inode.is_lnk:
                raise FsError(errno.EOPNOTSUPP, "symbolic links have no POSIX ACLs")
            if name == pacl.DEFAULT_XATTR and not inode.is_dir:
                if acl:
                    raise FsError(errno.EACCES, "only directories have a default ACL")
                return
            if not is_owner(ident, inode):
                raise FsError(errno.EPERM, f"only the owner (uid {inode.uid}) or root may "
                              f"change the ACL of inode {ino}")
            if name == pacl.DEFAULT_XATTR:
                if inode.acl_default == (new := pacl.serialize(acl) if acl else b""):
                    return
                inode.acl_default = new
            elif acl:
                mode, not_equiv = pacl.equiv_mode(acl, inode.mode)
                inode.mode = mode = keep_setgid(ident, inode, mode)
                inode.anon &= mode  # as chmod: only narrows the anonymous grant
                inode.acl_access = pacl.serialize(acl) if not_equiv else b""
            elif inode.acl_access:
                inode.acl_access = b""  # the mode bits stay as they are
            else:
                return
            inode.ctime_ns = now_ns()
            tx.put_inode(inode)
            of = self._open.get(ino)
            if of is not None:
                of.ctime_ns = inode.ctime_ns
                of.privs = has_privs(inode.mode)
