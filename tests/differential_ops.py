"""One generator of random file-system operations and one ``os`` applier, shared by the two
differential tests: the namespace against the kernel's own file system
(tests/namespace/test_differential.py) and the mount against it
(tests/fuse/test_fuse_differential.py).  Both tests compare the same operations, so what one
generator learns to provoke, both check.

An operation is a plain tuple: ``(kind, *args)``, where operations on a path end with who
performs them (a key of :data:`USERS`) and operations on an open handle (:data:`HANDLE_KINDS`)
take a handle index instead (they run as the handle's opener).  Paths are :class:`PathSpec`s,
resolved against the entries that exist when the operation runs (:meth:`OsSide.known`), so a
sequence is generated, and shrunk, as a plain list yet acts on what the operations before it
made.  :data:`PRELUDE` gives every sequence a small populated tree to start from.

:class:`OsSide` applies an operation with ``os`` calls to a directory (the real file system,
or a directory in the mount) and reads its tree back (:meth:`OsSide.tree`) in the form both
tests compare (:func:`compare_trees`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import stat
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")

# The mode a test hands to open/mkdir is the one a program passes; the kernel applies the
# process umask (both tests set this one for their run).
UMASK = 0o022
NAMES = ("a", "b", "a-c")  # "a-c" sorts before directory "a/" but after file "a"
DEPTHS = (1, 1, 1, 1, 2, 3)
MAX_HANDLES = 4

# Who performs an operation.  As root the real side switches its effective uid, gid and
# groups for each call (seteuid; through a mount the kernel sends them with each request),
# so permission checks, sticky directories and ownership rules are compared too.  bob is in
# alice's group as a supplementary group.  Run as anyone else, every call is "me".
SWITCH_USERS = os.geteuid() == 0
USERS: dict[str, tuple[int, int, tuple[int, ...]]] = (
    {"root": (0, 0, ()), "alice": (1000, 1000, ()), "bob": (1001, 1001, (1000,))}
    if SWITCH_USERS
    else {"me": (os.geteuid(), os.getegid(), tuple(os.getgroups()))}
)
WHO: tuple[str, ...] = ("root", "alice", "bob", "alice", "root") if SWITCH_USERS else ("me",)
ROOT_WHO = "root" if SWITCH_USERS else "me"
ROOT_GROUPS = os.getgroups()

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
FILE_MODES: tuple[int, ...] = (0o644, 0o600, 0o755, 0o666, 0o640, 0o000, 0o4755, 0o2755)
DIR_MODES: tuple[int, ...] = (0o755, 0o777, 0o700, 0o1777, 0o2777, 0o775, 0o711, 0o2775)
CHMOD_MODES: tuple[int, ...] = (0o755, 0o644, 0o000, 0o700, 0o1777, 0o2775, 0o777, 0o111,
                                0o4755, 0o640, 0o3777)
CHOWN_IDS = (-1, 1000, 1001, 0)
if not SWITCH_USERS:  # the tree walk of an ordinary user must be able to read everything
    FILE_MODES = tuple(m for m in FILE_MODES if m & 0o600 == 0o600)
    DIR_MODES = tuple(m for m in DIR_MODES if m & 0o700 == 0o700)
    CHMOD_MODES = tuple(m for m in CHMOD_MODES if m & 0o700 == 0o700)
SYMLINK_TARGETS = ("a", "zz", "b/a", "../a", "a-c/../b", "", "a/b/a-c", "b", "a-c/a")
XATTR_NAMES = ("user.a", "user.b")
XATTR_VALUES = (b"v", b"", b"value-2")
XATTR_FLAGS = (0, os.XATTR_CREATE, os.XATTR_REPLACE)
ACCESS_MASKS = (os.R_OK, os.W_OK, os.X_OK, os.R_OK | os.W_OK | os.X_OK, os.F_OK)
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # renameat2(2) flags
RENAME_FLAGS = (0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE)
DATA_LETTERS = b"xyzw"
# explicit times of a utime (seconds): setting them needs ownership, "now" write access
UTIME_TIMES = (1_500_000_000, 1_500_000_001)

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
    + ("lchown",)
    + ("access",)
    + ("utime",)
    + ("check",)
)
# operations on an open handle (the others name paths and end with who performs them)
HANDLE_KINDS = ("write", "read", "close", "ftruncate")


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
    """Choices from a seeded generator (for deterministic coverage runs)."""

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
    an existing directory, an entry with xattrs, or a fixed path (which may not exist)."""

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
    """``op`` with its paths decided against the entries that exist now."""
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
    elif kind in ("chown", "lchown"):  # chown follows a symlink, lchown changes the link
        uid, gid = p.choice(CHOWN_IDS), p.choice(CHOWN_IDS)
        if uid == gid == -1:  # chown(-1, -1) has quirks of its own; ask for a change
            gid = 1000
        args = (gen_path(p), uid, gid)
    elif kind == "utime":  # True: "now" (UTIME_NOW), False: explicit times
        args = (gen_path(p), p.choice((True, False)))
    else:
        assert kind == "access", kind
        args = (gen_path(p), p.choice(ACCESS_MASKS))
    return (kind, *args, p.choice(WHO))


