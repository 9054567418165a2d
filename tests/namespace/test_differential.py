"""Differential property test: the namespace against the kernel's own file system.

Every example applies one random sequence of operations twice: to a fresh namespace (on lmdb,
inside one bucket) and to a fresh real directory with ``os`` calls.  After each operation the
outcomes must agree (success, or the same errno, and the same bytes for reads and xattr
reads); at ``check`` operations and at the end the two trees must agree: paths, types,
permission bits, owners, link counts, sizes, contents, symlink targets, user xattrs, and which
paths are hard links of one another.  At the end, with every handle closed, the store must
hold exactly the reachable inodes (files unlinked while open are freed at their release).

Operations: open/create with O_CREAT/O_EXCL/O_TRUNC/O_APPEND and the three access modes,
writes/reads/ftruncate through handles kept open across the other operations (so writes reach
files after they were unlinked, renamed over or exchanged), truncate, mkdir, rmdir, unlink,
rename with RENAME_NOREPLACE and RENAME_EXCHANGE (renameat2 via ctypes), link, symlink,
set/get/removexattr with XATTR_CREATE/REPLACE, chmod, chown, access.  Each is generated from
the state the previous ones left (paths that exist, children of existing directories, a few
fresh ones), over three names (one sorting between file "a" and directory "a/") nested up to three
deep, so collisions and errors are common.

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
import ctypes
import errno
import os
import random
import stat
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.internal.conjecture import engine as hypothesis_engine
from nsplacement import close_namespace, open_namespace

from tierd.acl import Identity
from tierd.meta import MetaStore
from tierd.namespace import (
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    ROOT_INO,
    XATTR_CREATE,
    XATTR_REPLACE,
    Namespace,
)

T = TypeVar("T")

BUCKET = "bkt"
# The namespace's POSIX calls take the mode as the kernel passes it to a FUSE file system,
# after the kernel applied the process umask; the driver does the same with this umask.
UMASK = 0o022
NAMES = ("a", "b", "a-c")  # "a-c" sorts before directory "a/" but after file "a"
DEPTHS = (1, 1, 1, 1, 2, 3)
MAX_HANDLES = 4

# Who performs an operation.  As root the real side switches its effective uid, gid and
# groups for each call (seteuid), and the namespace gets the same Identity: the differential
# then covers permission checks, sticky directories and ownership rules too.  bob is in
# alice's group as a supplementary group.  Run as anyone else, every call is "me".
SWITCH_USERS = os.geteuid() == 0
USERS: dict[str, tuple[int, int, tuple[int, ...]]] = (
    {"root": (0, 0, ()), "alice": (1000, 1000, ()), "bob": (1001, 1001, (1000,))}
    if SWITCH_USERS
    else {"me": (os.geteuid(), os.getegid(), tuple(os.getgroups()))}
)
WHO: tuple[str, ...] = ("root", "alice", "bob", "alice", "root") if SWITCH_USERS else ("me",)

# open flag sets by label (the label keeps a printed sequence readable); the common case,
# creation, comes first so shrinking simplifies towards it
FLAGS: dict[str, int] = {
    "RDWR|CREAT": os.O_RDWR | os.O_CREAT,
    "WRONLY|CREAT|TRUNC": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "RDWR|CREAT|EXCL": os.O_RDWR | os.O_CREAT | os.O_EXCL,
    "WRONLY|CREAT|APPEND": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "RDONLY|CREAT": os.O_RDONLY | os.O_CREAT,
    "RDONLY": os.O_RDONLY,
    "WRONLY": os.O_WRONLY,
    "RDWR": os.O_RDWR,
    "RDWR|TRUNC": os.O_RDWR | os.O_TRUNC,
    "RDWR|APPEND": os.O_RDWR | os.O_APPEND,
}
FILE_MODES = (0o644, 0o600, 0o755, 0o666, 0o640, 0o000, 0o4755, 0o2755)
DIR_MODES = (0o755, 0o777, 0o700, 0o1777, 0o2777, 0o775, 0o711)
CHMOD_MODES = (0o755, 0o644, 0o000, 0o700, 0o1777, 0o2775, 0o777, 0o111, 0o4755, 0o640, 0o3777)
CHOWN_IDS = (-1, 1000, 1001, 0)
if not SWITCH_USERS:  # the tree walk of an ordinary user must be able to read everything
    FILE_MODES = tuple(m for m in FILE_MODES if m & 0o600 == 0o600)
    DIR_MODES = tuple(m for m in DIR_MODES if m & 0o700 == 0o700)
    CHMOD_MODES = tuple(m for m in CHMOD_MODES if m & 0o700 == 0o700)
SYMLINK_TARGETS = ("a", "zz", "b/a", "../a", "a-c/../b", "", "a/b/a-c", "b", "a-c/a")
XATTR_NAMES = ("user.a", "user.b")
XATTR_VALUES = (b"v", b"", b"value-2")
XATTR_FLAGS = (0, XATTR_CREATE, XATTR_REPLACE)
ACCESS_MASKS = (os.R_OK, os.W_OK, os.X_OK, os.R_OK | os.W_OK | os.X_OK, os.F_OK)
RENAME_FLAGS = (0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE)
DATA_LETTERS = b"xyzw"

# operation kinds, repeated by weight; creation first so shrinking simplifies towards it
KINDS: tuple[str, ...] = (
    ("open",) * 7
    + ("mkdir",) * 5
    + ("write",) * 5
    + ("rename",) * 5
    + ("unlink",) * 3
    + ("read",) * 3
    + ("rmdir",) * 2
    + ("close",) * 2
    + ("truncate",) * 2
    + ("link",) * 3
    + ("symlink",)
    + ("setxattr",) * 3
    + ("chmod",) * 2
    + ("ftruncate",)
    + ("removexattr",) * 2
    + ("getxattr",) * 2
    + ("chown",)
    + ("access",)
    + ("check",)
)
# operations on an open handle (the others name paths and end with who performs them)
HANDLE_KINDS = ("write", "read", "close", "ftruncate")

assert os.XATTR_CREATE == XATTR_CREATE and os.XATTR_REPLACE == XATTR_REPLACE


# -- generation ------------------------------------------------------------------------------
class Picker(Protocol):
    def choice(self, options: Sequence[T]) -> T: ...
    def integer(self, lo: int, hi: int) -> int: ...


class DrawPicker:
    """Choices drawn by hypothesis (so they shrink)."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self.draw = draw

    def choice(self, options: Sequence[T]) -> T:
        value: T = self.draw(st.sampled_from(options))
        return value

    def integer(self, lo: int, hi: int) -> int:
        value: int = self.draw(st.integers(lo, hi))
        return value


