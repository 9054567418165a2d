"""Differential property test: the namespace against the kernel's own file system.

Every example applies one random sequence of operations twice: to a fresh namespace (on lmdb,
inside one bucket) and to a fresh real directory with ``os`` calls.  After each operation the
outcomes must agree (success, or the same errno, and the same bytes for reads and xattr
reads); at ``check`` operations and at the end the two trees must agree: paths, types,
permission bits, owners, link counts, sizes, contents, symlink targets, user xattrs, and which
paths are hard links of one another.  At the end, with every handle closed, the store must
hold exactly the reachable inodes (files unlinked while open are freed at their release).

Operations (generated and applied to the real side by tests/differential_ops.py, which the
mount's differential test shares): open/create with O_CREAT/O_EXCL/O_TRUNC/O_APPEND and the
three access modes, writes/reads/ftruncate through handles kept open across the other
operations (so writes reach files after they were unlinked, renamed over or exchanged),
truncate, mkdir, rmdir, unlink, rename with RENAME_NOREPLACE and RENAME_EXCHANGE, link,
symlink, set/get/removexattr with XATTR_CREATE/REPLACE, chmod, chown, lchown, utime, access.
Each is generated from the state the previous ones left (paths that exist, children of
existing directories, a few fresh ones), over three names (one sorting between file "a" and
directory "a/") nested up to three deep, so collisions and errors are common.  Every sequence
starts from the same small populated tree.  The namespace runs over the daemon's placement
(tests/nsplacement.py); the deterministic coverage run uses both placements.

Who: run as root (CI), each operation is performed by root, alice (1000) or bob (1001, in
alice's group as a supplementary group): the real side switches its effective credentials
with seteuid for the call and the namespace gets the same Identity, so permission checks,
sticky directories, ownership rules and set-ID bit clearing are compared too.  Run as anyone
else, every operation is performed by that user.

The namespace takes (parent inode, name) like a FUSE low-level file system.  This driver plays
the kernel's part: it walks paths with ``Namespace.resolve`` (which follows symlinks), applies
the umask, and produces the few answers the VFS gives before any file system is asked (an
empty symlink target, O_EXCL/O_NOFOLLOW on a trailing symlink, the parent checks of the path
walk of two-path calls); each such place says so.  Operations a hardening sysctl
(fs.protected_*) could decide for a non-root caller are skipped on both sides.

A failure prints the generated list (paths as ``<how#index>``, resolved when the operation
runs) and, in the assertion message, every operation as it ran with both sides' outcomes.
"""


from __future__ import annotations

