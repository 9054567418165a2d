"""The "POSIX compliance" table in docs/semantics.md, probed on a real mount.

Each probe runs the operation through a real ``tierd serve --mount`` and checks the errno
or behaviour; it also checks that the table's row states that errno, so the page and the
mount cannot drift apart.  Rows already covered by tests/fuse/ name those tests instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from public_dir import public_tempdir
from s3.conftest import Daemon, start_daemon
from tierd_fuse.mount import find_mount, unmount

DOC = Path(__file__).resolve().parents[2] / "docs" / "semantics.md"
LIBC = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_WHITEOUT = 1, 4
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2
FS_IOC_GETFLAGS = 0x80086601

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.geteuid() != 0,
                                reason="needs /dev/fuse and root (device nodes, ACLs)")


def row(label: str) -> str:
    """The POSIX compliance table's row whose first cell starts with ``label``."""
    section = DOC.read_text().split("## POSIX compliance", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith(f"| {label}")]
    assert len(rows) == 1, f"docs/semantics.md: no single row for {label!r}"
    return rows[0]


def errno_of(fn: Callable[[], object]) -> str:
    try:
        fn()
    except OSError as e:
        return errno.errorcode[e.errno or 0]
    return "ok"


def check(rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def documented(label: str, name: str) -> None:
    # ENOTSUP and EOPNOTSUPP are one number on Linux; the page says EOPNOTSUPP
    shown = "EOPNOTSUPP" if name == "ENOTSUP" else name
    assert f"`{shown}`" in row(label), f"the row {label!r} does not say {shown}"


def start(data: Path, mnt: Path) -> Daemon:
    d = start_daemon(data, "--mount", str(mnt))
    deadline = time.monotonic() + 30
    while find_mount(mnt) is None:
        assert time.monotonic() < deadline, "the mount did not appear"
        time.sleep(0.05)
    return d


def stop(d: Daemon, mnt: Path) -> None:
    d.stop()
    if find_mount(mnt) is not None:
        with contextlib.suppress(Exception):
            unmount(mnt, lazy=True)


@pytest.fixture(scope="module")
def mount() -> Iterator[tuple[Path, Path]]:
    with public_tempdir("tierd-posix-") as where:
        mnt = where / "mnt"
        mnt.mkdir()
        d = start(where / "data", mnt)
        try:
            (mnt / "posix-claims").mkdir()
            yield mnt, where
        finally:
            stop(d, mnt)
        assert "Traceback" not in d.log.read_text(errors="replace")


@pytest.fixture
def work(mount: tuple[Path, Path], request: pytest.FixtureRequest) -> Path:
    d: Path = mount[0] / "posix-claims" / str(request.node.name)[:60]
    d.mkdir()
    return d


def test_fallocate_is_refused_and_posix_fallocate_falls_back(work: Path) -> None:
    fd = os.open(work / "f", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"x" * 8192)
        for mode in (0, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE):
            name = errno_of(lambda m=mode: check(LIBC.fallocate(fd, m, ctypes.c_long(0),  # type: ignore[misc]
                                                                ctypes.c_long(4096))))
            assert name in ("EOPNOTSUPP", "ENOTSUP")
            documented("`fallocate`", name)
        os.posix_fallocate(fd, 0, 1 << 20)  # glibc writes zeros itself
        assert os.fstat(fd).st_size == 1 << 20
        assert os.pread(fd, 16, 8192) == b"\0" * 16
    finally:
        os.close(fd)


def test_o_tmpfile_and_ioctl(work: Path) -> None:
    name = errno_of(lambda: os.open(work, os.O_TMPFILE | os.O_RDWR, 0o600))
    assert name in ("EOPNOTSUPP", "ENOTSUP")
    documented("`O_TMPFILE`", name)
    fd = os.open(work / "f", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        name = errno_of(lambda: fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 8))
        assert name == "ENOTTY"
        documented("`ioctl`", name)
    finally:
        os.close(fd)


def test_sparse_files_read_zeros_and_look_dense(work: Path) -> None:
    p = work / "sparse"
    with open(p, "wb") as f:
        f.write(b"a")
        f.seek(10 << 20)
        f.write(b"b")
    st = os.stat(p)
    assert st.st_size == (10 << 20) + 1
    assert st.st_blocks * 512 >= st.st_size  # reported dense
    fd = os.open(p, os.O_RDONLY)
    try:
        assert os.pread(fd, 4, 1 << 20) == b"\0" * 4
        assert os.lseek(fd, 0, os.SEEK_HOLE) == st.st_size
        assert os.lseek(fd, 4096, os.SEEK_DATA) == 4096
    finally:
        os.close(fd)
    assert "SEEK_HOLE" in row("sparse files")


def test_copy_file_range_and_o_direct(work: Path) -> None:
    src, dst = work / "src", work / "dst"
    src.write_bytes(os.urandom(1 << 20))
    with open(src, "rb") as a, open(dst, "wb") as b:
        assert os.copy_file_range(a.fileno(), b.fileno(), 1 << 20) > 0
    assert dst.read_bytes()[:4096] == src.read_bytes()[:4096]
    fd = os.open(work / "direct", os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
    try:
        buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
        buf.write(b"d" * 4096)
        assert os.pwritev(fd, [buf], 0) == 4096
        back = mmap.mmap(-1, 4096)
        assert os.preadv(fd, [back], 0) == 4096 and back[:] == b"d" * 4096
    finally:
        os.close(fd)


def test_device_nodes_are_created_but_not_opened(work: Path) -> None:
    node = work / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert stat.S_ISCHR(os.stat(node).st_mode)
    name = errno_of(lambda: os.open(node, os.O_RDONLY))
    assert name == "EACCES"
    documented("device nodes", name)
    os.mkfifo(work / "fifo")
    assert stat.S_ISFIFO(os.stat(work / "fifo").st_mode)


def test_rename_flags_and_buckets(work: Path, mount: tuple[Path, Path]) -> None:
    a, b = work / "a", work / "b"
    a.write_bytes(b"a")
    b.write_bytes(b"b")

    def renameat2(src: Path, dst: Path, flags: int) -> None:
        check(LIBC.renameat2(AT_FDCWD, bytes(src), AT_FDCWD, bytes(dst), flags))

    for flags, want in ((RENAME_NOREPLACE, "EEXIST"), (RENAME_WHITEOUT, "EINVAL")):
        name = errno_of(lambda f=flags: renameat2(a, b, f))  # type: ignore[misc]
        assert name == want
        documented("rename |", want)
    bucket = mount[0] / "posix-claims"
    name = errno_of(lambda: os.rename(bucket, mount[0] / "posix-claims-2"))
    assert name == "EPERM"
    documented("rename of a bucket", name)


def test_names_and_long_paths(work: Path) -> None:
    name = errno_of(lambda: (work / ("n" * 256)).write_bytes(b""))
    assert name == "ENAMETOOLONG"
    documented("names", name)
    deep = work
    for _ in range(6):
        deep = deep / ("x" * 200)
        deep.mkdir()
    (deep / "f").write_bytes(b"deep")  # a path the S3 door could not address
    assert (deep / "f").read_bytes() == b"deep"
    assert "`KeyTooLongError`" in row("names")


def test_xattrs_and_posix_acls(work: Path) -> None:
    f = work / "f"
    f.write_bytes(b"")
    os.setxattr(f, "user.k", b"v")
    assert os.getxattr(f, "user.k") == b"v"
    name = errno_of(lambda: os.setxattr(f, "system.other", b"1"))
    assert name in ("EOPNOTSUPP", "ENOTSUP")
    documented("extended attributes", name)
    name = errno_of(lambda: os.setxattr(f, "user.big", b"x" * (65 << 10)))
    assert name == "E2BIG"
    documented("extended attributes", name)
    setfacl, getfacl = shutil.which("setfacl"), shutil.which("getfacl")
    assert setfacl and getfacl, "the acl package (setfacl/getfacl) is needed"
    subprocess.run([setfacl, "-m", "u:4242:r", str(f)], check=True)
    out = subprocess.run([getfacl, "-cn", str(f)], check=True, capture_output=True,
                         text=True).stdout
    assert "user:4242:r--" in out
    assert "`setfacl`" in row("POSIX ACLs")


def test_close_is_durable_across_a_daemon_kill(mount: tuple[Path, Path]) -> None:
    """Written and closed through the mount, SIGKILL, restart: the bytes are there."""
    with public_tempdir("tierd-posix-kill-") as where:
        mnt, data = where / "mnt", where / "data"
        mnt.mkdir()
        d = start(data, mnt)
        try:
            (mnt / "durable").mkdir()
            body = os.urandom(3 << 20)
            (mnt / "durable" / "f").write_bytes(body)  # write + close
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait(10)
        finally:
            stop(d, mnt)
        d = start(data, mnt)  # the stale mount is cleared at start
        try:
            assert (mnt / "durable" / "f").read_bytes() == body
        finally:
            stop(d, mnt)
    assert "SIGKILL after close" in row("close / `fsync` durability")
