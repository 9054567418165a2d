"""Killpriv under write passthrough: a ``chmod u+s`` (or ``g+s`` with group execute) made
while a passthrough writer is open, then a write through that writer by a user without
CAP_FSETID, clears the bits as on ext4 -- although the write never reaches the daemon (the
kernel writes the hot file with the daemon's credentials and clears nothing itself).

Each scenario runs the same real programs on a directory of the local disk (ext4 on the
development machine) and on the mount, and compares the modes seen; the mount's writes
must have been passthrough (the daemon's WRITE counter did not move).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import BUCKET, Daemon, public_tempdir, serving
from test_fuse_ptwrite import ARGS, writes

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="the kernel backend's tests need root"),
]


@pytest.fixture(scope="module")
def daemon(public_tmp: Path) -> Iterator[Daemon]:
    with serving(public_tmp, "ptkp", *ARGS) as d:
        yield d


@pytest.fixture()
def local() -> Iterator[Path]:
    """A directory of the local disk every user can reach: the reference."""
    with public_tempdir("tierd-kp-real-") as path:
        path.chmod(0o777)
        yield path


# a writer that opens, waits, writes, waits, closes -- one step per line on stdin
_WRITER = r"""
import os, sys
path, uid = sys.argv[1], int(sys.argv[2])
if uid:
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
fd = os.open(path, os.O_WRONLY)
print("opened", flush=True)
sys.stdin.readline()
os.write(fd, b"x")
print("wrote", flush=True)
sys.stdin.readline()
os.close(fd)
print("closed", flush=True)
"""


class Writer:
    def __init__(self, path: Path, uid: int) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(uid)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.step("opened", first=True)

    def step(self, want: str, first: bool = False) -> None:
        assert self.p.stdin is not None and self.p.stdout is not None
        if not first:
            self.p.stdin.write("go\n")
            self.p.stdin.flush()
        got = self.p.stdout.readline().strip()
        assert got == want, (got, self.p.stderr)

    def close(self) -> None:
        self.p.kill()
        self.p.wait(30)


def mode(f: Path) -> int:
    return stat.S_IMODE(os.stat(f).st_mode)


@contextlib.contextmanager
def chmod_while_open(f: Path, uid: int, bits: int) -> Iterator[Writer]:
    """``f`` made (``0123``, mode 0777), ``uid``'s writer opened, then root (the owner)
    adds ``bits``; the writer is killed at the end if it still runs."""
    f.write_bytes(b"0123")
    f.chmod(0o777)
    w = Writer(f, uid)
    try:
        f.chmod(0o777 | bits)
        yield w
    finally:
        w.close()


def stat_while_open(f: Path, uid: int, bits: int) -> list[int]:
    """The writer's write; a stat while it is still open; its close; a stat."""
    with chmod_while_open(f, uid, bits) as w:
        seen = [mode(f)]
        w.step("wrote")
        seen.append(mode(f))
        w.step("closed")
        seen.append(mode(f))
    assert f.read_bytes() == b"x123"
    return seen


def no_look_until_closed(f: Path, uid: int, bits: int) -> list[int]:
    """As above, but nothing looks at the file between the write and the close."""
    with chmod_while_open(f, uid, bits) as w:
        w.step("wrote")
        w.step("closed")
    assert f.read_bytes() == b"x123"
    return [mode(f)]


def root_truncates(f: Path, uid: int, bits: int) -> list[int]:
    """Root truncates the file by path (a change of the hot file the daemon made
    itself, for a caller with CAP_FSETID: the bits stay) and root's fsync looks at the
    hot file; then the writer writes (they go)."""
    with chmod_while_open(f, uid, bits) as w:
        os.truncate(f, 2)
        fd = os.open(f, os.O_WRONLY)
        os.fsync(fd)
        os.close(fd)
        seen = [mode(f)]
        w.step("wrote")
        w.step("closed")
        seen.append(mode(f))
    assert f.read_bytes() == b"x1"
    return seen


