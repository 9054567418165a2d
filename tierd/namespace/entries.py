"""Names and attributes: lookup, getattr/setattr, create/mknod/mkdir/symlink/link,
unlink/rmdir, rename, listing and path resolution — Linux semantics and errnos."""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable

from tierd.acl import R_OK, W_OK, X_OK, Identity, check_access, may_delete
from tierd.acl import posix_acl as pacl
from tierd.acl.modes import (
    AccessDenied,
    check_set_times,
    chmod,
    chown,
    has_privs,
    may_hardlink,
    protected_hardlinks,
)
from tierd.errors import FsError
from tierd.meta import EMPTY_MD5, ROOT_INO, Bucket, Dirent, Inode, MetaTxn
from tierd.meta.reads import create_reads
from tierd.namespace import versions
from tierd.namespace.base import (
    MAX_SYMLINK_HOPS,
    StatFs,
    now_ns,
)
from tierd.namespace.names import SYMLINK_MAX, check_bucket_name, check_name
from tierd.namespace.resize import ResizeOps

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
UTIME_NOW = -1  # setattr(atime_ns=UTIME_NOW): the current time, as utimensat's UTIME_NOW


class EntryOps(ResizeOps):
    # -- reading ---------------------------------------------------------------------------
    async def lookup(self, ident: Identity, parent: int, name: bytes,
                     bounded: bool = False) -> Inode:
        def find(tx: MetaTxn) -> Inode | None:  # (also run off the loop: tierd.meta.atxn)
            return self._child(tx, ident, self._dir(tx, parent), name)
        async with self.meta.asnapshot(warm=find, bounded=bounded) as tx:
            child = find(tx)
        if child is None and parent != ROOT_INO and await self.placement.refresh(parent):
            async with self.meta.asnapshot(warm=find, bounded=bounded) as tx:  # into cold?
                child = find(tx)
        if child is None:
            raise FsError(errno.ENOENT, f"{name.decode(errors='replace')!r} not found")
        return self._live(child)

    async def getattr(self, ident: Identity, ino: int, bounded: bool = False) -> Inode:
        async with self.meta.asnapshot(warm=lambda tx: tx.get_inode(ino),
                                       bounded=bounded) as tx:
            return self._live(self._get(tx, ino))

    async def access(self, ident: Identity, ino: int, mask: int) -> None:
        async with self.meta.asnapshot() as tx:
            check_access(ident, self._get(tx, ino), mask)

    async def readlink(self, ident: Identity, ino: int) -> bytes:
        async with self.meta.asnapshot() as tx:
            inode = self._get(tx, ino)
        if not inode.is_lnk:
            raise FsError(errno.EINVAL, f"inode {ino} is not a symbolic link")
        return inode.target

    async def listdir(
        self, ident: Identity, ino: int, start_after: bytes = b"", limit: int | None = None
    ) -> list[tuple[bytes, Inode]]:
        """Entries after ``start_after`` in S3 key order (a directory sorts as ``name/``).

        ``start_after`` is the last name a caller saw; a directory's name may be given with or
        without its trailing slash.  Entries added or removed between calls neither repeat
        nor hide others, which is what stable readdir offsets and S3 markers both need.
        """
        out: list[tuple[bytes, Inode]] = []
        if ino != ROOT_INO and not start_after:
            await self.placement.refresh(ino)  # show what cold has (transparent import)
        async with self.meta.asnapshot() as tx:
            d = self._dir(tx, ino)
            check_access(ident, d, R_OK, f"directory inode {ino}")
            marker = start_after
            if marker and not marker.endswith(b"/"):
                entry = tx.lookup(ino, marker)
                if entry is not None and entry.kind == stat.S_IFDIR:
                    marker += b"/"
            for name, _, dirent in tx.list_dirents(ino, marker):
                if limit is not None and len(out) >= limit:
                    break
                child = tx.get_inode(dirent.ino)
                if child is not None:
                    out.append((name, self._live(child)))
        return out

    async def resolve(self, ident: Identity, path: str, follow: bool = True) -> Inode:
        """The inode at ``path`` ("bucket/dir/file") from the namespace root, following
        symbolic links in the middle (and at the end when ``follow``)."""
        async with self.meta.asnapshot() as tx:
            return self._live(self._resolve(tx, ident, path.encode(), follow))

    def _resolve(self, tx: MetaTxn, ident: Identity, path: bytes, follow: bool) -> Inode:
        parts = [p for p in path.split(b"/") if p]
        cur = self._get(tx, ROOT_INO)
        hops = 0
        while parts:
            name = parts.pop(0)
            if not cur.is_dir:
                raise FsError(errno.ENOTDIR, f"{name.decode(errors='replace')!r}: a path "
                              "component is not a directory")
            child = self._child(tx, ident, cur, name)
            if child is None:
                raise FsError(errno.ENOENT, f"{path.decode(errors='replace')!r} not found")
            if child.is_lnk and (parts or follow):
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise FsError(errno.ELOOP, "too many levels of symbolic links")
                if ident.grant is not None:
                    ident.grant.active = False  # a policy's Allow does not follow links
                target = child.target
                if target.startswith(b"/"):
                    cur = self._get(tx, ROOT_INO)
                parts = [p for p in target.split(b"/") if p] + parts
                continue
            cur = child
        return cur

    async def statfs(self) -> StatFs:
        st = self.hot.statvfs()
        async with self.meta.asnapshot() as tx:
            inodes = tx.counter("inodes")
        files = max(st.f_files, inodes + st.f_ffree)
        return StatFs(
            f_bsize=st.f_bsize,
            f_frsize=st.f_frsize,
            f_blocks=st.f_blocks,
            f_bfree=st.f_bfree,
            f_bavail=st.f_bavail,
            f_files=files,
            f_ffree=files - inodes,
            f_favail=files - inodes,
            f_namemax=255,
        )

    # -- attributes ------------------------------------------------------------------------
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
        """chmod/chown/truncate/utimens in one call, with Linux's ownership rules.

        ``killpriv``: asked (only for a non-owner's mode change that drops nothing but set-id
        bits) whether the door vouches that the change comes from a process writing the
        file (the kernel dropping set-id bits for it, sent as a chmod with the writer's
        credentials): a change that only drops those bits is then allowed to a non-owner,
        as Linux allows the write; so is it in the same request as a truncate."""
        before = None
        if size is not None:
            if mode is not None:  # a truncate drops set-id bits: judge the mode against
                async with self.meta.asnapshot() as tx:  # what the file had when asked
                    before = stat.S_IMODE(self._get(tx, ino).mode)
            await self._truncate(ident, ino, size, fh)
        async with self.meta.awrite() as tx:
            inode = self._get(tx, ino)
            t = now_ns()
            changed = False
            if uid is not None or gid is not None:
                inode.uid, inode.gid, inode.mode = chown(ident, inode, uid, gid)
                changed = True
            if mode is not None:
                # a truncate is a write: (f)truncate already checked the caller may write
                perm = chmod(ident, inode, mode, current=before, writer=size is not None,
                             killpriv=killpriv)
                inode.mode = stat.S_IFMT(inode.mode) | perm
                inode.anon &= perm  # a chmod only narrows the anonymous grant (tierd.acl)
                if inode.acl_access:  # posix_acl_chmod: the group bits set the mask
                    inode.acl_access = pacl.serialize(
                        pacl.chmod_acl(pacl.cached_parse(inode.acl_access), perm))
                changed = True
            of = self._open.get(ino)
            if of is not None:
                of.privs = has_privs(inode.mode)
            if atime_ns is not None or mtime_ns is not None:
                explicit = any(v is not None and v != UTIME_NOW for v in (atime_ns, mtime_ns))
                check_set_times(ident, inode, explicit)
                if atime_ns is not None:
                    inode.atime_ns = t if atime_ns == UTIME_NOW else atime_ns
                if mtime_ns is not None:
                    inode.mtime_ns = t if mtime_ns == UTIME_NOW else mtime_ns
                    of = self._open.get(ino)
                    if of is not None:
                        of.mtime_ns = inode.mtime_ns
                changed = True
            if changed:
                inode.ctime_ns = t
                of = self._open.get(ino)
                if of is not None:
                    of.ctime_ns = t
                tx.put_inode(inode)
        return self._live(inode)

    # -- creating --------------------------------------------------------------------------
    def _creatable(self, tx: MetaTxn, ident: Identity, parent: int, name: bytes) -> Inode:
        """The parent directory, after the checks every create shares (EEXIST first, as the
        kernel's lookup comes before the permission check)."""
        d = self._absent(tx, ident, parent, name)
        check_access(ident, d, W_OK | X_OK, f"directory inode {parent}")
        return d

    def _absent(self, tx: MetaTxn, ident: Identity, parent: int, name: bytes) -> Inode:
        """The parent directory, once ``name`` is known not to be in it (the kernel's
        ``filename_create``: search permission, then EEXIST); its write permission is
        still to be checked (:meth:`_creatable`)."""
        d = self._dir(tx, parent)
        if name in (b".", b".."):
            raise FsError(errno.EEXIST, f"{name.decode()!r} always exists")
        check_name(name)
        check_access(ident, d, X_OK, f"directory inode {parent}")
        if tx.lookup(parent, name) is not None:
            raise FsError(errno.EEXIST, f"{name.decode(errors='replace')!r} already exists")
        return d

    @staticmethod
    def _inherit_acl(inode: Inode, d: Inode, umask: int) -> Inode:
        """``posix_acl_create`` for a new ``inode`` in directory ``d``: the parent's default
        ACL (if any) masked by the create mode gives the new access ACL and mode, and a new
        directory inherits the default ACL too; without one, the ``umask`` applies."""
        inh = pacl.inherit(d.acl_default, inode.mode, umask)
        inode.mode, inode.acl_access, inode.acl_default = inh.mode, inh.access, inh.default
        return inode

    def _link_new(self, tx: MetaTxn, d: Inode, name: bytes, inode: Inode) -> None:
        tx.put_inode(inode)
        tx.add_dirent(d.ino, name, Dirent(inode.ino, stat.S_IFMT(inode.mode)))
        self._touch_dir(tx, d, 1 if inode.is_dir else 0)

    async def mknod(
        self, ident: Identity, parent: int, name: bytes, mode: int, rdev: int = 0,
        umask: int = 0,
    ) -> Inode:
        """``umask`` (of the caller) applies unless the parent has a default ACL."""
        kind = stat.S_IFMT(mode) or stat.S_IFREG
        if kind == stat.S_IFDIR:
            return await self.mkdir(ident, parent, name, mode, umask)
        if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK):
            raise FsError(errno.EINVAL, f"unsupported file type {oct(kind)}")
        async with self.meta.awrite() as tx:
            d = self._creatable(tx, ident, parent, name)
            if parent == ROOT_INO:
                raise FsError(errno.EPERM, "the namespace root holds only buckets (directories)")
            if kind in (stat.S_IFCHR, stat.S_IFBLK) and not ident.is_root:
                raise FsError(errno.EPERM, "only root may create device nodes")
            inode = self._new_inode(tx, ident, d, kind | (mode & 0o7777), rdev=rdev,
                                    etag=EMPTY_MD5 if kind == stat.S_IFREG else "")
            self._inherit_acl(inode, d, umask)
            self._link_new(tx, d, name, inode)
            self._queue(tx, inode)
        return inode

    async def mkdir(
        self, ident: Identity, parent: int, name: bytes, mode: int, umask: int = 0
    ) -> Inode:
        """``umask`` (of the caller) applies unless the parent has a default ACL."""
        async with self.meta.awrite(warm=lambda tx: create_reads(tx, parent, name)) as tx:
            d = self._creatable(tx, ident, parent, name)
            inode = self._new_inode(tx, ident, d, stat.S_IFDIR | (mode & 0o7777),
                                    nlink=2, parent=parent)
            self._inherit_acl(inode, d, umask)
            if parent == ROOT_INO:
                bucket = name.decode("utf-8", "surrogateescape")
                check_bucket_name(bucket)
                tx.put_bucket(Bucket(bucket, inode.ino, ident.uid, inode.btime_ns))
            self._link_new(tx, d, name, inode)
        return inode

    async def symlink(self, ident: Identity, parent: int, name: bytes, target: bytes) -> Inode:
        if not target:
            raise FsError(errno.ENOENT, "empty symbolic link target")
        if len(target) > SYMLINK_MAX or b"\0" in target:
            raise FsError(errno.ENAMETOOLONG, "symbolic link target is too long")
        async with self.meta.awrite() as tx:
            d = self._creatable(tx, ident, parent, name)
            if parent == ROOT_INO:
                raise FsError(errno.EPERM, "the namespace root holds only buckets (directories)")
            inode = self._new_inode(tx, ident, d, stat.S_IFLNK | 0o777, size=len(target),
                                    target=target)
            self._link_new(tx, d, name, inode)
        return inode

    async def link(self, ident: Identity, ino: int, new_parent: int, new_name: bytes) -> Inode:
        """A new name for ``ino``.  Where the host sets ``fs.protected_hardlinks`` its rule
        (:func:`tierd.acl.modes.may_hardlink`) is checked for every door where the kernel's
        ``do_linkat`` checks it: after the new name's lookup (EEXIST), before the
        directory's write permission (EPERM, not EACCES)."""
        async with self.meta.awrite() as tx:
            d = self._absent(tx, ident, new_parent, new_name)
            if protected_hardlinks() and not may_hardlink(ident, self._get(tx, ino)):
                raise FsError(errno.EPERM, "fs.protected_hardlinks: only the owner may link a "
                              "file the caller cannot both read and write")
            check_access(ident, d, W_OK | X_OK, f"directory inode {new_parent}")
            inode = self._get(tx, ino)
            if inode.is_dir:
                raise FsError(errno.EPERM, "hard links to directories are not allowed")
            if new_parent == ROOT_INO:
                raise FsError(errno.EPERM, "the namespace root holds only buckets (directories)")
            if inode.nlink == 0:
                raise FsError(errno.ENOENT, "the file has been deleted")
            inode.nlink += 1
            inode.ctime_ns = now_ns()
            tx.put_inode(inode)
            tx.add_dirent(new_parent, new_name, Dirent(ino, stat.S_IFMT(inode.mode)))
            self._touch_dir(tx, d)
            self._names_changed(tx, inode)
        return self._live(inode)

    # -- removing --------------------------------------------------------------------------
    def _removable(
        self, tx: MetaTxn, ident: Identity, parent: int, name: bytes
    ) -> tuple[Inode, Inode]:
        d = self._dir(tx, parent)
        child = self._child(tx, ident, d, name)
        if child is None:
            raise FsError(errno.ENOENT, f"{name.decode(errors='replace')!r} not found")
        check_access(ident, d, W_OK | X_OK, f"directory inode {parent}")
        if not may_delete(ident, d, child):
            raise AccessDenied(errno.EPERM, "the sticky bit protects this entry: only its "
                               "owner, the directory's owner or root may remove it")
        return d, child

    async def unlink(self, ident: Identity, parent: int, name: bytes) -> None:
        async with self.meta.awrite() as tx:
            d, child = self._removable(tx, ident, parent, name)
            if child.is_dir:
                raise FsError(errno.EISDIR, f"{name.decode(errors='replace')!r} is a directory")
            tx.remove_dirent(parent, name)
            self._touch_dir(tx, d)
            drops = versions.unlinked(self, tx, d, name, child)  # a marker when versioned
        for ino in drops:
            self._forget_data(ino)

    def _unref(self, tx: MetaTxn, inode: Inode) -> bool:
        inode.nlink -= 1
        inode.ctime_ns = now_ns()
        if inode.nlink > 0:
            tx.put_inode(inode)
            self._names_changed(tx, inode)
            return False
        return self._drop_inode(tx, inode)

    async def rmdir(self, ident: Identity, parent: int, name: bytes) -> None:
        if name == b".":
            raise FsError(errno.EINVAL, "cannot remove '.'")
        if name == b"..":
            raise FsError(errno.ENOTEMPTY, "cannot remove '..'")
        async with self.meta.awrite() as tx:
            d, child = self._removable(tx, ident, parent, name)
            self._rmdir_locked(tx, d, name, child)

    def _rmdir_locked(self, tx: MetaTxn, d: Inode, name: bytes, child: Inode) -> None:
        if not child.is_dir:
            raise FsError(errno.ENOTDIR, f"{name.decode(errors='replace')!r} is not a directory")
        if tx.has_children(child.ino):
            raise FsError(errno.ENOTEMPTY, f"directory {name.decode(errors='replace')!r} "
                          "is not empty")
        tx.remove_dirent(d.ino, name)
        if d.ino == ROOT_INO:
            tx.delete_bucket(name.decode("utf-8", "surrogateescape"))
        tx.delete_inode(child.ino)
        self._touch_dir(tx, d, -1)

    # -- rename ----------------------------------------------------------------------------
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
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == (
            RENAME_NOREPLACE | RENAME_EXCHANGE
        ):
            raise FsError(errno.EINVAL, f"invalid rename flags {flags:#x}")
        drops: list[int] = []
        async with self.meta.awrite() as tx:
            od = self._dir(tx, old_parent)
            nd = self._dir(tx, new_parent)
            for n in (old_name, new_name):
                if n in (b".", b".."):
                    raise FsError(errno.EBUSY if flags else errno.EINVAL,
                                  "cannot rename '.' or '..'")
            src = self._child(tx, ident, od, old_name)
            if src is None:
                raise FsError(errno.ENOENT, f"{old_name.decode(errors='replace')!r} not found")
            dst = self._child(tx, ident, nd, new_name)
            if flags & RENAME_NOREPLACE and dst is not None:
                raise FsError(errno.EEXIST, f"{new_name.decode(errors='replace')!r} exists")
            if flags & RENAME_EXCHANGE and dst is None:
                raise FsError(errno.ENOENT, f"{new_name.decode(errors='replace')!r} not found")
            if ROOT_INO in (old_parent, new_parent):
                raise FsError(errno.EPERM, "buckets cannot be renamed, and entries cannot be "
                              "moved into or out of the namespace root")
            # ancestry: a directory cannot move under itself; a target that is an
            # ancestor of the source is never empty
            if src.is_dir and self._is_ancestor(tx, src.ino, new_parent):
                raise FsError(errno.EINVAL, "cannot move a directory into its own subtree")
            if dst is not None and dst.is_dir and self._is_ancestor(tx, dst.ino, old_parent):
                if flags & RENAME_EXCHANGE:
                    raise FsError(errno.EINVAL, "cannot exchange a directory with its subtree")
                raise FsError(errno.ENOTEMPTY, "the target is an ancestor of the source")
            if dst is not None and dst.ino == src.ino:
                return
            self._check_rename_perms(tx, ident, od, src, nd, dst, old_parent != new_parent,
                                     bool(flags & RENAME_EXCHANGE), new_name)
            if flags & RENAME_EXCHANGE:
                assert dst is not None
                self._exchange(tx, od, old_name, src, nd, new_name, dst)
                return
            if dst is not None:
                if dst.is_dir:
                    if tx.has_children(dst.ino):
                        raise FsError(errno.ENOTEMPTY, f"{new_name.decode(errors='replace')!r}"
                                      " is not empty")
                    tx.remove_dirent(new_parent, new_name)
                    tx.delete_inode(dst.ino)
                    nd.nlink -= 1
                else:
                    tx.remove_dirent(new_parent, new_name)
                    drops = versions.supersede(self, tx, nd, new_name, dst, src)
            self._move(tx, od, old_name, src, nd, new_name)
            drops += versions.moved_away(self, tx, od, old_name, src)
        for ino in drops:
            self._forget_data(ino)

    def _is_ancestor(self, tx: MetaTxn, ancestor: int, ino: int) -> bool:
        """True when directory ``ancestor`` is ``ino`` or lies on its path to the root."""
        seen = 0
        while True:
            if ino == ancestor:
                return True
            if ino == ROOT_INO or seen > 4096:
                return False
            node = tx.get_inode(ino)
            if node is None:
                return False
            ino = node.parent or ROOT_INO
            seen += 1

    def _check_rename_perms(
        self, tx: MetaTxn, ident: Identity, od: Inode, src: Inode, nd: Inode,
        dst: Inode | None, cross: bool, exchange: bool, new_name: bytes,
    ) -> None:
        """Checks in the order of Linux's vfs_rename(), so the errno matches."""
        check_access(ident, od, W_OK | X_OK, f"directory inode {od.ino}")
        if not may_delete(ident, od, src):
            raise AccessDenied(errno.EPERM, "the sticky bit protects the source entry")
        check_access(ident, nd, W_OK | X_OK, f"directory inode {nd.ino}")
        if dst is not None and not may_delete(ident, nd, dst):
            raise AccessDenied(errno.EPERM, "the sticky bit protects the target entry")
        if dst is not None and not exchange:  # vfs_rename: may_delete() checks the types
            if src.is_dir and not dst.is_dir:
                raise FsError(errno.ENOTDIR, f"{new_name.decode(errors='replace')!r} is "
                              "not a directory")
            if not src.is_dir and dst.is_dir:
                raise FsError(errno.EISDIR, f"{new_name.decode(errors='replace')!r} is "
                              "a directory")
        if cross:
            # moving a directory rewrites its "..": that needs write permission on it
            if src.is_dir:
                check_access(ident, src, W_OK, f"directory inode {src.ino}")
            if exchange and dst is not None and dst.is_dir:
                check_access(ident, dst, W_OK, f"directory inode {dst.ino}")

    def _move(
        self, tx: MetaTxn, od: Inode, old_name: bytes, src: Inode, nd: Inode, new_name: bytes
    ) -> None:
        tx.remove_dirent(od.ino, old_name)
        tx.add_dirent(nd.ino, new_name, Dirent(src.ino, stat.S_IFMT(src.mode)))
        src.ctime_ns = now_ns()
        if src.is_dir and od.ino != nd.ino:
            src.parent = nd.ino
            od.nlink -= 1
            nd.nlink += 1
        tx.put_inode(src)
        if od.ino == nd.ino:
            self._touch_dir(tx, nd)
        else:
            self._touch_dir(tx, od)
            self._touch_dir(tx, nd)
        self._names_changed(tx, src)

    def _exchange(
        self, tx: MetaTxn, od: Inode, old_name: bytes, src: Inode,
        nd: Inode, new_name: bytes, dst: Inode,
    ) -> None:
        tx.remove_dirent(od.ino, old_name)
        tx.remove_dirent(nd.ino, new_name)
        tx.add_dirent(od.ino, old_name, Dirent(dst.ino, stat.S_IFMT(dst.mode)))
        tx.add_dirent(nd.ino, new_name, Dirent(src.ino, stat.S_IFMT(src.mode)))
        t = now_ns()
        src.ctime_ns = dst.ctime_ns = t
        if od.ino != nd.ino:
            if src.is_dir:
                src.parent = nd.ino
                od.nlink -= 1
                nd.nlink += 1
            if dst.is_dir:
                dst.parent = od.ino
                nd.nlink -= 1
                od.nlink += 1
        tx.put_inode(src)
        tx.put_inode(dst)
        self._names_changed(tx, src)
        self._names_changed(tx, dst)
        if od.ino == nd.ino:
            self._touch_dir(tx, nd)
        else:
            self._touch_dir(tx, od)
            self._touch_dir(tx, nd)

