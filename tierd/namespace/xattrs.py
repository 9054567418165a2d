"""Extended attributes with Linux's namespace rules (user., trusted., security.).

``system.posix_acl_*`` arrives with the ACL issue; until then ``system.*`` answers
EOPNOTSUPP, which cp/rsync/tar treat as "no ACLs here".
"""

from __future__ import annotations

import errno
import stat

from tierd.acl import R_OK, W_OK, Identity, check_access, is_owner
from tierd.errors import FsError
from tierd.meta import Inode
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
            raise FsError(errno.EOPNOTSUPP, "system.* attributes (POSIX ACLs) are not "
                          "supported yet")
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

    async def getxattr(self, ident: Identity, ino: int, name: bytes) -> bytes:
        ns = _check_name(name)
        with self.meta.snapshot() as tx:
            inode = self._get(tx, ino)
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
        with self.meta.write() as tx:
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
        with self.meta.snapshot() as tx:
            self._get(tx, ino)
            names = [n for n, _ in tx.list_xattrs(ino)]
        if not ident.is_root:
            names = [n for n in names if not n.startswith(b"trusted.")]
        return names

    async def removexattr(self, ident: Identity, ino: int, name: bytes) -> None:
        ns = _check_name(name)
        with self.meta.write() as tx:
            inode = self._get(tx, ino)
            self._xattr_allowed(ident, inode, ns, write=True)
            if not tx.remove_xattr(ino, name):
                raise FsError(errno.ENODATA, f"no attribute {name.decode(errors='replace')!r}")
            inode.ctime_ns = now_ns()
            tx.put_inode(inode)