CASES = [
    ("setuid, another user", stat_while_open, 65534, stat.S_ISUID),
    ("setgid with group exec, another user", stat_while_open, 65534, stat.S_ISGID),
    ("both, no look until the close", no_look_until_closed, 65534,
     stat.S_ISUID | stat.S_ISGID),
    ("setuid, root writes (CAP_FSETID)", stat_while_open, 0, stat.S_ISUID),
    ("setuid, root truncates, then another user writes", root_truncates, 65534,
     stat.S_ISUID),
]


@pytest.mark.parametrize(("name", "scenario", "uid", "bits"), CASES,
                         ids=[c[0] for c in CASES])
def test_chmod_while_a_passthrough_writer_is_open_then_a_write(
        daemon: Daemon, work: Path, local: Path, name: str,
        scenario: Callable[[Path, int, int], list[int]], uid: int, bits: int) -> None:
    real = scenario(local / "f.bin", uid, bits)
    before = writes(daemon)
    mnt = scenario(work / "f.bin", uid, bits)
    assert writes(daemon) == before, "the write reached the daemon: not passthrough"
    assert mnt == real, (name, [oct(m) for m in mnt], [oct(m) for m in real])
    if uid:
        assert real[-1] == 0o777  # (the reference did clear them)
    assert (daemon.mnt / BUCKET).exists()


def test_a_second_writer_joining_after_the_chmod(daemon: Daemon, work: Path,
                                                 local: Path) -> None:
    """Root's writer open, chmod u+s, then another user opens (it joins the passthrough
    backing file: the inode's I/O mode allows nothing else) and writes: cleared."""
    def run(f: Path) -> list[int]:
        f.write_bytes(b"0123")
        f.chmod(0o777)
        root = Writer(f, 0)
        try:
            f.chmod(0o4777)
            other = Writer(f, 65534)
            try:
                other.step("wrote")
                seen = [mode(f)]
                other.step("closed")
            finally:
                other.close()
            root.step("wrote")
            root.step("closed")
            seen.append(mode(f))
        finally:
            root.close()
        return seen

    real = run(local / "j.bin")
    before = writes(daemon)
    assert run(work / "j.bin") == real == [0o777, 0o777]
    assert writes(daemon) == before


# -- file capabilities: Linux removes security.capability at any write (root's too) -------------
CAPS = "security.capability"
#: a valid VFS_CAP_REVISION_2 value: CAP_NET_RAW permitted and effective
CAPS_VALUE = struct.pack("<5I", 0x02000001, 1 << 13, 0, 0, 0)


def caps_after_a_write(f: Path, set_while_open: bool) -> bool:
    """Whether ``f`` still has file capabilities after root wrote it through one
    descriptor; they are set before the open, or while it is open."""
    f.write_bytes(b"0123")
    if not set_while_open:
        os.setxattr(f, CAPS, CAPS_VALUE)
    fd = os.open(f, os.O_WRONLY)
    try:
        if set_while_open:
            os.setxattr(f, CAPS, CAPS_VALUE)
            assert os.getxattr(f, CAPS) == CAPS_VALUE
        os.write(fd, b"x")
    finally:
        os.close(fd)
    assert f.read_bytes() == b"x123"
    try:
        os.getxattr(f, CAPS)
    except OSError as e:
        assert e.errno == errno.ENODATA
        return False
    return True


@pytest.mark.parametrize("set_while_open", [False, True], ids=["set before", "set while open"])
def test_a_write_removes_file_capabilities(daemon: Daemon, work: Path, local: Path,
                                           set_while_open: bool) -> None:
    """A guard, not a fix: the kernel's passthrough write removes them itself
    (``backing_file_write_iter`` calls ``file_remove_privs`` on the FUSE file: a
    REMOVEXATTR reaches the daemon), unlike set-id bits under HANDLE_KILLPRIV_V2."""
    assert caps_after_a_write(local / "c.bin", set_while_open) is False  # ext4
    before = writes(daemon)
    assert caps_after_a_write(work / "c.bin", set_while_open) is False
    assert writes(daemon) == before, "the write reached the daemon: not passthrough"