import asyncio
import errno
import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from differential_ops import (
    FLAGS,
    MAX_HANDLES,
    PRELUDE,
    SKIP,
    UMASK,
    USERS,
    UTIME_TIMES,
    OsSide,
    Outcome,
    Stats,
    compare_trees,
    err,
    is_writable,
    op_strategy,
    random_ops,
    resolve,
    tree_entry,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.internal.conjecture import engine as hypothesis_engine
from nsplacement import PLACEMENTS, close_namespace, open_namespace

from tierd.acl import Identity
from tierd.meta import MetaStore
from tierd.namespace import (
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    ROOT_INO,
    UTIME_NOW,
    Namespace,
)

BUCKET = "bkt"


def identity(who: str) -> Identity:
    uid, gid, groups = USERS[who]
    return Identity.ROOT if uid == 0 else Identity(uid, gid, frozenset(groups))


class VfsError(OSError):
    """An answer the kernel's path walk or open(2) gives before a file system is asked."""


@dataclass
class Handle:
    """The namespace's side of a handle; the real side's handle at the same position of
    :attr:`Differ.real` is the other."""

    fh: int
    ino: int
    writable: bool
    who: str  # the opener: a write clears set-user-ID bits unless the opener is root


class Differ:
    """Applies operations to both sides and compares outcomes and trees."""

    def __init__(self, ns: Namespace, store: MetaStore, real: Path) -> None:
        self.ns = ns
        self.store = store
        self.real = OsSide(str(real))
        self.ident = Identity.ROOT if "root" in USERS else identity("me")  # for inspection
        self.handles: list[Handle] = []
        self.log: list[str] = []

    # -- plumbing --------------------------------------------------------------------------
    async def parent(self, ident: Identity, path: str) -> tuple[int, bytes]:
        """The namespace parent inode of ``path`` (symlinks followed) and its last name."""
        *dirs, name = path.split("/")
        inode = await self.ns.resolve(ident, "/".join([BUCKET, *dirs]), follow=True)
        return inode.ino, name.encode()

    async def walked_parent(self, ident: Identity, path: str) -> tuple[int, bytes]:
        """Like :meth:`parent`, with the checks the kernel's path walk makes on the parent
        itself (a directory, searchable) before the call reaches a file system.  Two-path calls
        (rename, link) walk both paths first, so their errors must come from the walk."""
        *dirs, name = path.split("/")
        inode = await self.ns.resolve(ident, "/".join([BUCKET, *dirs]), follow=True)
        if not inode.is_dir:
            raise VfsError(errno.ENOTDIR, "path walk: not a directory")
        await self.ns.access(ident, inode.ino, os.X_OK)
        return inode.ino, name.encode()

    async def resolve(self, ident: Identity, path: str, follow: bool) -> int:
        inode = await self.ns.resolve(ident, f"{BUCKET}/{path}", follow=follow)
        return inode.ino


    def handle(self, idx: int) -> Handle | None:
        return self.handles[idx % len(self.handles)] if self.handles else None

    # -- one step --------------------------------------------------------------------------
    async def step(self, i: int, op: tuple[Any, ...], stats: Stats | None) -> None:
        kind = op[0]
        if kind == "check":
            self.log.append(f"{i:3}: {op!r}")
            await self.compare_trees(f"after op {i}")
            return
        if self.real.hardened(op):
            real = nsr = ("skip", "hardening sysctl")
        elif kind == "open":
            real, nsr = await self.do_open(op)
        elif kind == "close":
            real, nsr = await self.do_close(op)
        else:
            real = self.real.apply(op)
            try:
                nsr = ("ok", await self.ns_op(op)) if real != SKIP else SKIP
            except OSError as exc:
                nsr = err(exc)
        line = f"{i:3}: {op!r} -> real {real}, ns {nsr}"
        self.log.append(line)
        if stats is not None:
            stats.record(op, real)
        if real[0] == "err" and currently_in_test_context():
            event(f"errno {real[1]}")
        assert real == nsr, f"outcomes differ at op {i}: {op!r}\n" + "\n".join(self.log)

    # -- open and close (handles) ------------------------------------------------------------
    async def do_open(self, op: tuple[Any, ...]) -> tuple[Outcome, Outcome]:
        _, path, label, mode, who = op
        flags = FLAGS[label]
        real = self.real.apply(op)  # a file adds a handle (the oldest goes past the limit)
        fh = ino = None
        try:
            nsr, fh, ino = await self.ns_open(identity(who), path, flags, mode)
        except OSError as exc:
            nsr = err(exc)
        if real == ("ok", "file") and fh is not None:
            if len(self.handles) >= MAX_HANDLES:
                await self.release(self.handles.pop(0))
            self.handles.append(Handle(fh, ino or 0, is_writable(flags), who))
        else:  # a mismatch (reported by step): do not leak what one side opened
            if real == ("ok", "file"):
                os.close(self.real.handles.pop().fd)
            if fh is not None:
                await self.ns.release(fh)
        return real, nsr

    async def ns_open(
        self, ident: Identity, path: str, flags: int, mode: int
    ) -> tuple[Outcome, Any, Any]:
        ns = self.ns
        pino, name = await self.parent(ident, path)
        if flags & os.O_CREAT:
            try:
                existing = await ns.lookup(ident, pino, name)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                existing = None
            if existing is not None and existing.is_lnk:
                # open(2) itself: O_EXCL fails on any existing name; then
                # may_create_in_sticky() refuses O_CREAT on another user's symlink in a sticky
                # world-writable directory; then O_NOFOLLOW fails on a symlink
                if flags & os.O_EXCL:
                    raise VfsError(errno.EEXIST, "open(2): O_EXCL on an existing name")
                d = await ns.getattr(ident, pino)
                if (
                    d.mode & stat.S_ISVTX
                    and d.mode & stat.S_IWOTH
                    and existing.uid not in (d.uid, ident.uid)
                ):
                    raise VfsError(errno.EACCES, "open(2): may_create_in_sticky")
                raise VfsError(errno.ELOOP, "open(2): O_NOFOLLOW on a symlink")
            mode = stat.S_IFREG | (mode & 0o7777 & ~UMASK)  # the kernel applies the umask
            inode, fh = await ns.create(ident, pino, name, mode, flags)
            return ("ok", "dir" if inode.is_dir else "file"), fh, inode.ino
        inode = await ns.lookup(ident, pino, name)
        if inode.is_lnk:
            raise VfsError(errno.ELOOP, "O_NOFOLLOW on a symlink")
        if inode.is_dir and not is_writable(flags):
            # opendir: a directory is read through listdir; the kernel checks read access
            await ns.access(ident, inode.ino, os.R_OK)
            return ("ok", "dir"), None, None
        fh = await ns.open(ident, inode.ino, flags)
        return ("ok", "dir" if inode.is_dir else "file"), fh, inode.ino


    async def do_close(self, op: tuple[Any, ...]) -> tuple[Outcome, Outcome]:
        h = self.handle(op[1])  # before the real side drops its own
        real = self.real.apply(op)
        if h is None:
            return real, SKIP
        self.handles.remove(h)
        return real, await self.release(h)

    async def release(self, h: Handle) -> Outcome:
        try:
            await self.ns.flush(h.fh)
            await self.ns.release(h.fh)
        except OSError as exc:
            return err(exc)
        return ("ok", None)

    async def close_all(self) -> None:
        self.real.close_all()
        for h in list(self.handles):
            self.handles.remove(h)
            nsr = await self.release(h)
            assert nsr == ("ok", None), f"closing {h}: ns {nsr}"

    # -- everything else -------------------------------------------------------------------
    async def ns_op(self, op: tuple[Any, ...]) -> Any:
        ns = self.ns
        kind = op[0]
        if kind in ("write", "read", "ftruncate"):
            h = self.handle(op[1])
            assert h is not None
            if kind == "write":
                return await ns.write(h.fh, op[2], op[3])
            if kind == "read":
                return await ns.read(h.fh, op[2], op[3])
            await ns.setattr(identity(h.who), h.ino, size=op[2], fh=h.fh)
            return None
        ident = identity(op[-1])
        if kind == "truncate":
            await ns.setattr(ident, await self.resolve(ident, op[1], True), size=op[2])
        elif kind == "mkdir":
            # the kernel keeps only the permission and sticky bits and applies the umask
            await ns.mkdir(ident, *await self.parent(ident, op[1]), op[2] & 0o1777 & ~UMASK)
        elif kind == "rmdir":
            await ns.rmdir(ident, *await self.parent(ident, op[1]))
        elif kind == "unlink":
            await ns.unlink(ident, *await self.parent(ident, op[1]))
        elif kind == "rename":
            old = await self.walked_parent(ident, op[1])
            new = await self.walked_parent(ident, op[2])
            await ns.rename(ident, *old, *new, flags=op[3])
        elif kind == "link":
            src = await self.resolve(ident, op[1], False)
            await ns.link(ident, src, *await self.walked_parent(ident, op[2]))
        elif kind == "symlink":
            if not op[1]:  # symlink(2) fails on an empty target before the path walk
                raise VfsError(errno.ENOENT, "empty symlink target")
            await ns.symlink(ident, *await self.parent(ident, op[2]), op[1].encode())
        elif kind == "setxattr":
            ino = await self.resolve(ident, op[1], False)
            await ns.setxattr(ident, ino, op[2].encode(), op[3], op[4])
        elif kind == "removexattr":
            await ns.removexattr(ident, await self.resolve(ident, op[1], False), op[2].encode())
        elif kind == "getxattr":
            ino = await self.resolve(ident, op[1], False)
            return await ns.getxattr(ident, ino, op[2].encode())
        elif kind == "chmod":
            await ns.setattr(ident, await self.resolve(ident, op[1], True), mode=op[2])
        elif kind in ("chown", "lchown"):
            uid = None if op[2] == -1 else op[2]
            gid = None if op[3] == -1 else op[3]
            ino = await self.resolve(ident, op[1], kind == "chown")
            await ns.setattr(ident, ino, uid=uid, gid=gid)
        elif kind == "utime":
            ino = await self.resolve(ident, op[1], True)
            if op[2]:
                await ns.setattr(ident, ino, atime_ns=UTIME_NOW, mtime_ns=UTIME_NOW)
            else:
                await ns.setattr(ident, ino, atime_ns=UTIME_TIMES[0] * 10**9,
                                 mtime_ns=UTIME_TIMES[1] * 10**9)
        elif kind == "access":
            await ns.access(ident, await self.resolve(ident, op[1], True), op[2])
        else:
            raise AssertionError(f"unknown op {op!r}")
        return None

    # -- trees -----------------------------------------------------------------------------
    async def ns_tree(self) -> dict[str, dict[str, Any]]:
        ns, ident = self.ns, self.ident
        out: dict[str, dict[str, Any]] = {}

        async def entry(ino: int) -> dict[str, Any]:
            a = await ns.getattr(ident, ino)
            e = tree_entry(a.mode, a.nlink, a.uid, a.gid, a.ino)
            if a.is_reg:
                e["size"] = a.size
                fh = await ns.open(ident, ino, os.O_RDONLY)
                try:
                    e["data"] = await ns.read(fh, 0, a.size + 64)
                finally:
                    await ns.release(fh)
            elif a.is_lnk:
                e["size"] = a.size
                e["target"] = await ns.readlink(ident, ino)
            e["xattrs"] = {}
            if not a.is_lnk:  # user.* xattrs cannot exist on a symlink
                for n in await ns.listxattr(ident, ino):
                    if n.startswith(b"user."):
                        e["xattrs"][n] = await ns.getxattr(ident, ino, n)
            return e

        async def walk(dino: int, rel: str) -> None:
            listing = await ns.listdir(ident, dino)
            keys = [n + b"/" if i.is_dir else n for n, i in listing]
            assert keys == sorted(keys) and len(set(keys)) == len(keys), (
                f"listdir of {rel or '/'} not in S3 key order: {keys}"
            )
            assert (await ns.lookup(ident, dino, b".")).ino == dino
            for name, inode in listing:
                r = f"{rel}/{name.decode()}" if rel else name.decode()
                found = await ns.lookup(ident, dino, name)
                assert found.ino == inode.ino, f"lookup {r}: {found.ino} != listdir {inode.ino}"
                out[r] = await entry(inode.ino)
                if inode.is_dir:
                    dotdot = await ns.lookup(ident, inode.ino, b"..")
                    assert dotdot.ino == dino, f"{r}/.. is {dotdot.ino}, not {dino}"
                    await walk(inode.ino, r)

        root = await ns.resolve(ident, BUCKET)
        out[""] = await entry(root.ino)
        await walk(root.ino, "")
        return out

    async def compare_trees(self, when: str) -> set[int]:
        """Assert both trees agree; the namespace inode numbers in the bucket."""
        mine = await self.ns_tree()
        compare_trees(self.real.tree(), mine, "namespace", when, self.log)
        return {e["ino"] for e in mine.values()}

    async def check_no_leaks(self, tree_inodes: int) -> None:
        """With every handle closed, the store holds exactly the inodes reachable from the
        root: unlinked files were freed at their last release."""
        with self.store.snapshot() as tx:
            stored = sum(1 for _ in tx.iter_inodes())
            orphans = tx.list_orphans()
        assert orphans == [], f"orphans left after every handle was released: {orphans}"
        assert stored == tree_inodes + 1, (  # + the namespace root
            f"{stored} inodes stored, {tree_inodes} reachable from the root\n" + "\n".join(self.log)
        )



async def run_ops(base: Path, ops: Sequence[tuple[Any, ...]], stats: Stats | None,
                  placement: str) -> None:
    """Apply the prelude and ``ops`` to both sides, each with its paths resolved against the
    state the previous ones left."""
    # durable=False: commits are not fdatasynced one by one (durability is not what this test
    # compares, and the suite must stay fast); the engine and its semantics are the same
    store = MetaStore.open_lmdb(base / "meta", sync="durability-points")
    ns = await open_namespace(store, base, placement, umask=0o022)
    real = base / "real"
    differ = Differ(ns, store, real)
    try:
        # the bucket and the real directory: world-writable so every user can create in it
        os.mkdir(real)
        os.chmod(real, 0o777)
        bucket = await ns.mkdir(differ.ident, ROOT_INO, BUCKET.encode(), 0o777)
        await ns.setattr(differ.ident, bucket.ino, mode=0o777)
        for i, op in enumerate([*PRELUDE, *ops]):
            await differ.step(i, resolve(op, differ.real.known()), stats)
        await differ.compare_trees("at the end")
        await differ.close_all()
        inos = await differ.compare_trees("after closing every handle")
        await differ.check_no_leaks(len(inos))
    finally:
        differ.real.close_all()
        await close_namespace(ns)
        store.close()


def run_sequence(ops: Sequence[tuple[Any, ...]], stats: Stats | None = None,
                 placement: str = "hot-only") -> None:
    old_umask = os.umask(UMASK)
    try:
        with tempfile.TemporaryDirectory(prefix="tierd-diff-") as base:
            os.chmod(base, 0o755)  # other users must reach base/real
            asyncio.run(run_ops(Path(base), ops, stats, placement))
    finally:
        os.umask(old_umask)


@pytest.fixture(autouse=True)
def bounded_shrinking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cap the time hypothesis spends shrinking a failure of this module's tests (its default
    is 5 minutes; a failing sequence is readable long before that).  A private constant:
    left alone if a hypothesis version drops it."""
    if hasattr(hypothesis_engine, "MAX_SHRINKING_SECONDS"):
        monkeypatch.setattr(hypothesis_engine, "MAX_SHRINKING_SECONDS", 60)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@settings(
    max_examples=250,  # per placement: the suite's time stays that of 500 on one
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.integers(1, 60).flatmap(lambda n: st.lists(op_strategy(), min_size=n, max_size=n)))
def test_namespace_matches_the_kernel(placement: str, ops: list[tuple[Any, ...]]) -> None:
    """A failure shows the generated list (paths as <how#index>) and, in the assertion
    message, each operation as it ran, with both sides' outcomes."""
    run_sequence(ops, placement=placement)


# Errnos a good generator must provoke; if the generator drifts so an error path is never
# taken, this fails rather than the differential test silently testing less.
EXPECTED_ERRNOS = {
    "ENOENT",
    "EEXIST",
    "ENOTEMPTY",
    "EISDIR",
    "ENOTDIR",
    "ENODATA",
    "ELOOP",
    "EBADF",
    "EPERM",
    "EINVAL",
    "EACCES",
}
EXPECTED_SUCCESSES = {
    "open ok",
    "write ok",
    "read ok",
    "ftruncate ok",
    "truncate ok",
    "mkdir ok",
    "rmdir ok",
    "unlink ok",
    "rename/0 ok",
    f"rename/{RENAME_NOREPLACE} ok",
    f"rename/{RENAME_EXCHANGE} ok",
    "link ok",
    "symlink ok",
    "setxattr ok",
    "removexattr ok",
    "getxattr ok",
    "chmod ok",
    "chown ok",
    "lchown ok",
    "utime ok",
    "access ok",
}


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_differential_covers_error_paths(placement: str) -> None:
    """A deterministic run of the same generator: every listed errno and every operation's
    success path occurs (and both sides agree on all of them)."""
    stats = Stats()
    for seed in range(100):
        run_sequence(random_ops(seed), stats, placement)
    seen = {k.split()[1] for k in stats.outcomes if k.startswith("errno ")}
    missing = EXPECTED_ERRNOS - seen
    assert not missing, f"errnos never provoked: {missing}; seen {dict(stats.outcomes)}"
    missing_ok = EXPECTED_SUCCESSES - set(stats.outcomes)
    assert not missing_ok, f"never succeeded: {missing_ok}; seen {dict(stats.outcomes)}"
