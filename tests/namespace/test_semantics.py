"""Targeted namespace semantics: open-unlinked files, rename, links, symlinks, xattrs, listing
order and pagination, S3 objects and key rules, the namespace root, persistence."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import random
import stat
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierd.namespace import (
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    ROOT_INO,
    UTIME_NOW,
    XATTR_CREATE,
    XATTR_REPLACE,
)

from .conftest import ALICE, ROOT, NsEnv, chunks

RW_CREAT = os.O_RDWR | os.O_CREAT
REG = stat.S_IFREG | 0o644


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def hot_bytes(env: NsEnv) -> int:
    """Disk space used under the hot directory (whatever its layout)."""
    return sum(p.stat().st_blocks * 512 for p in (env.base / "hot").rglob("*") if p.is_file())


def inode_count(env: NsEnv) -> int:
    count: int = env.ns.stats()["inodes"]
    return count


def lookup_ino(env: NsEnv, parent: int, name: bytes) -> int:
    ino: int = env.run(env.ns.lookup(ROOT, parent, name)).ino
    return ino


# -- open files ------------------------------------------------------------------------------
def test_unlinked_open_file_lives_until_release(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    inode, fh = env.run(ns.create(ROOT, b, b"f", REG, RW_CREAT))
    big = os.urandom(1 << 20)
    assert env.run(ns.write(fh, 0, big)) == len(big)
    env.run(ns.fsync(fh))
    inodes, free = inode_count(env), env.run(ns.statfs()).f_ffree
    used = hot_bytes(env)
    assert used >= len(big)

    env.run(ns.unlink(ROOT, b, b"f"))
    env.err(errno.ENOENT, ns.lookup(ROOT, b, b"f"))
    assert env.names(ROOT, b) == []
    attr = env.run(ns.getattr(ROOT, inode.ino))
    assert attr.nlink == 0 and attr.size == len(big)
    # still readable and writable through the handle
    assert env.run(ns.read(fh, 0, 16)) == big[:16]
    assert env.run(ns.write(fh, len(big), b"tail")) == 4
    assert env.run(ns.read(fh, len(big), 100)) == b"tail"
    env.run(ns.setattr(ROOT, inode.ino, size=10, fh=fh))
    assert env.run(ns.read(fh, 0, 100)) == big[:10]
    # a second handle on the unlinked inode can still be opened by number (FUSE keeps it)
    assert inode_count(env) == inodes  # still allocated
    # a deleted file cannot get a name again
    env.err(errno.ENOENT, ns.link(ROOT, inode.ino, b, b"again"))

    env.run(ns.release(fh))
    assert inode_count(env) == inodes - 1
    assert env.run(ns.statfs()).f_ffree == free + 1
    assert hot_bytes(env) <= used - len(big) + 65536
    with pytest.raises(OSError) as ei:
        env.run(ns.getattr(ROOT, inode.ino))
    assert ei.value.errno in (errno.ENOENT, errno.ESTALE)


def test_open_unlinked_file_is_freed_at_close(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    inode, fh = env.run(ns.create(ROOT, b, b"f", REG, RW_CREAT))
    env.run(ns.write(fh, 0, b"x" * 100_000))
    env.run(ns.unlink(ROOT, b, b"f"))
    base = inode_count(env)
    env.reopen()  # close releases the handle
    assert inode_count(env) == base - 1
    with pytest.raises(OSError):
        env.run(env.ns.getattr(ROOT, inode.ino))


def test_open_unlinked_file_is_freed_at_restart_after_a_crash(nsenv: NsEnv) -> None:
    """An orphan whose handle was never released (the process died) goes at the next start,
    and so do its bytes."""
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    inode, fh = env.run(ns.create(ROOT, b, b"f", REG, RW_CREAT))
    env.run(ns.write(fh, 0, os.urandom(1 << 20)))
    env.run(ns.fsync(fh))
    env.write_file(ROOT, b, b"kept", b"still here")
    env.run(ns.unlink(ROOT, b, b"f"))
    base = inode_count(env)
    env.crash_reopen()
    assert inode_count(env) == base - 1
    with pytest.raises(OSError):
        env.run(env.ns.getattr(ROOT, inode.ino))
    assert hot_bytes(env) < 1 << 20
    assert env.get(ROOT, "bkt", "kept") == b"still here"


def test_writes_at_offsets_holes_and_append(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    inode, fh = env.run(ns.create(ROOT, b, b"f", REG, RW_CREAT))
    env.run(ns.write(fh, 5, b"world"))
    assert env.run(ns.getattr(ROOT, inode.ino)).size == 10  # live size before any flush
    assert env.run(ns.read(fh, 0, 100)) == b"\0" * 5 + b"world"
    env.run(ns.write(fh, 0, b"hello"))
    app = env.run(ns.open(ROOT, inode.ino, os.O_WRONLY | os.O_APPEND))
    assert env.run(ns.write(app, 0, b"!")) == 1  # O_APPEND: the offset is ignored
    env.run(ns.write(fh, 20, b"x"))
    env.run(ns.write(app, 3, b"?"))  # appended after the other handle's write
    assert env.read_file(ROOT, inode.ino) == b"helloworld!" + b"\0" * 9 + b"x?"
    env.run(ns.setattr(ROOT, inode.ino, size=4))
    assert env.read_file(ROOT, inode.ino) == b"hell"
    env.run(ns.setattr(ROOT, inode.ino, size=8))  # extending reads as zeros
    assert env.read_file(ROOT, inode.ino) == b"hell\0\0\0\0"
    assert env.run(ns.read(fh, 100, 10)) == b""
    env.run(ns.release(app))
    env.run(ns.release(fh))
    env.err(errno.EBADF, ns.read(fh, 0, 1))
    env.err(errno.EBADF, ns.release(fh))


def test_size_and_times_are_live_and_committed_at_release(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    inode, fh = env.run(ns.create(ROOT, b, b"f", REG, RW_CREAT))
    before = env.run(ns.getattr(ROOT, b))
    env.run(ns.write(fh, 0, b"abc"))
    a1 = env.run(ns.getattr(ROOT, inode.ino))
    assert a1.size == 3 and a1.mtime_ns >= inode.mtime_ns
    env.run(ns.release(fh))
    a2 = env.run(ns.getattr(ROOT, inode.ino))
    assert a2.size == 3 and a2.mtime_ns == a1.mtime_ns
    assert env.run(ns.getattr(ROOT, b)).mtime_ns >= before.mtime_ns
    t = 1_500_000_000_123_456_789
    a3 = env.run(ns.setattr(ROOT, inode.ino, atime_ns=t, mtime_ns=t))
    assert (a3.atime_ns, a3.mtime_ns) == (t, t) and a3.ctime_ns > t
    a4 = env.run(ns.setattr(ROOT, inode.ino, mtime_ns=UTIME_NOW))
    assert a4.mtime_ns > t and a4.atime_ns == t
    a5 = env.run(ns.setattr(ROOT, inode.ino, mode=0o600))
    assert a5.ctime_ns >= a4.ctime_ns and a5.mtime_ns == a4.mtime_ns


def test_create_flags(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    ino = env.write_file(ROOT, b, b"f", b"content")
    env.err(errno.EEXIST, ns.create(ROOT, b, b"f", REG, RW_CREAT | os.O_EXCL))
    inode, fh = env.run(ns.create(ROOT, b, b"f", REG, RW_CREAT))  # opens the existing file
    assert inode.ino == ino and env.run(ns.read(fh, 0, 100)) == b"content"
    env.run(ns.release(fh))
    inode, fh = env.run(ns.create(ROOT, b, b"f", REG, RW_CREAT | os.O_TRUNC))
    assert inode.ino == ino and env.run(ns.getattr(ROOT, ino)).size == 0
    env.run(ns.release(fh))
    env.run(ns.mkdir(ROOT, b, b"d", 0o755))
    env.err(errno.EISDIR, ns.create(ROOT, b, b"d", REG, RW_CREAT))
    env.err(errno.EEXIST, ns.create(ROOT, b, b"d", REG, RW_CREAT | os.O_EXCL))
    env.err(errno.EISDIR, ns.open(ROOT, lookup_ino(env, b, b"d"), os.O_WRONLY))
    env.err(errno.ENOTDIR, ns.create(ROOT, ino, b"x", REG, RW_CREAT))
    env.err(errno.ENAMETOOLONG, ns.create(ROOT, b, b"n" * 256, REG, RW_CREAT))
    inode, fh = env.run(ns.create(ROOT, b, b"n" * 255, REG, RW_CREAT))
    env.run(ns.release(fh))


def test_create_on_an_existing_directory_is_eisdir_before_permissions(nsenv: NsEnv) -> None:
    """open(O_CREAT) of an existing directory fails with EISDIR whatever the caller's
    permissions on it (Linux checks the type before may_open)."""
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    env.run(ns.mkdir(ROOT, b, b"d", 0o700))
    env.err(errno.EISDIR, ns.create(ALICE, b, b"d", REG, os.O_RDONLY | os.O_CREAT))
    env.err(errno.EISDIR, ns.create(ALICE, b, b"d", REG, os.O_WRONLY | os.O_CREAT))


def test_mknod(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    fifo = env.run(ns.mknod(ROOT, b, b"fifo", stat.S_IFIFO | 0o640))
    assert stat.S_ISFIFO(fifo.mode) and stat.S_IMODE(fifo.mode) == 0o640
    reg = env.run(ns.mknod(ROOT, b, b"reg", stat.S_IFREG | 0o600))
    assert reg.is_reg and reg.size == 0
    assert env.read_file(ROOT, reg.ino) == b""
    env.err(errno.EEXIST, ns.mknod(ROOT, b, b"reg", stat.S_IFREG | 0o600))
    assert stat.S_ISFIFO(env.run(ns.lookup(ROOT, b, b"fifo")).mode)
    env.run(ns.unlink(ROOT, b, b"fifo"))


# -- directories ---------------------------------------------------------------------------
def test_directory_link_counts_and_dot_entries(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    assert env.run(ns.getattr(ROOT, b)).nlink == 2
    d = env.run(ns.mkdir(ROOT, b, b"d", 0o755)).ino
    env.run(ns.mkdir(ROOT, b, b"e", 0o755))
    env.write_file(ROOT, b, b"f", b"")
    env.run(ns.symlink(ROOT, b, b"s", b"d"))
    assert env.run(ns.getattr(ROOT, b)).nlink == 4  # files and symlinks don't count
    assert env.run(ns.getattr(ROOT, d)).nlink == 2
    assert env.run(ns.lookup(ROOT, d, b".")).ino == d
    assert env.run(ns.lookup(ROOT, d, b"..")).ino == b
    assert env.run(ns.lookup(ROOT, b, b"..")).ino == ROOT_INO
    assert env.run(ns.lookup(ROOT, ROOT_INO, b"..")).ino == ROOT_INO
    env.run(ns.rmdir(ROOT, b, b"e"))
    assert env.run(ns.getattr(ROOT, b)).nlink == 3
    env.err(errno.ENOTDIR, ns.rmdir(ROOT, b, b"f"))
    env.err(errno.EISDIR, ns.unlink(ROOT, b, b"d"))
    env.err(errno.ENOENT, ns.rmdir(ROOT, b, b"nope"))
    env.write_file(ROOT, d, b"inner", b"")
    env.err(errno.ENOTEMPTY, ns.rmdir(ROOT, b, b"d"))
    env.err(errno.EINVAL, ns.rmdir(ROOT, d, b"."))
    env.err(errno.EEXIST, ns.mkdir(ROOT, b, b"d", 0o755))
    env.err(errno.EEXIST, ns.mkdir(ROOT, b, b"s", 0o755))  # even a symlink's name
    env.err(errno.ENOTDIR, ns.mkdir(ROOT, lookup_ino(env, b, b"f"), b"x", 0o755))


# -- rename --------------------------------------------------------------------------------
def test_rename_replaces_an_open_target_atomically(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    new = env.write_file(ROOT, b, b"new", b"new content")
    old = env.write_file(ROOT, b, b"cur", b"old content")
    inodes = inode_count(env)
    fh = env.run(ns.open(ROOT, old, os.O_RDONLY))
    env.run(ns.rename(ROOT, b, b"new", b, b"cur"))
    assert lookup_ino(env, b, b"cur") == new
    assert env.names(ROOT, b) == [b"cur"]
    assert env.read_file(ROOT, new) == b"new content"
    assert env.run(ns.read(fh, 0, 100)) == b"old content"  # the handle keeps the old file
    assert env.run(ns.getattr(ROOT, old)).nlink == 0
    env.run(ns.release(fh))
    assert inode_count(env) == inodes - 1


def test_rename_noreplace_and_flags(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    env.write_file(ROOT, b, b"a", b"A")
    env.write_file(ROOT, b, b"b", b"B")
    env.err(errno.EEXIST, ns.rename(ROOT, b, b"a", b, b"b", flags=RENAME_NOREPLACE))
    env.err(errno.EEXIST, ns.rename(ROOT, b, b"a", b, b"a", flags=RENAME_NOREPLACE))
    env.err(errno.EINVAL, ns.rename(ROOT, b, b"a", b, b"c", flags=RENAME_NOREPLACE | 2))
    env.err(errno.EINVAL, ns.rename(ROOT, b, b"a", b, b"c", flags=0x100))
    env.err(errno.ENOENT, ns.rename(ROOT, b, b"a", b, b"c", flags=RENAME_EXCHANGE))
    env.run(ns.rename(ROOT, b, b"a", b, b"c", flags=RENAME_NOREPLACE))
    assert env.names(ROOT, b) == [b"b", b"c"]
    env.run(ns.rename(ROOT, b, b"c", b, b"c"))  # onto itself: nothing happens
    env.run(ns.rename(ROOT, b, b"c", b, b"c", flags=RENAME_EXCHANGE))
    assert env.names(ROOT, b) == [b"b", b"c"]


def test_rename_exchange_file_and_directory_across_parents(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    p = env.run(ns.mkdir(ROOT, b, b"p", 0o755)).ino
    q = env.run(ns.mkdir(ROOT, b, b"q", 0o755)).ino
    d = env.run(ns.mkdir(ROOT, p, b"x", 0o755)).ino
    env.write_file(ROOT, d, b"inside", b"1")
    f = env.write_file(ROOT, q, b"y", b"file")
    assert env.run(ns.getattr(ROOT, p)).nlink == 3
    assert env.run(ns.getattr(ROOT, q)).nlink == 2
    env.run(ns.rename(ROOT, p, b"x", q, b"y", flags=RENAME_EXCHANGE))
    assert lookup_ino(env, p, b"x") == f
    assert lookup_ino(env, q, b"y") == d
    assert env.run(ns.getattr(ROOT, p)).nlink == 2
    assert env.run(ns.getattr(ROOT, q)).nlink == 3
    assert env.run(ns.lookup(ROOT, d, b"..")).ino == q
    assert env.run(ns.resolve(ROOT, "bkt/q/y/inside")).size == 1
    assert env.run(ns.getattr(ROOT, d)).is_dir  # the type goes with the inode
    assert env.names(ROOT, p) == [b"x"]
    listing = env.run(ns.listdir(ROOT, q))
    assert [(n, i.is_dir) for n, i in listing] == [(b"y", True)]


def test_rename_directories(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    a = env.run(ns.mkdir(ROOT, b, b"a", 0o755)).ino
    env.run(ns.mkdir(ROOT, b, b"empty", 0o755))
    full = env.run(ns.mkdir(ROOT, b, b"full", 0o755)).ino
    env.write_file(ROOT, full, b"x", b"")
    env.write_file(ROOT, b, b"file", b"")
    inner = env.run(ns.mkdir(ROOT, a, b"inner", 0o755)).ino
    env.write_file(ROOT, inner, b"s", b"")
    env.err(errno.ENOTEMPTY, ns.rename(ROOT, b, b"a", b, b"full"))
    env.err(errno.ENOTDIR, ns.rename(ROOT, b, b"a", b, b"file"))
    env.err(errno.EISDIR, ns.rename(ROOT, b, b"file", b, b"a"))
    env.err(errno.EINVAL, ns.rename(ROOT, b, b"a", a, b"sub"))  # into itself
    env.err(errno.EINVAL, ns.rename(ROOT, b, b"a", inner, b"sub"))  # into its subtree
    env.err(errno.EINVAL, ns.rename(ROOT, b, b"a", inner, b"s", flags=RENAME_EXCHANGE))
    env.err(errno.EINVAL, ns.rename(ROOT, a, b"inner", b, b"a", flags=RENAME_EXCHANGE))
    env.err(errno.ENOTEMPTY, ns.rename(ROOT, a, b"inner", b, b"a"))  # onto its ancestor
    nlink = env.run(ns.getattr(ROOT, b)).nlink
    env.run(ns.rename(ROOT, b, b"a", b, b"empty"))  # onto an empty directory
    assert lookup_ino(env, b, b"empty") == a
    assert env.run(ns.getattr(ROOT, b)).nlink == nlink - 1
    env.run(ns.rename(ROOT, a, b"inner", b, b"moved"))
    assert env.run(ns.lookup(ROOT, inner, b"..")).ino == b
    assert env.run(ns.getattr(ROOT, a)).nlink == 2
    assert env.run(ns.getattr(ROOT, b)).nlink == nlink
    assert env.names(ROOT, b) == [b"empty", b"file", b"full", b"moved"]


def test_rename_file_onto_its_parent_directory_is_enotempty(nsenv: NsEnv) -> None:
    """rename("a/f", "a"): the target is an ancestor of the source (Linux: ENOTEMPTY)."""
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    a = env.run(ns.mkdir(ROOT, b, b"a", 0o755)).ino
    env.write_file(ROOT, a, b"f", b"")
    env.err(errno.ENOTEMPTY, ns.rename(ROOT, a, b"f", b, b"a"))
    env.err(errno.EINVAL, ns.rename(ROOT, a, b"f", b, b"a", flags=RENAME_EXCHANGE))


def test_rename_over_a_hard_link_of_itself_changes_nothing(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    f = env.write_file(ROOT, b, b"f", b"x")
    env.run(ns.link(ROOT, f, b, b"g"))
    env.run(ns.rename(ROOT, b, b"f", b, b"g"))
    assert env.names(ROOT, b) == [b"f", b"g"]
    assert env.run(ns.getattr(ROOT, f)).nlink == 2


def test_buckets_cannot_be_renamed_or_linked_into_the_root(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    f = env.write_file(ROOT, b, b"f", b"")
    env.err(errno.EPERM, ns.rename(ROOT, b, b"f", ROOT_INO, b"f"))
    env.err(errno.EPERM, ns.link(ROOT, f, ROOT_INO, b"f"))


# -- hard links and symlinks --------------------------------------------------------------------
def test_hard_links_share_content_and_count(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    d = env.run(ns.mkdir(ROOT, b, b"d", 0o755)).ino
    f = env.write_file(ROOT, b, b"f", b"shared")
    linked = env.run(ns.link(ROOT, f, d, b"g"))
    assert linked.ino == f and linked.nlink == 2
    assert env.run(ns.getattr(ROOT, f)).nlink == 2
    fh = env.run(ns.open(ROOT, lookup_ino(env, d, b"g"), os.O_WRONLY))
    env.run(ns.write(fh, 0, b"SH"))
    env.run(ns.release(fh))
    assert env.read_file(ROOT, lookup_ino(env, b, b"f")) == b"SHared"
    assert env.get(ROOT, "bkt", "d/g") == b"SHared"  # two keys, one content
    env.run(ns.unlink(ROOT, b, b"f"))
    assert env.run(ns.getattr(ROOT, f)).nlink == 1
    assert env.read_file(ROOT, f) == b"SHared"
    env.err(errno.EPERM, ns.link(ROOT, d, b, b"dirlink"))
    env.err(errno.EEXIST, ns.link(ROOT, f, d, b"g"))
    env.err(errno.EEXIST, ns.link(ROOT, d, d, b"g"))  # EEXIST before EPERM, as Linux
    ln = env.run(ns.symlink(ROOT, b, b"ln", b"d/g"))
    assert env.run(ns.link(ROOT, ln.ino, b, b"ln2")).nlink == 2  # links to the symlink


def test_symlinks(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    d = env.run(ns.mkdir(ROOT, b, b"d", 0o755)).ino
    f = env.write_file(ROOT, d, b"f", b"target data")
    target = b"d/f"
    ln = env.run(ns.symlink(ROOT, b, b"ln", target))
    assert ln.is_lnk and stat.S_IMODE(ln.mode) == 0o777
    assert ln.size == len(target)
    assert env.run(ns.readlink(ROOT, ln.ino)) == target
    assert env.run(ns.resolve(ROOT, "bkt/ln")).ino == f
    assert env.run(ns.resolve(ROOT, "bkt/ln", follow=False)).ino == ln.ino
    env.run(ns.symlink(ROOT, d, b"up", b"../d"))
    assert env.run(ns.resolve(ROOT, "bkt/d/up/up/up/f")).ino == f
    env.run(ns.symlink(ROOT, b, b"abs", b"/bkt/d"))
    assert env.run(ns.resolve(ROOT, "bkt/abs/f")).ino == f
    env.run(ns.symlink(ROOT, b, b"loop1", b"loop2"))
    env.run(ns.symlink(ROOT, b, b"loop2", b"loop1"))
    env.err(errno.ELOOP, ns.resolve(ROOT, "bkt/loop1"))
    env.err(errno.ELOOP, ns.resolve(ROOT, "bkt/loop1/x"))
    env.run(ns.resolve(ROOT, "bkt/loop1", follow=False))
    env.run(ns.symlink(ROOT, b, b"dangling", b"nowhere"))
    env.err(errno.ENOENT, ns.resolve(ROOT, "bkt/dangling"))
    env.run(ns.symlink(ROOT, b, b"tofile", b"d/f/x"))
    env.err(errno.ENOTDIR, ns.resolve(ROOT, "bkt/tofile"))
    env.err(errno.EINVAL, ns.readlink(ROOT, f))
    env.err(errno.EEXIST, ns.symlink(ROOT, b, b"ln", b"x"))
    env.err(errno.ENOENT, ns.symlink(ROOT, b, b"empty", b""))
    env.err(errno.ENAMETOOLONG, ns.symlink(ROOT, b, b"long", b"x" * 4096))
    long_ok = env.run(ns.symlink(ROOT, b, b"long", b"x/" * 2047 + b"x"))
    assert env.run(ns.readlink(ROOT, long_ok.ino)) == b"x/" * 2047 + b"x"
    # a symlink read through S3 follows the link inside its bucket
    assert env.get(ROOT, "bkt", "ln") == b"target data"


# -- xattrs ---------------------------------------------------------------------------------
def test_xattrs(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    f = env.write_file(ROOT, b, b"f", b"")
    env.err(errno.ENODATA, ns.getxattr(ROOT, f, b"user.k"))
    env.err(errno.ENODATA, ns.setxattr(ROOT, f, b"user.k", b"v", XATTR_REPLACE))
    env.run(ns.setxattr(ROOT, f, b"user.k", b"v", XATTR_CREATE))
    env.err(errno.EEXIST, ns.setxattr(ROOT, f, b"user.k", b"w", XATTR_CREATE))
    env.run(ns.setxattr(ROOT, f, b"user.k", b"w", XATTR_REPLACE))
    assert env.run(ns.getxattr(ROOT, f, b"user.k")) == b"w"
    env.run(ns.setxattr(ROOT, f, b"user.empty", b""))
    assert env.run(ns.getxattr(ROOT, f, b"user.empty")) == b""
    assert sorted(env.run(ns.listxattr(ROOT, f))) == [b"user.empty", b"user.k"]
    env.run(ns.removexattr(ROOT, f, b"user.k"))
    env.err(errno.ENODATA, ns.removexattr(ROOT, f, b"user.k"))
    assert env.run(ns.listxattr(ROOT, f)) == [b"user.empty"]
    # names and sizes
    env.err(errno.ERANGE, ns.setxattr(ROOT, f, b"user." + b"n" * 251, b"v"))
    env.run(ns.setxattr(ROOT, f, b"user." + b"n" * 250, b"v"))  # 255 bytes
    env.err(errno.ERANGE, ns.getxattr(ROOT, f, b"user." + b"n" * 251))
    env.err(errno.E2BIG, ns.setxattr(ROOT, f, b"user.big", b"v" * (65536 + 1)))
    env.run(ns.setxattr(ROOT, f, b"user.big", b"v" * 65536))
    assert len(env.run(ns.getxattr(ROOT, f, b"user.big"))) == 65536
    env.err(errno.EOPNOTSUPP, ns.setxattr(ROOT, f, b"nonamespace", b"v"))
    env.err(errno.EINVAL, ns.setxattr(ROOT, f, b"user.", b"v"))
    env.err(errno.EINVAL, ns.setxattr(ROOT, f, b"user.k", b"v", XATTR_CREATE | XATTR_REPLACE))
    # user.* exist on files and directories only
    ln = env.run(ns.symlink(ROOT, b, b"ln", b"f")).ino
    env.err(errno.EPERM, ns.setxattr(ROOT, ln, b"user.k", b"v"))
    env.err(errno.EPERM, ns.removexattr(ROOT, ln, b"user.k"))
    env.err(errno.ENODATA, ns.getxattr(ROOT, ln, b"user.k"))
    env.run(ns.setxattr(ROOT, b, b"user.onadir", b"yes"))
    assert env.run(ns.getxattr(ROOT, b, b"user.onadir")) == b"yes"
    # xattrs belong to the inode: shared by hard links, gone with the inode
    env.run(ns.link(ROOT, f, b, b"g"))
    assert env.run(ns.getxattr(ROOT, lookup_ino(env, b, b"g"), b"user.empty")) == b""
    env.run(ns.unlink(ROOT, b, b"f"))
    env.run(ns.unlink(ROOT, b, b"g"))
    g = env.write_file(ROOT, b, b"g", b"")
    assert env.run(ns.listxattr(ROOT, g)) == []


# -- listing --------------------------------------------------------------------------------
def test_listdir_sorts_in_s3_key_order(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    one = env.run(ns.mkdir(ROOT, b, b"one", 0o755)).ino
    for name in (b"a0", b"a.txt", b"a", b"a-b"):
        env.write_file(ROOT, one, name, b"")
    assert env.names(ROOT, one) == [b"a", b"a-b", b"a.txt", b"a0"]
    two = env.run(ns.mkdir(ROOT, b, b"two", 0o755)).ino
    env.run(ns.mkdir(ROOT, two, b"a", 0o755))
    for name in (b"a0", b"a.txt", b"a-b"):
        env.write_file(ROOT, two, name, b"")
    # a directory sorts as "a/": after "a.txt" ('.' < '/'), before "a0" ('/' < '0')
    assert env.names(ROOT, two) == [b"a-b", b"a.txt", b"a", b"a0"]
    assert env.names(ROOT, two, start_after=b"a") == [b"a0"]  # "a" is the directory
    assert env.names(ROOT, two, start_after=b"a.txt") == [b"a", b"a0"]
    assert env.names(ROOT, two, start_after=b"a-b", limit=1) == [b"a.txt"]
    assert env.names(ROOT, one, start_after=b"a") == [b"a-b", b"a.txt", b"a0"]
    assert env.names(ROOT, one, start_after=b"zzz") == []
    assert env.names(ROOT, one, limit=0) == []
    env.err(errno.ENOTDIR, ns.listdir(ROOT, lookup_ino(env, one, b"a")))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    names=st.sets(
        st.tuples(
            st.sampled_from(["a", "a-b", "a.txt", "a0", "b", "a/", "ab", "a b"]), st.booleans()
        ),
        max_size=8,
    ),
    limit=st.integers(1, 4),
)
def test_listdir_pages_cover_every_entry_once(
    nsenv_factory: Any, names: set[tuple[str, bool]], limit: int
) -> None:
    env: NsEnv = nsenv_factory("memory")
    ns = env.ns
    b = env.bucket()
    made = set()
    for name, is_dir in sorted(names):
        raw = name.rstrip("/").encode()
        if raw in made:
            continue
        made.add(raw)
        if is_dir or name.endswith("/"):
            env.run(ns.mkdir(ROOT, b, raw, 0o755))
        else:
            env.write_file(ROOT, b, raw, b"")
    full = env.run(ns.listdir(ROOT, b))
    keys = [n + b"/" if i.is_dir else n for n, i in full]
    assert keys == sorted(keys) and {n for n, _ in full} == made
    pages: list[bytes] = []
    marker = b""
    for _ in range(len(full) + 2):
        page = env.names(ROOT, b, start_after=marker, limit=limit)
        assert len(page) <= limit
        if not page:
            break
        pages += page
        marker = page[-1]
    assert pages == [n for n, _ in full]


def test_listdir_pagination_while_entries_change(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    for name in (b"b", b"d", b"f"):
        env.write_file(ROOT, b, name, b"")
    env.run(ns.mkdir(ROOT, b, b"c", 0o755))
    page = env.names(ROOT, b, limit=2)
    assert page == [b"b", b"c"]
    env.run(ns.rmdir(ROOT, b, b"c"))  # the marker entry goes away
    env.write_file(ROOT, b, b"a", b"")  # sorts before the marker: not seen now
    env.write_file(ROOT, b, b"e", b"")  # after it: seen
    assert env.names(ROOT, b, start_after=b"c/") == [b"d", b"e", b"f"]
    page = env.names(ROOT, b, limit=2, start_after=b"a")
    assert page == [b"b", b"d"]
    env.run(ns.unlink(ROOT, b, b"d"))
    assert env.names(ROOT, b, start_after=b"d") == [b"e", b"f"]


# -- objects --------------------------------------------------------------------------------
def test_object_round_trip(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    env.bucket()
    body = os.urandom(300_001)
    meta = {"content-type": "application/x-test", "x-amz-meta-k": "v"}
    put = env.run(ns.put_object(ROOT, "bkt", "dir/sub/obj.bin", chunks(body, 65536), meta))
    assert put.size == len(body) and put.etag == md5(body)
    head = env.run(ns.head_object(ROOT, "bkt", "dir/sub/obj.bin"))
    assert (head.size, head.etag, head.objmeta) == (len(body), md5(body), meta)
    assert head.is_reg and stat.S_IMODE(head.mode) == 0o600  # private: 0666 & ~(umask|077)
    assert env.get(ROOT, "bkt", "dir/sub/obj.bin") == body
    assert env.get(ROOT, "bkt", "dir/sub/obj.bin", offset=1000, length=10) == body[1000:1010]
    assert env.get(ROOT, "bkt", "dir/sub/obj.bin", offset=len(body) - 5) == body[-5:]
    assert env.get(ROOT, "bkt", "dir/sub/obj.bin", offset=len(body) - 5, length=100) == body[-5:]
    assert env.get(ROOT, "bkt", "dir/sub/obj.bin", offset=len(body)) == b""
    # the same inode through the POSIX calls
    ino = env.run(ns.resolve(ROOT, "bkt/dir/sub/obj.bin")).ino
    assert ino == head.ino and env.read_file(ROOT, ino) == body
    r = env.run(ns.get_object(ROOT, "bkt", "dir/sub/obj.bin"))
    assert r.inode.ino == ino
    env.run(r.close())
    assert env.run(ns.delete_object(ROOT, "bkt", "dir/sub/obj.bin")) is True
    env.err(errno.ENOENT, ns.head_object(ROOT, "bkt", "dir/sub/obj.bin"))
    env.err(errno.ENOENT, ns.get_object(ROOT, "bkt", "dir/sub/obj.bin"))
    assert env.run(ns.delete_object(ROOT, "bkt", "dir/sub/obj.bin")) is False
    empty = env.put(ROOT, "bkt", "empty", b"")
    assert empty.size == 0 and empty.etag == md5(b"")
    assert env.get(ROOT, "bkt", "empty") == b""
    env.err(errno.ENOENT, ns.put_object(ROOT, "nobucket", "k", chunks(b"x")))
    env.err(errno.ENOENT, ns.get_object(ROOT, "nobucket", "k"))


def test_put_over_an_existing_key(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    env.bucket()
    first = env.put(ROOT, "bkt", "k", b"first version")
    r = env.run(ns.get_object(ROOT, "bkt", "k"))
    fh = env.run(ns.open(ROOT, first.ino, os.O_RDONLY))
    second = env.put(ROOT, "bkt", "k", b"second")
    assert env.get(ROOT, "bkt", "k") == b"second"
    assert env.run(ns.head_object(ROOT, "bkt", "k")).etag == md5(b"second")
    # readers that opened the first version keep reading it
    assert b"".join(env.run(_collect(r))) == b"first version"
    assert env.run(ns.read(fh, 0, 100)) == b"first version"
    env.run(r.close())
    env.run(ns.release(fh))
    assert env.read_file(ROOT, second.ino) == b"second"
    assert env.names(ROOT, env.run(ns.resolve(ROOT, "bkt")).ino) == [b"k"]


async def _collect(r: Any) -> list[bytes]:
    return [c async for c in r.iter()]


def test_etag_of_files_written_through_handles(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    inode, fh = env.run(ns.create(ROOT, b, b"seq", REG, RW_CREAT))
    env.run(ns.write(fh, 0, b"abc"))
    env.run(ns.write(fh, 3, b"def"))
    env.run(ns.flush(fh))
    assert env.run(ns.head_object(ROOT, "bkt", "seq")).etag == md5(b"abcdef")
    env.run(ns.write(fh, 1, b"X"))  # out of order
    env.run(ns.release(fh))
    assert env.run(ns.head_object(ROOT, "bkt", "seq")).etag == md5(b"aXcdef")
    env.run(ns.setattr(ROOT, inode.ino, size=2))
    assert env.run(ns.head_object(ROOT, "bkt", "seq")).etag == md5(b"aX")
    put = env.put(ROOT, "bkt", "obj", b"12345")
    fh = env.run(ns.open(ROOT, put.ino, os.O_WRONLY | os.O_APPEND))
    env.run(ns.write(fh, 0, b"678"))
    env.run(ns.release(fh))
    head = env.run(ns.head_object(ROOT, "bkt", "obj"))
    assert (head.size, head.etag) == (8, md5(b"12345678"))


def test_etag_is_current_while_writes_are_unflushed(nsenv: NsEnv) -> None:
    """HEAD and listings of a file another client is writing report the ETag of the bytes
    they report the size of (never the previous content's ETag with the new size)."""
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    _, fh = env.run(ns.create(ROOT, b, b"f", REG, RW_CREAT))
    env.run(ns.write(fh, 0, b"A"))
    head = env.run(ns.head_object(ROOT, "bkt", "f"))
    listed = env.run(ns.list_objects(ROOT, "bkt")).contents
    env.run(ns.release(fh))
    assert (head.size, head.etag) == (1, md5(b"A"))
    assert [(k, i.size, i.etag) for k, i in listed] == [("f", 1, md5(b"A"))]


WRITES = st.lists(
    st.tuples(
        st.integers(0, 2),  # handle
        st.sampled_from(["write", "truncate"]),
        st.integers(0, 70_000),  # offset or size
        st.integers(0, 70_000),  # length
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(writes=WRITES)
def test_etag_matches_content_after_any_writes(
    nsenv_factory: Any, writes: list[tuple[int, str, int, int]]
) -> None:
    """Whatever the order of writes and truncates through several handles, the ETag is the
    MD5 of the content, both while open and after release."""
    env: NsEnv = nsenv_factory("memory")
    ns = env.ns
    b = env.bucket()
    inode, fh0 = env.run(ns.create(ROOT, b, b"f", REG, RW_CREAT))
    handles = [fh0] + [env.run(ns.open(ROOT, inode.ino, os.O_RDWR)) for _ in range(2)]
    model = bytearray()
    for i, (h, kind, pos, n) in enumerate(writes):
        if kind == "write":
            data = bytes([65 + i]) * n
            env.run(ns.write(handles[h], pos, data))
            if n:
                model.extend(bytes(max(0, pos - len(model))))
                model[pos : pos + n] = data
        else:
            env.run(ns.setattr(ROOT, inode.ino, size=pos, fh=handles[h]))
            del model[pos:]
            model.extend(bytes(pos - len(model)))
    want = (len(model), md5(bytes(model)))
    live = env.run(ns.head_object(ROOT, "bkt", "f"))
    for fh in handles:
        env.run(ns.release(fh))
    head = env.run(ns.head_object(ROOT, "bkt", "f"))
    assert (head.size, head.etag) == want, "after release"
    assert env.get(ROOT, "bkt", "f") == bytes(model)
    assert (live.size, live.etag) == want, "while open, with writes not yet flushed"


BAD_KEYS = [
    ("", errno.EINVAL),
    ("/a", errno.EINVAL),
    ("a//b", errno.EINVAL),
    ("a/./b", errno.EINVAL),
    ("a/../b", errno.EINVAL),
    (".", errno.EINVAL),
    ("..", errno.EINVAL),
    ("a/..", errno.EINVAL),
    ("a\0b", errno.EINVAL),
    ("x" * 256, errno.ENAMETOOLONG),
    ("a/" + "x" * 256 + "/b", errno.ENAMETOOLONG),
    ("/".join(["x" * 200] * 6), errno.ENAMETOOLONG),  # 1205 bytes
]


@pytest.mark.parametrize(("key", "code"), BAD_KEYS, ids=[repr(k[:20]) for k, _ in BAD_KEYS])
def test_key_rules(nsenv: NsEnv, key: str, code: int) -> None:
    env, ns = nsenv, nsenv.ns
    env.bucket()
    e = env.err(code, ns.put_object(ROOT, "bkt", key, chunks(b"x")))
    assert str(e)
    env.err(code, ns.head_object(ROOT, "bkt", key))
    env.err(code, ns.get_object(ROOT, "bkt", key))
    env.err(code, ns.delete_object(ROOT, "bkt", key))
    assert env.names(ROOT, env.run(ns.resolve(ROOT, "bkt")).ino) == []


def test_longest_keys_are_accepted(nsenv: NsEnv) -> None:
    env = nsenv
    env.bucket()
    key = "/".join(["y" * 255] * 3 + ["w" * 250, "z" * 5])  # 1024 bytes
    assert len(key.encode()) == 1024
    env.put(ROOT, "bkt", key, b"deep")
    assert env.get(ROOT, "bkt", key) == b"deep"
    env.put(ROOT, "bkt", "k" * 255, b"wide")
    assert env.get(ROOT, "bkt", "k" * 255) == b"wide"


def test_a_key_cannot_be_both_object_and_prefix(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    env.bucket()
    env.put(ROOT, "bkt", "a", b"file")
    e = env.err(errno.ENOTDIR, ns.put_object(ROOT, "bkt", "a/b", chunks(b"x")))
    assert "a" in str(e)
    env.err(errno.ENOTDIR, ns.put_object(ROOT, "bkt", "a/b/c", chunks(b"x")))
    env.put(ROOT, "bkt", "x/y", b"nested")
    env.err(errno.EISDIR, ns.put_object(ROOT, "bkt", "x", chunks(b"x")))
    env.err(errno.ENOENT, ns.get_object(ROOT, "bkt", "a/b"))
    env.err(errno.ENOENT, ns.head_object(ROOT, "bkt", "x"))  # a prefix is not an object
    assert env.get(ROOT, "bkt", "a") == b"file"
    assert env.get(ROOT, "bkt", "x/y") == b"nested"


def test_marker_keys_are_directories(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    d = env.put(ROOT, "bkt", "m/n/", b"")
    assert d.is_dir
    assert env.run(ns.resolve(ROOT, "bkt/m/n")).ino == d.ino
    assert env.names(ROOT, b) == [b"m"]
    head = env.run(ns.head_object(ROOT, "bkt", "m/n/"))
    assert head.is_dir and head.size == 0
    assert env.get(ROOT, "bkt", "m/n/") == b""
    env.err(errno.ENOENT, ns.head_object(ROOT, "bkt", "m/n"))  # the object "m/n" is not
    env.err(errno.EINVAL, ns.put_object(ROOT, "bkt", "m/o/", chunks(b"body")))
    env.put(ROOT, "bkt", "m/n/inside", b"1")
    env.err(errno.EISDIR, ns.put_object(ROOT, "bkt", "m/n", chunks(b"x")))
    assert env.run(ns.delete_object(ROOT, "bkt", "m/n/inside")) is True
    # the marker made the directory explicit: it outlives its last key
    assert env.run(ns.resolve(ROOT, "bkt/m/n")).is_dir
    assert env.run(ns.delete_object(ROOT, "bkt", "m/n/")) is True
    env.err(errno.ENOENT, ns.resolve(ROOT, "bkt/m/n"))
    # a directory made through the POSIX calls is a marker too
    env.run(ns.mkdir(ROOT, b, b"posix", 0o755))
    assert env.run(ns.head_object(ROOT, "bkt", "posix/")).is_dir


def test_implicit_directories_vanish_with_their_last_key(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    env.put(ROOT, "bkt", "p/q/r", b"1")
    assert env.run(ns.getattr(ROOT, b)).nlink == 3
    assert env.run(ns.delete_object(ROOT, "bkt", "p/q/r")) is True
    assert env.names(ROOT, b) == []
    assert env.run(ns.getattr(ROOT, b)).nlink == 2
    # but not directories somebody made or still uses
    env.run(ns.mkdir(ROOT, b, b"kept", 0o755))
    env.put(ROOT, "bkt", "kept/k", b"1")
    env.run(ns.delete_object(ROOT, "bkt", "kept/k"))
    assert env.names(ROOT, b) == [b"kept"]


SEGMENTS = ["a", "b", "a-", "a.", "a0", "-", "0", "ab"]
KEYS = st.lists(
    st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3).map("/".join), max_size=12
)


def model_listing(keys: list[str], prefix: str, delimiter: str) -> list[tuple[str, bool]]:
    """S3 ListObjects: (key or common prefix, is_prefix) in key order."""
    out: list[tuple[str, bool]] = []
    for k in sorted(keys, key=str.encode):
        if not k.startswith(prefix):
            continue
        i = k.find(delimiter, len(prefix)) if delimiter else -1
        if i >= 0:
            cp = k[: i + len(delimiter)]
            if not out or out[-1] != (cp, True):
                out.append((cp, True))
        else:
            out.append((k, False))
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    keys=KEYS,
    prefix=st.sampled_from(["", "a", "a/", "a-", "b/", "a/b", "z"]),
    delimiter=st.sampled_from(["", "/", "-"]),
    limit=st.integers(1, 5),
)
def test_list_objects_matches_a_model(
    nsenv_factory: Any, keys: list[str], prefix: str, delimiter: str, limit: int
) -> None:
    """Keys put through S3 list in byte order with S3's prefix/delimiter/marker rules, and
    pages chained by next_marker return every entry exactly once."""
    env: NsEnv = nsenv_factory("memory")
    ns = env.ns
    env.bucket()
    stored: list[str] = []
    for key in keys:
        conflict = any(
            k != key and (k.startswith(key + "/") or key.startswith(k + "/")) for k in stored
        )
        if conflict:
            with pytest.raises(OSError) as ei:
                env.put(ROOT, "bkt", key, b"x")
            assert ei.value.errno in (errno.ENOTDIR, errno.EISDIR)
            continue
        env.put(ROOT, "bkt", key, key.encode())
        if key not in stored:
            stored.append(key)
    want = model_listing(stored, prefix, delimiter)
    got: list[tuple[str, bool]] = []
    marker = ""
    for _ in range(len(want) + 2):
        page = env.run(ns.list_objects(ROOT, "bkt", prefix, marker, delimiter, limit))
        entries = [(k, False) for k, _ in page.contents] + [(p, True) for p in page.prefixes]
        entries.sort(key=lambda e: e[0].encode())
        assert len(entries) <= limit
        got += entries
        for k, inode in page.contents:
            assert inode.size == len(k) and inode.etag == md5(k.encode())
        if not page.truncated:
            break
        assert page.next_marker == entries[-1][0]
        marker = page.next_marker
    assert got == want


def check_consistency(env: NsEnv) -> None:
    """Link counts match the entries, and the store holds exactly the reachable inodes."""
    refs: dict[int, int] = {}
    subdirs: dict[int, int] = {}

    def walk(ino: int) -> None:
        subdirs[ino] = 0
        for _, inode in env.run(env.ns.listdir(ROOT, ino)):
            if inode.is_dir:
                subdirs[ino] += 1
                walk(inode.ino)
            else:
                refs[inode.ino] = refs.get(inode.ino, 0) + 1

    walk(ROOT_INO)
    for ino, n in refs.items():
        assert env.run(env.ns.getattr(ROOT, ino)).nlink == n
    for ino, n in subdirs.items():
        assert env.run(env.ns.getattr(ROOT, ino)).nlink == 2 + n
    assert inode_count(env) == len(refs) + len(subdirs)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1))
def test_concurrent_operations_keep_the_namespace_consistent(nsenv_factory: Any, seed: int) -> None:
    """Many POSIX and S3 calls in flight at once on a few names: each may fail with an
    errno, none may crash, and the tree stays consistent (link counts, no leaked inodes)."""
    env: NsEnv = nsenv_factory("memory")
    ns = env.ns
    b = env.bucket()
    rng = random.Random(seed)
    names = [b"x", b"y", b"z"]

    async def one(i: int) -> None:
        name, other = rng.choice(names), rng.choice(names)
        kind = rng.choice(["create", "put", "rename", "unlink", "mkdir", "rmdir", "link", "del"])
        try:
            if kind == "create":
                _, fh = await ns.create(ROOT, b, name, REG, RW_CREAT)
                await ns.write(fh, rng.randint(0, 100), os.urandom(rng.randint(1, 70_000)))
                await asyncio.sleep(0)
                await ns.release(fh)
            elif kind == "put":
                await ns.put_object(ROOT, "bkt", name.decode(), chunks(b"p" * i, 1000))
            elif kind == "rename":
                await ns.rename(ROOT, b, name, b, other, flags=rng.choice([0, 1, 2]))
            elif kind == "unlink":
                await ns.unlink(ROOT, b, name)
            elif kind == "mkdir":
                await ns.mkdir(ROOT, b, name, 0o755)
            elif kind == "rmdir":
                await ns.rmdir(ROOT, b, name)
            elif kind == "link":
                src = await ns.lookup(ROOT, b, name)
                await ns.link(ROOT, src.ino, b, other)
            else:
                await ns.delete_object(ROOT, "bkt", name.decode())
        except OSError as e:
            assert e.errno in (
                errno.ENOENT,
                errno.EEXIST,
                errno.EISDIR,
                errno.ENOTDIR,
                errno.ENOTEMPTY,
                errno.EPERM,
            ), f"{kind} {name!r} {other!r}: {e!r}"

    async def all_at_once() -> None:
        await asyncio.gather(*(one(i) for i in range(40)))

    env.run(all_at_once())
    check_consistency(env)
    for name, inode in env.run(ns.listdir(ROOT, b)):
        if inode.is_reg:
            assert len(env.read_file(ROOT, inode.ino)) == env.run(ns.getattr(ROOT, inode.ino)).size
            head = env.run(ns.head_object(ROOT, "bkt", name.decode()))
            assert head.etag == md5(env.get(ROOT, "bkt", name.decode()))


# -- the namespace root and buckets ------------------------------------------------------------
def test_root_holds_only_buckets(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    for bad in (b"ab", b"Upper", b"under_score", b"-dash", b"a..b", b"192.168.1.1", b"x" * 64):
        env.err(errno.EINVAL, ns.mkdir(ROOT, ROOT_INO, bad, 0o755))
    env.err(errno.EINVAL, ns.create_bucket(ROOT, "Bad_Name"))
    env.err(errno.EPERM, ns.create(ROOT, ROOT_INO, b"file", REG, RW_CREAT))
    env.err(errno.EPERM, ns.mknod(ROOT, ROOT_INO, b"file", REG))
    env.err(errno.EPERM, ns.symlink(ROOT, ROOT_INO, b"link", b"x"))
    b = env.run(ns.mkdir(ROOT, ROOT_INO, b"made-by-mkdir", 0o755))
    made = env.run(ns.create_bucket(ALICE, "made.by.s3"))
    assert made.uid == 1000 and made.is_dir
    env.err(errno.EEXIST, ns.create_bucket(ROOT, "made-by-mkdir"))
    names = sorted(bk.name for bk in env.run(ns.list_buckets(ROOT)))
    assert names == ["made-by-mkdir", "made.by.s3"]
    assert env.names(ROOT, ROOT_INO) == [b"made-by-mkdir", b"made.by.s3"]
    assert env.run(ns.getattr(ROOT, ROOT_INO)).nlink == 4
    env.put(ROOT, "made-by-mkdir", "k", b"v")
    env.err(errno.ENOTEMPTY, ns.delete_bucket(ROOT, "made-by-mkdir"))
    env.err(errno.ENOENT, ns.delete_bucket(ROOT, "missing"))
    env.run(ns.delete_object(ROOT, "made-by-mkdir", "k"))
    env.run(ns.delete_bucket(ROOT, "made-by-mkdir"))
    env.run(ns.rmdir(ROOT, ROOT_INO, b"made.by.s3"))
    assert env.run(ns.list_buckets(ROOT)) == []
    assert b.ino != made.ino


def test_statfs(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    s = env.run(ns.statfs())
    assert s.f_bsize > 0 and s.f_blocks > 0 and s.f_namemax == 255
    assert 0 <= s.f_bavail <= s.f_bfree <= s.f_blocks
    assert 0 <= s.f_ffree <= s.f_files
    env.bucket()
    env.put(ROOT, "bkt", "a/b", b"x")
    assert env.run(ns.statfs()).f_ffree == s.f_ffree - 3  # bucket, a, a/b


# -- persistence ------------------------------------------------------------------------------
def snapshot(env: NsEnv) -> dict[str, Any]:
    """Everything observable under the root, by path."""
    out: dict[str, Any] = {}

    def walk(ino: int, path: str) -> None:
        for name, inode in env.run(env.ns.listdir(ROOT, ino)):
            p = f"{path}/{name.decode()}"
            a = env.run(env.ns.getattr(ROOT, inode.ino))
            e: dict[str, Any] = {
                k: getattr(a, k)
                for k in ("ino", "mode", "uid", "gid", "size", "nlink", "mtime_ns", "objmeta")
            }
            e["xattrs"] = {}
            if not a.is_lnk:
                for n in env.run(env.ns.listxattr(ROOT, a.ino)):
                    e["xattrs"][n] = env.run(env.ns.getxattr(ROOT, a.ino, n))
            if a.is_reg:
                e["data"] = env.read_file(ROOT, a.ino)
            if a.is_lnk:
                e["target"] = env.run(env.ns.readlink(ROOT, a.ino))
            out[p] = e
            if a.is_dir:
                walk(a.ino, p)

    walk(ROOT_INO, "")
    return out


def test_everything_survives_close_and_reopen(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    d = env.run(ns.mkdir(ALICE, b, b"d", 0o750)).ino
    f = env.write_file(ALICE, d, b"f", b"file data", mode=0o640)
    env.run(ns.setattr(ROOT, f, gid=1001, mtime_ns=1_234_567_890_000_000_000))
    env.run(ns.setxattr(ALICE, f, b"user.k", b"v"))
    env.run(ns.setxattr(ROOT, d, b"trusted.t", b"root's"))
    env.run(ns.link(ROOT, f, b, b"hard"))
    env.run(ns.symlink(ROOT, b, b"sym", b"d/f"))
    env.put(ROOT, "bkt", "obj/key", b"object data", objmeta={"content-type": "text/plain"})
    env.run(ns.create_bucket(ROOT, "second"))
    before = snapshot(env)
    stats = env.ns.stats()
    env.reopen()
    assert snapshot(env) == before
    assert env.ns.stats()["inodes"] == stats["inodes"]
    assert env.ns.stats()["bytes"] == stats["bytes"]
    assert env.run(env.ns.head_object(ROOT, "bkt", "obj/key")).etag == md5(b"object data")
    # and the namespace keeps working: new inode numbers do not collide with old ones
    new = env.write_file(ROOT, b, b"new", b"after")
    assert new not in {e["ino"] for e in before.values()}


def test_written_data_survives_reopen(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    inode, fh = env.run(ns.create(ROOT, b, b"fsynced", REG, RW_CREAT))
    env.run(ns.write(fh, 0, b"durable"))
    env.run(ns.fsync(fh))
    env.run(ns.write(fh, 7, b"+flushed"))
    env.run(ns.flush(fh))
    inode2, fh2 = env.run(ns.create(ROOT, b, b"open-at-close", REG, RW_CREAT))
    env.run(ns.write(fh2, 0, b"released by close"))
    env.reopen()  # close releases what is still open
    ns = env.ns
    assert env.read_file(ROOT, lookup_ino(env, b, b"fsynced")) == b"durable+flushed"
    assert env.run(ns.getattr(ROOT, inode.ino)).size == 15
    assert env.read_file(ROOT, inode2.ino) == b"released by close"
    assert env.run(ns.head_object(ROOT, "bkt", "fsynced")).etag == md5(b"durable+flushed")


def test_fsynced_data_and_acknowledged_puts_survive_a_crash(nsenv: NsEnv) -> None:
    env, ns = nsenv, nsenv.ns
    b = env.bucket()
    inode, fh = env.run(ns.create(ROOT, b, b"f", REG, RW_CREAT))
    env.run(ns.write(fh, 0, b"acknowledged"))
    env.run(ns.fsync(fh))
    env.put(ROOT, "bkt", "obj", b"put")
    env.run(ns.mkdir(ROOT, b, b"d", 0o700))
    env.crash_reopen()
    ns = env.ns
    assert env.read_file(ROOT, lookup_ino(env, b, b"f")) == b"acknowledged"
    assert env.run(ns.getattr(ROOT, inode.ino)).size == 12
    assert env.get(ROOT, "bkt", "obj") == b"put"
    assert stat.S_IMODE(env.run(ns.resolve(ROOT, "bkt/d")).mode) == 0o700


def test_memory_engine_namespace_works_too(nsenv_factory: Any) -> None:
    env: NsEnv = nsenv_factory("memory")
    env.bucket()
    env.put(ROOT, "bkt", "k", b"v")
    assert env.get(ROOT, "bkt", "k") == b"v"


def test_a_pool_quota_is_durable_when_set(nsenv: NsEnv) -> None:
    """The admin API acknowledges a quota as set: its record is in the engine under the
    group commit's memory (what survives a machine crash) when the call returns.  Before,
    it waited for the next group flush like a change nobody waits for."""
    ns = nsenv.ns
    nsenv.run(ns.set_pool_quota(7, 1 << 20))
    engine = ns.meta.engine
    inner = getattr(engine, "inner", engine)  # under group commit: the engine below it
    with inner.begin() as tx:
        assert tx.get(b"U" + (7).to_bytes(8, "big")) == (1 << 20).to_bytes(8, "big")
    assert ns.pool_quotas() == {7: 1 << 20}
    nsenv.run(ns.set_pool_quota(7, 0))
    assert ns.pool_quotas() == {}
