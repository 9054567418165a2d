"""Each FUSE operation through the mount with os calls: results, attributes and errnos."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import tempfile
import time
from pathlib import Path

import pytest
from conftest import Daemon

pytestmark = pytest.mark.timeout(120)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                            ctypes.c_uint]
_libc.getxattr.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.getxattr.restype = ctypes.c_ssize_t
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


def renameat2(old: Path, new: Path, flags: int) -> None:
    if _libc.renameat2(-100, bytes(old), -100, bytes(new), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def err(fn: object, *args: object, **kw: object) -> int:
    """The errno ``fn(*args)`` fails with."""
    try:
        fn(*args, **kw)  # type: ignore[operator]
    except OSError as e:
        return e.errno or 0
    raise AssertionError(f"{fn}{args} did not fail")


def test_lookup_getattr_and_errnos(work: Path) -> None:
    (work / "f").write_bytes(b"12345")
    st = os.stat(work / "f")
    assert stat.S_ISREG(st.st_mode) and st.st_size == 5 and st.st_nlink == 1
    assert err(os.stat, work / "missing") == errno.ENOENT
    assert err(os.stat, work / "f" / "x") == errno.ENOTDIR
    assert err(os.mkdir, work / "f") == errno.EEXIST
    assert err(os.open, work / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY) == errno.EEXIST
    assert err(os.rmdir, work / "f") == errno.ENOTDIR
    assert err(os.unlink, work) == errno.EISDIR
    assert err(os.open, work, os.O_WRONLY) == errno.EISDIR
    assert err(os.stat, work / ("n" * 256)) == errno.ENAMETOOLONG
    assert err(os.mkdir, work / ("n" * 256)) == errno.ENAMETOOLONG
    (work / "d").mkdir()
    (work / "d" / "x").touch()
    assert err(os.rmdir, work / "d") == errno.ENOTEMPTY
    assert err(os.rename, work / "d", work / "d" / "sub") == errno.EINVAL
    assert err(os.readlink, work / "f") == errno.EINVAL


def test_directory_link_counts_and_times(work: Path) -> None:
    d = work / "d"
    d.mkdir()
    assert os.stat(d).st_nlink == 2
    (d / "s1").mkdir()
    (d / "s2").mkdir()
    (d / "file").touch()
    assert os.stat(d).st_nlink == 4
    os.rmdir(d / "s1")
    assert os.stat(d).st_nlink == 3
    before = os.stat(d).st_mtime_ns
    time.sleep(0.01)
    (d / "new").touch()
    assert os.stat(d).st_mtime_ns > before


def test_setattr_chmod_chown_truncate_utimens(work: Path) -> None:
    f = work / "f"
    f.write_bytes(b"abcdef")
    os.chmod(f, 0o4751)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o4751
    os.chown(f, 1234, 5678)
    st = os.stat(f)
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    os.truncate(f, 2)
    assert f.read_bytes() == b"ab"
    os.utime(f, ns=(1_000_000_001, 2_000_000_002))
    st = os.stat(f)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_001, 2_000_000_002)
    # UTIME_OMIT keeps one time while the other changes; UTIME_NOW sets the current time
    fd = os.open(f, os.O_RDONLY)
    try:
        times = (ctypes.c_long * 4)(0, (1 << 30) - 2, 3, 0)  # atime OMIT, mtime = 3 s
        assert _libc.futimens(fd, times) == 0
        st = os.stat(f)
        assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_001, 3_000_000_000)
        times = (ctypes.c_long * 4)(0, (1 << 30) - 1, 0, (1 << 30) - 2)  # atime NOW, mtime OMIT
        now = time.time_ns()
        assert _libc.futimens(fd, times) == 0
        st = os.stat(f)
        assert abs(st.st_atime_ns - now) < 5_000_000_000 and st.st_mtime_ns == 3_000_000_000
    finally:
        os.close(fd)
    assert err(os.truncate, work, 0) == errno.EISDIR
    assert err(os.truncate, f, -1) == errno.EINVAL


def test_open_flags(work: Path) -> None:
    f = work / "f"
    f.write_bytes(b"hello world")
    fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
    os.close(fd)
    assert f.read_bytes() == b""
    f.write_bytes(b"one")
    fd = os.open(f, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"-two")
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, b"-three")  # O_APPEND ignores the position
    os.close(fd)
    assert f.read_bytes() == b"one-two-three"
    fd = os.open(f, os.O_RDONLY)
    assert err(os.write, fd, b"x") == errno.EBADF
    os.close(fd)
    fd = os.open(work / "new", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"data")
    os.fsync(fd)
    os.fdatasync(fd)
    assert os.pread(fd, 10, 0) == b"data"
    os.close(fd)
    assert stat.S_IMODE(os.stat(work / "new").st_mode) == 0o600


def test_unlink_open_file_stays_readable(work: Path) -> None:
    f = work / "f"
    f.write_bytes(b"still here")
    fd = os.open(f, os.O_RDWR)
    try:
        os.unlink(f)
        assert not f.exists()
        assert os.pread(fd, 100, 0) == b"still here"
        os.pwrite(fd, b"STILL", 0)
        assert os.pread(fd, 100, 0) == b"STILL here"
        assert os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)


def test_rename_flags(work: Path) -> None:
    a, b = work / "a", work / "b"
    a.write_bytes(b"A")
    b.write_bytes(b"B")
    assert err(renameat2, a, b, RENAME_NOREPLACE) == errno.EEXIST
    renameat2(a, b, RENAME_EXCHANGE)
    assert a.read_bytes() == b"B" and b.read_bytes() == b"A"
    assert err(renameat2, a, work / "c", RENAME_EXCHANGE) == errno.ENOENT
    renameat2(a, work / "c", RENAME_NOREPLACE)
    assert (work / "c").read_bytes() == b"B" and not a.exists()
    (work / "d1").mkdir()
    (work / "d2").mkdir()
    (work / "d2" / "x").touch()
    assert err(os.rename, work / "d1", work / "d2") == errno.ENOTEMPTY
    assert err(os.rename, work / "c", work / "d1") == errno.EISDIR
    assert err(os.rename, work / "d1", work / "c") == errno.ENOTDIR
    os.rename(work / "d1", work / "d2" / "moved")  # across directories
    assert (work / "d2" / "moved").is_dir()
    with tempfile.TemporaryDirectory() as other:  # another file system: the kernel's EXDEV
        assert err(os.rename, work / "c", Path(other) / "c") == errno.EXDEV
        assert err(os.link, work / "c", Path(other) / "c") == errno.EXDEV


def test_links_symlinks_and_nodes(work: Path) -> None:
    f = work / "f"
    f.write_bytes(b"x")
    os.link(f, work / "h")
    assert os.stat(f).st_nlink == 2 and os.stat(work / "h").st_ino == os.stat(f).st_ino
    os.symlink("f", work / "s")
    assert os.readlink(work / "s") == "f" and (work / "s").read_bytes() == b"x"
    assert os.lstat(work / "s").st_size == 1
    assert err(os.link, work, work / "dirlink") == errno.EPERM
    os.symlink("loop2", work / "loop1")
    os.symlink("loop1", work / "loop2")
    assert err(os.stat, work / "loop1") == errno.ELOOP
    os.mkfifo(work / "fifo", 0o644)
    assert stat.S_ISFIFO(os.stat(work / "fifo").st_mode)
    os.mknod(work / "plain", 0o600 | stat.S_IFREG)
    assert stat.S_ISREG(os.stat(work / "plain").st_mode)
    os.mknod(work / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    assert os.stat(work / "null").st_rdev == os.makedev(1, 3)


_SYS_getdents64 = 217  # x86_64
_libc.syscall.restype = ctypes.c_long


def getdents(fd: int, bufsize: int = 512) -> list[str]:
    """One getdents64 call with a small buffer: the kernel asks the mount for the next
    entries at the offset it was last given, so a listing spans many FUSE readdir calls."""
    buf = ctypes.create_string_buffer(bufsize)
    n = _libc.syscall(_SYS_getdents64, fd, buf, bufsize)
    assert n >= 0, os.strerror(ctypes.get_errno())
    names, pos, raw = [], 0, buf.raw[:n]
    while pos < n:
        reclen = int.from_bytes(raw[pos + 16:pos + 18], "little")
        name = raw[pos + 19:pos + reclen].split(b"\0", 1)[0].decode()
        names.append(name)
        pos += reclen
    return names


def test_readdir_stable_offsets_under_changes(work: Path) -> None:
    d = work / "big"
    d.mkdir()
    names = [f"e{i:04d}" for i in range(600)]
    for n in names:
        (d / n).touch()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    seen: list[str] = []
    calls = 0
    try:
        while True:
            batch = getdents(fd)
            calls += 1
            if not batch:
                break
            seen.extend(batch)
            if calls == 5:  # mutate in the middle of the listing
                assert seen[-1] < "e0300"
                for n in names[300:320]:
                    os.unlink(d / n)  # not listed yet: must not appear
                os.unlink(d / names[10])  # already listed
                for n in ("e0450x", "zzz", "e0001x"):
                    (d / n).touch()  # two after the position (listed), one before (not)
    finally:
        os.close(fd)
    seen = [n for n in seen if n not in (".", "..")]
    assert calls > 20
    assert len(seen) == len(set(seen)), "an entry was listed twice"
    expected = (set(names) - set(names[300:320])) | {"e0450x", "zzz"}
    assert set(seen) == expected, (sorted(expected - set(seen))[:5], sorted(set(seen) - expected))
    assert seen == sorted(seen)


def test_readdir_dot_entries_and_types(work: Path) -> None:
    (work / "sub").mkdir()
    (work / "file").touch()
    os.symlink("file", work / "link")
    entries = {e.name: e for e in os.scandir(work)}
    assert set(entries) == {"sub", "file", "link"}
    assert entries["sub"].is_dir() and entries["file"].is_file() and entries["link"].is_symlink()
    assert entries["file"].inode() == os.stat(work / "file").st_ino


def test_xattrs(work: Path) -> None:
    f = work / "f"
    f.touch()
    os.setxattr(f, "user.a", b"1")
    os.setxattr(f, "user.b", b"")
    assert sorted(os.listxattr(f)) == ["user.a", "user.b"]
    assert os.getxattr(f, "user.a") == b"1" and os.getxattr(f, "user.b") == b""
    assert err(os.setxattr, f, "user.a", b"2", os.XATTR_CREATE) == errno.EEXIST
    assert err(os.setxattr, f, "user.c", b"2", os.XATTR_REPLACE) == errno.ENODATA
    os.setxattr(f, "user.a", b"2", os.XATTR_REPLACE)
    assert os.getxattr(f, "user.a") == b"2"
    os.removexattr(f, "user.a")
    assert err(os.getxattr, f, "user.a") == errno.ENODATA
    assert err(os.removexattr, f, "user.a") == errno.ENODATA
    assert err(os.setxattr, f, "user.big", b"x" * 65537) == errno.E2BIG
    assert err(os.setxattr, f, "bogus.name", b"x") == errno.EOPNOTSUPP
    os.symlink("f", work / "s")
    assert err(os.setxattr, work / "s", "user.a", b"x", follow_symlinks=False) == errno.EPERM
    os.setxattr(f, "user.long", b"v" * 100)
    buf = ctypes.create_string_buffer(10)  # a buffer too small for the value: ERANGE
    assert _libc.getxattr(bytes(f), b"user.long", buf, 10) == -1
    assert ctypes.get_errno() == errno.ERANGE
    assert _libc.getxattr(bytes(f), b"user.long", None, 0) == 100  # size query
    assert err(os.getxattr, f, "user." + "n" * 300) == errno.ERANGE  # name too long


def test_access(work: Path) -> None:
    f = work / "f"
    f.touch()
    f.chmod(0o644)
    assert os.access(f, os.R_OK | os.W_OK)
    assert not os.access(f, os.X_OK)  # root needs an x bit to execute
    f.chmod(0o744)
    assert os.access(f, os.X_OK)
    assert not os.access(work / "missing", os.F_OK)


def test_statfs_reports_tier_capacity(daemon: Daemon, work: Path) -> None:
    mnt = os.statvfs(work)
    hot = os.statvfs(daemon.data_dir / "hot")
    assert mnt.f_blocks * mnt.f_frsize == hot.f_blocks * hot.f_frsize
    assert abs(mnt.f_bavail * mnt.f_frsize - hot.f_bavail * hot.f_frsize) < 1 << 30
    assert mnt.f_namemax == 255 and mnt.f_files > 0


def test_root_holds_only_buckets(daemon: Daemon) -> None:
    assert err(open, daemon.mnt / "file-at-root", "w") == errno.EPERM
    assert err(os.mkdir, daemon.mnt / "Bad_Bucket") == errno.EINVAL
    assert err(os.symlink, "x", daemon.mnt / "link") == errno.EPERM
    os.mkdir(daemon.mnt / "another-bucket")
    assert "another-bucket" in os.listdir(daemon.mnt)
    os.rmdir(daemon.mnt / "another-bucket")


def test_mount_read_ahead_is_raised(daemon: Daemon, work: Path) -> None:
    """The kernel reads ahead READ_AHEAD_KIB on the mount (root can set it), so sequential
    readers get 1 MiB requests, several at once; and a large file still reads back exactly."""
    from tierd_fuse.mount import READ_AHEAD_KIB, find_mount

    info = find_mount(daemon.mnt)
    assert info is not None and info.dev
    if os.geteuid() == 0:
        with open(f"/sys/class/bdi/{info.dev}/read_ahead_kb") as f:
            assert int(f.read()) == READ_AHEAD_KIB
    data = os.urandom(3 << 20) + b"tail"
    (work / "big").write_bytes(data)
    with open(work / "big", "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        got = b"".join(iter(lambda: f.read(1 << 20), b""))
    assert got == data