@st.composite
def op_strategy(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[Any, ...]:
    return gen_op(DrawPicker(draw))


def random_ops(seed: int, n: int = 40) -> list[tuple[Any, ...]]:
    """``n`` operations from the same generator, seeded (deterministic coverage runs)."""
    picker = RandomPicker(seed)
    return [gen_op(picker) for _ in range(n)]


# Every sequence starts from a small populated tree, so that fixed paths mostly hit existing
# entries instead of failing the path walk with ENOENT.
PRELUDE: list[tuple[Any, ...]] = [
    ("mkdir", "a", 0o777, ROOT_WHO),
    ("mkdir", "a/b", 0o755, ROOT_WHO),
    ("open", "b", "RDWR|CREAT", 0o644, ROOT_WHO),
    ("write", 0, 0, b"hello"),
    ("open", "a/a-c", "RDWR|CREAT", 0o666, ROOT_WHO),
    ("symlink", "b", "a/a", ROOT_WHO),
    ("mkdir", "a-c", 0o1777, ROOT_WHO),
]


# -- the os side -----------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = _libc.renameat2  # glibc >= 2.28
_renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_renameat2.restype = ctypes.c_int
AT_FDCWD = -100


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
# file-system semantics (:meth:`OsSide.hardened`).
PROTECTED_SYMLINKS = sysctl("protected_symlinks")
PROTECTED_REGULAR = sysctl("protected_regular")


@contextmanager
def as_user(who: str) -> Iterator[None]:
    """Run the enclosed ``os`` call with ``who``'s effective credentials."""
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


# Outcome: ("ok", value) or ("err", errno name); "skip" when an operation does not apply
Outcome = tuple[str, Any]
SKIP: Outcome = ("skip", None)


def err(exc: OSError) -> Outcome:
    return ("err", errno.errorcode.get(exc.errno or 0, str(exc.errno)))


def is_writable(flags: int) -> bool:
    return flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)


@dataclass
class OsHandle:
    fd: int
    writable: bool
    who: str  # the opener: handle operations run as the opener


@dataclass
class Stats:
    """Outcomes by operation (and errno), for the coverage checks."""

    outcomes: Counter[str] = field(default_factory=Counter)

    def record(self, op: tuple[Any, ...], outcome: Outcome) -> None:
        kind = op[0] if op[0] != "rename" else f"rename/{op[3]}"
        self.outcomes[f"{kind} {outcome[0] if outcome[0] != 'err' else outcome[1]}"] += 1
        if outcome[0] == "err":
            self.outcomes[f"errno {outcome[1]}"] += 1