class RandomPicker:
    """Choices from a seeded generator (for the deterministic coverage run)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def choice(self, options: Sequence[T]) -> T:
        return self.rng.choice(options)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


@dataclass
class Known:
    """The entries that exist (read from the real tree before each operation), so that most
    operations act on existing entries or create children of existing directories."""

    paths: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()  # directories that may get children (depth < 3)
    xattrs: tuple[str, ...] = ()  # entries that have user.* attributes


class PathSpec:
    """Which path an operation names, decided when it runs: an existing entry, a new child of
    an existing directory, an entry with xattrs, or a fixed path (so a sequence is generated,
    and shrunk, as a plain list, yet acts on what the operations before it made)."""

    __slots__ = ("fresh", "how", "index", "name")

    def __init__(self, how: str, index: int, name: str, fresh: str) -> None:
        self.how = how  # "known", "child", "xattr" or "fresh"
        self.index = index
        self.name = name
        self.fresh = fresh

    def resolve(self, known: Known) -> str:
        pool = {"known": known.paths, "child": known.dirs, "xattr": known.xattrs}.get(self.how)
        if not pool:
            return self.fresh
        base = pool[self.index % len(pool)]
        return f"{base}/{self.name}" if self.how == "child" else base

    def __repr__(self) -> str:
        if self.how == "fresh":
            return f"<{self.fresh}>"
        return f"<{self.how}#{self.index}{'/' + self.name if self.how == 'child' else ''}>"


def gen_path(p: Picker, new: bool = False, how: str | None = None) -> PathSpec:
    """Mostly existing paths; for an operation that creates one (``new``), mostly new
    children of existing directories; sometimes a fixed path, which may not exist."""
    if how is None:
        options = (
            ("child", "known", "fresh", "child") if new else ("known", "known", "child", "fresh")
        )
        how = p.choice(options)
    fresh = "/".join(p.choice(NAMES) for _ in range(p.choice(DEPTHS)))
    return PathSpec(how, p.integer(0, 15), p.choice(NAMES), fresh)


def resolve(op: tuple[Any, ...], known: Known) -> tuple[Any, ...]:
    return tuple(a.resolve(known) if isinstance(a, PathSpec) else a for a in op)


def gen_data(p: Picker) -> bytes:
    return bytes([p.choice(DATA_LETTERS)]) * p.integer(0, 12)


def gen_op(p: Picker) -> tuple[Any, ...]:
    """One operation as a plain tuple; its paths are resolved when it runs (:func:`resolve`)."""
    kind = p.choice(KINDS)
    h = MAX_HANDLES - 1
    if kind == "write":
        return (kind, p.integer(0, h), p.integer(0, 20), gen_data(p))
    if kind == "read":
        return (kind, p.integer(0, h), p.integer(0, 20), p.integer(0, 40))
    if kind == "close":
        return (kind, p.integer(0, h))
    if kind == "ftruncate":
        return (kind, p.integer(0, h), p.integer(0, 30))
    if kind == "check":
        return (kind,)
    args: tuple[Any, ...]
    if kind == "open":
        label = p.choice(list(FLAGS))
        args = (gen_path(p, bool(FLAGS[label] & os.O_CREAT)), label, p.choice(FILE_MODES))
    elif kind == "truncate":
        args = (gen_path(p), p.integer(0, 30))
    elif kind == "mkdir":
        args = (gen_path(p, True), p.choice(DIR_MODES))
    elif kind in ("rmdir", "unlink"):
        args = (gen_path(p),)
    elif kind == "rename":
        args = (gen_path(p), gen_path(p, True), p.choice(RENAME_FLAGS))
    elif kind == "link":
        args = (gen_path(p), gen_path(p, True))
    elif kind == "symlink":
        args = (p.choice(SYMLINK_TARGETS), gen_path(p, True))
    elif kind == "setxattr":
        path = gen_path(p)
        args = (path, p.choice(XATTR_NAMES), p.choice(XATTR_VALUES), p.choice(XATTR_FLAGS))
    elif kind in ("removexattr", "getxattr"):
        path = gen_path(p, how=p.choice(("xattr", "xattr", "known")))
        args = (path, p.choice(XATTR_NAMES))
    elif kind == "chmod":
        args = (gen_path(p), p.choice(CHMOD_MODES))
    elif kind == "chown":
        uid, gid = p.choice(CHOWN_IDS), p.choice(CHOWN_IDS)
        if uid == gid == -1:  # chown(-1, -1) has quirks of its own; ask for a change
            gid = 1000
        args = (gen_path(p), uid, gid)
    else:
        assert kind == "access", kind
        args = (gen_path(p), p.choice(ACCESS_MASKS))
    return (kind, *args, p.choice(WHO))


@st.composite
def op_strategy(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[Any, ...]:
    return gen_op(DrawPicker(draw))


# -- the real side ---------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = _libc.renameat2  # glibc >= 2.28
_renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_renameat2.restype = ctypes.c_int
AT_FDCWD = -100
ROOT_GROUPS = os.getgroups()


def renameat2(old: str, new: str, flags: int) -> None:
    if _renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), old)


def sysctl(name: str) -> int:
    try:
        with open(f"/proc/sys/fs/{name}") as f:
            return int(f.read())
    except OSError:
        return 0


# Linux hardening sysctls change answers for non-root callers in ways that are policy, not
# file-system semantics; the driver skips the few operations they could affect.
PROTECTED_HARDLINKS = sysctl("protected_hardlinks")
PROTECTED_SYMLINKS = sysctl("protected_symlinks")
PROTECTED_REGULAR = sysctl("protected_regular")


@contextmanager
def as_user(who: str) -> Iterator[None]:
    """Run the enclosed real-side call with ``who``'s effective credentials."""
    if not SWITCH_USERS or who == "root":
        yield
        return
    uid, gid, groups = USERS[who]
    os.setgroups(list(groups))
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(ROOT_GROUPS)