class OsSide:
    """One directory driven with ``os`` calls.  Its handles are a list that another side
    mirrors by position: an ``open`` both sides answer alike adds one at the same place, and
    past :data:`MAX_HANDLES` both drop their first."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.handles: list[OsHandle] = []

    def p(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def handle(self, idx: int) -> OsHandle | None:
        return self.handles[idx % len(self.handles)] if self.handles else None

    def who(self, op: tuple[Any, ...]) -> str:
        """Who performs ``op``: its last element, or a handle's opener."""
        if op[0] in HANDLE_KINDS:
            h = self.handle(op[1])
            return h.who if h is not None else ROOT_WHO
        return str(op[-1])

    def apply(self, op: tuple[Any, ...]) -> Outcome:
        """Perform ``op`` (paths resolved) as its performer."""
        kind = op[0]
        if kind == "check":
            return ("ok", None)
        if kind == "close":
            h = self.handle(op[1])
            if h is None:
                return SKIP
            self.handles.remove(h)
            try:
                os.close(h.fd)
            except OSError as exc:
                return err(exc)
            return ("ok", None)
        with as_user(self.who(op)):
            if kind == "open":
                return self._open(op)
            try:
                return self._apply(op)
            except OSError as exc:
                return err(exc)

    def _open(self, op: tuple[Any, ...]) -> Outcome:
        _, path, label, mode, who = op
        flags = FLAGS[label]
        try:
            fd = os.open(self.p(path), flags | os.O_NOFOLLOW, mode)
        except OSError as exc:
            return err(exc)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            return ("ok", "dir")
        if len(self.handles) >= MAX_HANDLES:
            os.close(self.handles.pop(0).fd)
        self.handles.append(OsHandle(fd, is_writable(flags), who))
        return ("ok", "file")

    def _apply(self, op: tuple[Any, ...]) -> Outcome:
        kind = op[0]
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
            os.truncate(self.p(op[1]), op[2])
        elif kind == "mkdir":
            os.mkdir(self.p(op[1]), op[2])
        elif kind == "rmdir":
            os.rmdir(self.p(op[1]))
        elif kind == "unlink":
            os.unlink(self.p(op[1]))
        elif kind == "rename":
            if op[3] == 0:
                os.rename(self.p(op[1]), self.p(op[2]))
            else:
                renameat2(self.p(op[1]), self.p(op[2]), op[3])
        elif kind == "link":
            os.link(self.p(op[1]), self.p(op[2]), follow_symlinks=False)
        elif kind == "symlink":
            os.symlink(op[1], self.p(op[2]))
        elif kind == "setxattr":
            os.setxattr(self.p(op[1]), op[2], op[3], op[4], follow_symlinks=False)
        elif kind == "removexattr":
            os.removexattr(self.p(op[1]), op[2], follow_symlinks=False)
        elif kind == "getxattr":
            return ("ok", os.getxattr(self.p(op[1]), op[2], follow_symlinks=False))
        elif kind == "chmod":
            os.chmod(self.p(op[1]), op[2])
        elif kind in ("chown", "lchown"):
            os.chown(self.p(op[1]), op[2], op[3], follow_symlinks=kind == "chown")
        elif kind == "utime":
            os.utime(self.p(op[1]), None if op[2] else UTIME_TIMES)
        elif kind == "access":
            os.stat(self.p(op[1]))  # the errno of the walk; os.access only says no
            if not os.access(self.p(op[1]), op[2], effective_ids=True):
                return ("err", "EACCES")
        else:
            raise AssertionError(f"unknown op {op!r}")
        return ("ok", None)

    def close_all(self) -> None:
        for h in self.handles:
            os.close(h.fd)
        self.handles.clear()

    # -- what exists -----------------------------------------------------------------------
    def known(self) -> Known:
        paths, dirs, xattrs = [], [], []
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            for name in sorted(dirnames + filenames):
                path = name if rel == "." else f"{rel}/{name}"
                paths.append(path)
                if name in dirnames and path.count("/") < 2:
                    dirs.append(path)
                if os.listxattr(self.p(path), follow_symlinks=False):
                    xattrs.append(path)
        return Known(tuple(paths), tuple(dirs), tuple(xattrs))

    def lstat(self, path: str, follow: bool = False) -> os.stat_result | None:
        try:
            return os.stat(self.p(path), follow_symlinks=follow)
        except OSError:
            return None

    def hardened(self, op: tuple[Any, ...]) -> bool:
        """True when a hardening sysctl could decide this non-root call: a file system that
        does not apply them (the namespace on its own) skips it.  ``protected_hardlinks``
        is not among them: the namespace applies it (:func:`tierd.acl.modes.may_hardlink`),
        so its links are compared too."""
        if op[0] in HANDLE_KINDS or op[0] == "check" or USERS[op[-1]][0] == 0:
            return False
        uid = USERS[op[-1]][0]
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
            for dirpath, subdirs, files in os.walk(self.root):
                dmode = os.lstat(dirpath)
                if dmode.st_mode & stat.S_ISVTX and dmode.st_mode & stat.S_IWOTH:
                    for name in subdirs + files:
                        ls = os.lstat(os.path.join(dirpath, name))
                        if stat.S_ISLNK(ls.st_mode) and ls.st_uid not in (uid, dmode.st_uid):
                            return True
        return False

    def tree(self) -> dict[str, dict[str, Any]]:
        """Every entry by relative path ("" the root): type, permission bits, link count,
        owner, size, content or target, user xattrs, and ``ino`` (for :func:`compare_trees`'s
        hard-link groups)."""
        out: dict[str, dict[str, Any]] = {}

        def entry(p: str) -> dict[str, Any]:
            s = os.lstat(p)
            e = tree_entry(s.st_mode, s.st_nlink, s.st_uid, s.st_gid, s.st_ino)
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
            names = os.listdir(d)
            assert len(names) == len(set(names)), f"duplicate names in {d}: {names}"
            for name in names:
                p = os.path.join(d, name)
                r = f"{rel}/{name}" if rel else name
                out[r] = entry(p)
                if stat.S_ISDIR(out[r]["type"]):
                    walk(p, r)

        out[""] = entry(self.root)
        walk(self.root, "")
        return out


def tree_entry(mode: int, nlink: int, uid: int, gid: int, ino: int) -> dict[str, Any]:
    """The attributes every entry of a tree has (the rest depends on its type)."""
    return {"type": stat.S_IFMT(mode), "perm": oct(stat.S_IMODE(mode)), "nlink": nlink,
            "uid": uid, "gid": gid, "ino": ino}


def compare_trees(real: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]],
                  name: str, when: str, log: Sequence[str]) -> None:
    """Assert two trees of :meth:`OsSide.tree`'s form agree, entry by entry and in which
    paths are hard links of one another (inode numbers themselves differ)."""

    def links(tree: dict[str, dict[str, Any]]) -> set[frozenset[str]]:
        groups: dict[int, set[str]] = {}
        for path, e in tree.items():
            groups.setdefault(e["ino"], set()).add(path)
        return {frozenset(g) for g in groups.values()}

    problems = []
    for path in sorted(set(real) | set(other)):
        if path not in other:
            problems.append(f"  {path!r}: missing from the {name} ({real[path]})")
        elif path not in real:
            problems.append(f"  {path!r}: only in the {name} ({other[path]})")
        else:
            for key in real[path]:
                if key != "ino" and real[path][key] != other[path].get(key):
                    problems.append(f"  {path!r} {key}: real {real[path][key]!r}, "
                                    f"{name} {other[path].get(key)!r}")
    real_links, other_links = links(real), links(other)
    if real_links != other_links:
        problems.append(f"  hard links: real {real_links}, {name} {other_links}")
    assert not problems, (
        f"trees differ {when}:\n" + "\n".join(problems) + "\nops:\n" + "\n".join(log)
    )