def identity(who: str) -> Identity:
    uid, gid, groups = USERS[who]
    return Identity.ROOT if uid == 0 else Identity(uid, gid, frozenset(groups))


class VfsError(OSError):
    """An answer the kernel's path walk or open(2) gives before a file system is asked."""


# Outcome: ("ok", value) or ("err", errno name); "skip" when an operation does not apply
Outcome = tuple[str, Any]
SKIP: Outcome = ("skip", None)


@dataclass
class Handle:
    fd: int
    fh: int
    ino: int
    writable: bool
    label: str
    who: str  # the opener: a write clears set-user-ID bits unless the opener is root


@dataclass
class Stats:
    outcomes: Counter[str] = field(default_factory=Counter)

    def record(self, op: tuple[Any, ...], outcome: Outcome) -> None:
        kind = op[0] if op[0] != "rename" else f"rename/{op[3]}"
        self.outcomes[f"{kind} {outcome[0] if outcome[0] != 'err' else outcome[1]}"] += 1
        if outcome[0] == "err":
            self.outcomes[f"errno {outcome[1]}"] += 1


def is_writable(flags: int) -> bool:
    return flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)


class Differ:
    """Applies operations to both sides and compares outcomes and trees."""

    def __init__(self, ns: Namespace, store: MetaStore, real: Path) -> None:
        self.ns = ns
        self.store = store
        self.real = str(real)
        self.ident = Identity.ROOT if SWITCH_USERS else identity("me")  # for inspection
        self.handles: list[Handle] = []
        self.log: list[str] = []

    # -- plumbing --------------------------------------------------------------------------
    @staticmethod
    def _err(exc: OSError) -> Outcome:
        return ("err", errno.errorcode.get(exc.errno or 0, str(exc.errno)))

    def rp(self, path: str) -> str:
        return os.path.join(self.real, path)

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

    def known(self) -> Known:
        paths, dirs, xattrs = [], [], []
        for dirpath, dirnames, filenames in os.walk(self.real):
            rel = os.path.relpath(dirpath, self.real)
            for name in sorted(dirnames + filenames):
                path = name if rel == "." else f"{rel}/{name}"
                paths.append(path)
                if name in dirnames and path.count("/") < 2:
                    dirs.append(path)
                if os.listxattr(self.rp(path), follow_symlinks=False):
                    xattrs.append(path)
        return Known(tuple(paths), tuple(dirs), tuple(xattrs))

    def lstat(self, path: str, follow: bool = False) -> os.stat_result | None:
        try:
            return os.stat(self.rp(path), follow_symlinks=follow)
        except OSError:
            return None

    def hardened(self, op: tuple[Any, ...]) -> bool:
        """True when a hardening sysctl could decide this non-root call (the op is skipped)."""
        who = op[-1]
        if op[0] in HANDLE_KINDS or USERS[who][0] == 0:
            return False
        uid = USERS[who][0]
        if op[0] == "link" and PROTECTED_HARDLINKS:
            src = self.lstat(op[1])
            if src is not None and src.st_uid != uid:
                return True
        if op[0] == "open" and PROTECTED_REGULAR and FLAGS[op[2]] & os.O_CREAT:
            target = self.lstat(op[1])
            parent = self.lstat(os.path.dirname(op[1]) or ".", follow=True)
            writable = stat.S_IWOTH | (stat.S_IWGRP if PROTECTED_REGULAR >= 2 else 0)
            if (
                target is not None
                and parent is not None
                and parent.st_mode & stat.S_ISVTX
                and parent.st_mode & writable
                and target.st_uid not in (uid, parent.st_uid)
            ):
                return True
        if PROTECTED_SYMLINKS:  # any symlink a walk could follow in a sticky o+w directory
            for dirpath, dirs, files in os.walk(self.real):
                dmode = os.lstat(dirpath)
                if dmode.st_mode & stat.S_ISVTX and dmode.st_mode & stat.S_IWOTH:
                    for name in dirs + files:
                        ls = os.lstat(os.path.join(dirpath, name))
                        if stat.S_ISLNK(ls.st_mode) and ls.st_uid not in (uid, dmode.st_uid):
                            return True
        return False

    # -- one step --------------------------------------------------------------------------
    async def step(self, i: int, op: tuple[Any, ...], stats: Stats | None) -> None:
        kind = op[0]
        if kind == "check":
            self.log.append(f"{i:3}: {op!r}")
            await self.compare_trees(f"after op {i}")
            return
        if self.hardened(op):
            real = nsr = ("skip", "hardening sysctl")
        elif kind == "open":
            real, nsr = await self.do_open(op)
        elif kind == "close":
            real, nsr = await self.do_close(op)
        else:
            h = self.handle(op[1]) if kind in HANDLE_KINDS else None
            with as_user(
                h.who if h is not None else op[-1] if kind not in HANDLE_KINDS else "root"
            ):
                real = self.real_op(op)
            try:
                nsr = ("ok", await self.ns_op(op)) if real != SKIP else SKIP
            except OSError as exc:
                nsr = self._err(exc)
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
        fd = None
        try:
            with as_user(who):
                fd = os.open(self.rp(path), flags | os.O_NOFOLLOW, mode)
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            real: Outcome = ("ok", "dir" if is_dir else "file")
            if is_dir:
                os.close(fd)
                fd = None
        except OSError as exc:
            real = self._err(exc)
        fh = ino = None
        try:
            nsr, fh, ino = await self.ns_open(identity(who), path, flags, mode)
        except OSError as exc:
            nsr = self._err(exc)
        if fd is not None and fh is not None:
            if len(self.handles) >= MAX_HANDLES:
                await self.close_handle(self.handles[0])
            self.handles.append(Handle(fd, fh, ino or 0, is_writable(flags), label, who))
        else:  # a mismatch: do not leak what one side opened
            if fd is not None:
                os.close(fd)
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
        h = self.handle(op[1])
        if h is None:
            return SKIP, SKIP
        return await self.close_handle(h)

    async def close_handle(self, h: Handle) -> tuple[Outcome, Outcome]:
        self.handles.remove(h)
        try:
            os.close(h.fd)
            real: Outcome = ("ok", None)
        except OSError as exc:
            real = self._err(exc)
        try:
            await self.ns.flush(h.fh)
            await self.ns.release(h.fh)
            nsr: Outcome = ("ok", None)
        except OSError as exc:
            nsr = self._err(exc)
        return real, nsr

    async def close_all(self) -> None:
        for h in list(self.handles):
            real, nsr = await self.close_handle(h)
            assert real == nsr, f"closing {h}: real {real}, ns {nsr}"

    # -- everything else -------------------------------------------------------------------
    def real_op(self, op: tuple[Any, ...]) -> Outcome:
        kind = op[0]
        try:
            if kind in ("write", "read", "ftruncate"):
                h = self.handle(op[1])
                if h is None or (kind == "ftruncate" and not h.writable):
                    return SKIP
                if kind == "write":
                    return ("ok", os.pwrite(h.fd, op[3], op[2]))
                if kind == "read":
                    return ("ok", os.pread(h.fd, op[3], op[2]))
                os.ftruncate(h.fd, op[2])
            elif kind == "truncate":
                os.truncate(self.rp(op[1]), op[2])
            elif kind == "mkdir":
                os.mkdir(self.rp(op[1]), op[2])
            elif kind == "rmdir":
                os.rmdir(self.rp(op[1]))
            elif kind == "unlink":
                os.unlink(self.rp(op[1]))
            elif kind == "rename":
                if op[3] == 0:
                    os.rename(self.rp(op[1]), self.rp(op[2]))
                else:
                    renameat2(self.rp(op[1]), self.rp(op[2]), op[3])
            elif kind == "link":
                os.link(self.rp(op[1]), self.rp(op[2]), follow_symlinks=False)
            elif kind == "symlink":
                os.symlink(op[1], self.rp(op[2]))
            elif kind == "setxattr":
                os.setxattr(self.rp(op[1]), op[2], op[3], op[4], follow_symlinks=False)
            elif kind == "removexattr":
                os.removexattr(self.rp(op[1]), op[2], follow_symlinks=False)
            elif kind == "getxattr":
                return ("ok", os.getxattr(self.rp(op[1]), op[2], follow_symlinks=False))
            elif kind == "chmod":
                os.chmod(self.rp(op[1]), op[2])
            elif kind == "chown":
                os.chown(self.rp(op[1]), op[2], op[3])
            elif kind == "access":
                os.stat(self.rp(op[1]))  # the errno of the walk; os.access only says no
                if not os.access(self.rp(op[1]), op[2], effective_ids=True):
                    return ("err", "EACCES")
            else:
                raise AssertionError(f"unknown op {op!r}")
        except OSError as exc:
            return self._err(exc)
        return ("ok", None)

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
        elif kind == "chown":
            uid = None if op[2] == -1 else op[2]
            gid = None if op[3] == -1 else op[3]
            await ns.setattr(ident, await self.resolve(ident, op[1], True), uid=uid, gid=gid)
        elif kind == "access":
            await ns.access(ident, await self.resolve(ident, op[1], True), op[2])
        else:
            raise AssertionError(f"unknown op {op!r}")
        return None

    # -- trees -----------------------------------------------------------------------------
    def real_tree(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}

        def entry(p: str) -> dict[str, Any]:
            s = os.lstat(p)
            e: dict[str, Any] = {
                "type": stat.S_IFMT(s.st_mode),
                "perm": oct(stat.S_IMODE(s.st_mode)),
                "nlink": s.st_nlink,
                "uid": s.st_uid,
                "gid": s.st_gid,
                "ino": s.st_ino,
            }
            if stat.S_ISREG(s.st_mode):
                e["size"] = s.st_size
                with open(p, "rb") as f:
                    e["data"] = f.read()
            elif stat.S_ISLNK(s.st_mode):
                e["size"] = s.st_size
                e["target"] = os.readlink(os.fsencode(p))
            e["xattrs"] = {
                n.encode(): os.getxattr(p, n, follow_symlinks=False)
                for n in os.listxattr(p, follow_symlinks=False)
                if n.startswith("user.")
            }
            return e

        def walk(d: str, rel: str) -> None:
            for name in os.listdir(d):
                p = os.path.join(d, name)
                r = f"{rel}/{name}" if rel else name
                out[r] = entry(p)
                if stat.S_ISDIR(out[r]["type"]):
                    walk(p, r)

        out[""] = entry(self.real)
        walk(self.real, "")
        return out

    async def ns_tree(self) -> dict[str, dict[str, Any]]:
        ns, ident = self.ns, self.ident
        out: dict[str, dict[str, Any]] = {}

        async def entry(ino: int) -> dict[str, Any]:
            a = await ns.getattr(ident, ino)
            e: dict[str, Any] = {
                "type": stat.S_IFMT(a.mode),
                "perm": oct(stat.S_IMODE(a.mode)),
                "nlink": a.nlink,
                "uid": a.uid,
                "gid": a.gid,
                "ino": a.ino,
            }
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
        real = self.real_tree()
        mine = await self.ns_tree()
        ns_inos = {e["ino"] for e in mine.values()}

        def links(tree: dict[str, dict[str, Any]]) -> set[frozenset[str]]:
            groups: dict[int, set[str]] = {}
            for path, e in tree.items():
                groups.setdefault(e.pop("ino"), set()).add(path)
            return {frozenset(g) for g in groups.values()}

        real_links, ns_links = links(real), links(mine)
        problems = []
        for path in sorted(set(real) | set(mine)):
            if path not in mine:
                problems.append(f"  {path!r}: missing from the namespace ({real[path]})")
            elif path not in real:
                problems.append(f"  {path!r}: only in the namespace ({mine[path]})")
            else:
                for key in real[path]:
                    if real[path][key] != mine[path].get(key):
                        problems.append(
                            f"  {path!r} {key}: real {real[path][key]!r}, "
                            f"ns {mine[path].get(key)!r}"
                        )
        if real_links != ns_links:
            problems.append(f"  hard links: real {real_links}, ns {ns_links}")
        assert not problems, (
            f"trees differ {when}:\n" + "\n".join(problems) + "\nops:\n" + "\n".join(self.log)
        )
        return ns_inos

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
    """Apply ``ops`` to both sides, each with its paths resolved against the state the
    previous ones left."""
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
        for i, op in enumerate(ops):
            await differ.step(i, resolve(op, differ.known()), stats)
        await differ.compare_trees("at the end")
        await differ.close_all()
        inos = await differ.compare_trees("after closing every handle")
        await differ.check_no_leaks(len(inos))
    finally:
        for h in differ.handles:
            os.close(h.fd)
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


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.integers(1, 60).flatmap(lambda n: st.lists(op_strategy(), min_size=n, max_size=n)))
def test_namespace_matches_the_kernel(ops: list[tuple[Any, ...]]) -> None:
    """A failure shows the generated list (paths as <how#index>) and, in the assertion
    message, each operation as it ran, with both sides' outcomes."""
    run_sequence(ops)


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
    "access ok",
}


def random_ops(seed: int, n: int = 40) -> list[tuple[Any, ...]]:
    picker = RandomPicker(seed)
    return [gen_op(picker) for _ in range(n)]


def test_differential_covers_error_paths() -> None:
    """A deterministic run of the same generator: every listed errno and every operation's
    success path occurs (and both sides agree on all of them)."""
    stats = Stats()
    for seed in range(100):
        run_sequence(random_ops(seed), stats)
    seen = {k.split()[1] for k in stats.outcomes if k.startswith("errno ")}
    missing = EXPECTED_ERRNOS - seen
    assert not missing, f"errnos never provoked: {missing}; seen {dict(stats.outcomes)}"
    missing_ok = EXPECTED_SUCCESSES - set(stats.outcomes)
    assert not missing_ok, f"never succeeded: {missing_ok}; seen {dict(stats.outcomes)}"
