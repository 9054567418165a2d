"""Write passthrough on the kernel backend (``fuse_passthrough_writes``, fuse/kpass.py): a
writable open of a file whole on hot hands the hot file to the kernel, so WRITE requests
never reach the daemon; the daemon learns sizes at getattr/setattr/flush/fsync/release and
commits a new version there, under the namespace's in-place intention for as long as a
passthrough writer is open (``NamespaceAPI.passthrough_open``).

Each test drives real programs through a real mount and checks the bytes through S3 (at
once, after a restart, after a kill -9) -- and that the writes really were passthrough
(the daemon's WRITE request counter did not move), so a test cannot pass on the normal
path by accident.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BUCKET, Daemon, s3_client, serving, start_daemon, stop_daemon
from test_fuse_kernel import admin, fuse_reads

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="the kernel backend's tests need root"),
]

ARGS = ("--fuse-backend", "kernel", "--fuse-passthrough", "true",
        "--fuse-passthrough-writes", "true")


@pytest.fixture(scope="module")
def daemon(public_tmp: Path) -> Iterator[Daemon]:
    """This module's daemon: kernel backend, passthrough reads and writes."""
    with serving(public_tmp, "ptw", *ARGS) as d:
        yield d


def writes(d: Daemon) -> int:
    return fuse_reads(d, "write")


def key(f: Path, d: Daemon) -> str:
    return str(f.relative_to(d.mnt / BUCKET))


def get(s3: Any, k: str) -> tuple[bytes, str]:
    r = s3.get_object(Bucket=BUCKET, Key=k)
    return r["Body"].read(), r["ETag"].strip('"')


def test_writes_pass_through_and_s3_reads_them_at_once(daemon: Daemon, work: Path,
                                                       s3: Any) -> None:
    data = os.urandom(4 << 20) + b"tail"
    f = work / "new.bin"
    before = writes(daemon)
    with open(f, "wb", buffering=0) as w:
        for i in range(0, len(data), 1 << 20):
            w.write(data[i:i + (1 << 20)])
        assert os.fstat(w.fileno()).st_size == len(data)
        assert f.stat().st_size == len(data)  # a GETATTR while the writer is open
    assert writes(daemon) == before, "the writes reached the daemon"
    body, etag = get(s3, key(f, daemon))
    assert body == data
    assert etag == hashlib.md5(data).hexdigest()
    # an existing file rewritten in place (its committed bytes: the V intention first)
    with open(f, "r+b", buffering=0) as w:
        w.seek(100)
        w.write(b"X" * 10)
    assert writes(daemon) == before
    want = data[:100] + b"X" * 10 + data[110:]
    assert get(s3, key(f, daemon)) == (want, hashlib.md5(want).hexdigest())
    assert f.read_bytes() == want


def test_listings_and_lookups_while_writing_show_the_written_size(daemon: Daemon,
                                                                  work: Path) -> None:
    """READDIRPLUS and LOOKUP replies carry attributes the kernel applies: they must carry
    the size the kernel's own writes gave the file, not the namespace's last commit (the
    kernel would shrink its size back; before: a stat after a listing gave 0)."""
    f = work / "listed.bin"
    with open(f, "wb", buffering=0) as w:
        w.write(b"x" * 5000)
        assert {e.name: e.stat().st_size for e in os.scandir(work)} == {"listed.bin": 5000}
        assert f.stat().st_size == 5000
        os.stat(work / "listed.bin")  # a lookup too, through the path
        assert os.fstat(w.fileno()).st_size == 5000


def test_a_read_only_handle_cannot_write(daemon: Daemon, work: Path) -> None:
    f = work / "ro.bin"
    f.write_bytes(b"abc")
    with open(f, "rb", buffering=0) as r, open(f, "r+b", buffering=0) as w:
        with pytest.raises(OSError) as e:
            os.write(r.fileno(), b"zzz")
        assert e.value.errno == 9  # EBADF
        w.write(b"x")
    assert f.read_bytes() == b"xbc"


def test_mmap_writes(daemon: Daemon, work: Path, s3: Any) -> None:
    """A shared writable mapping of a passthrough writer maps the hot file: the stores
    are the file's bytes once msync'd and closed, through S3 too."""
    f = work / "mapped.bin"
    f.write_bytes(bytes(1 << 20))
    before = writes(daemon)
    with open(f, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as m:
        m[4096:4096 + 5] = b"hello"
        m[-3:] = b"end"
        m.flush()
    want = bytearray(1 << 20)
    want[4096:4101] = b"hello"
    want[-3:] = b"end"
    assert writes(daemon) == before
    assert f.read_bytes() == want
    assert get(s3, key(f, daemon))[0] == want


_LATE_MAP = r"""
import ctypes, mmap, os, sys, time
path, size = sys.argv[1], int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
fd = os.open(path, os.O_RDWR)
addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
assert addr not in (None, ctypes.c_void_p(-1).value)
os.close(fd)  # the mapping outlives the descriptor: the FUSE file's RELEASE may come now
print("closed", flush=True)
sys.stdin.readline()
ctypes.memmove(addr + 100, b"late", 4)
assert libc.msync(ctypes.c_void_p(addr), ctypes.c_size_t(size), 4) == 0  # MS_SYNC
assert libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size)) == 0
print("unmapped", flush=True)
"""


def test_a_shared_mapping_that_outlives_close(daemon: Daemon, work: Path, s3: Any) -> None:
    """C programs often close the descriptor right after mmap(): with passthrough the
    mapping then maps the hot file itself and the FUSE file's RELEASE comes at once, while
    stores through the mapping can still change the bytes.  The daemon must not settle a
    version (nor let an ETag be learned for it) while the hot file is still open for
    writing that way: after munmap, S3 gives the stored bytes under their own MD5."""
    size = 1 << 20
    f = work / "late.bin"
    f.write_bytes(bytes(size))
    p = subprocess.Popen([sys.executable, "-c", _LATE_MAP, str(f), str(size)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdin is not None and p.stdout is not None
    try:
        assert p.stdout.readline().strip() == "closed"
        time.sleep(0.5)  # the RELEASE is handled
        get(s3, key(f, daemon))  # an ETag asked for now would describe the bytes before
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "unmapped"
    finally:
        p.kill()
        p.wait(30)
    want = bytearray(size)
    want[100:104] = b"late"
    deadline = time.monotonic() + 10
    while True:
        body, etag = get(s3, key(f, daemon))
        if body == want and etag == hashlib.md5(want).hexdigest():
            break
        assert time.monotonic() < deadline, (body[100:104], etag)
        time.sleep(0.2)
    assert f.read_bytes() == want


_APPEND = r"""
import os, sys
path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
for i in range(n):
    os.write(fd, f"{tag}{i:06d}".encode().ljust(63, b".") + b"\n")
os.close(fd)
"""


def test_o_append_from_two_processes(daemon: Daemon, work: Path, s3: Any) -> None:
    """Both appenders are passthrough opens of one backing file: each write lands at the
    hot file's end (the kernel's O_APPEND on the backing file), none overwrites another."""
    f = work / "log.txt"
    f.write_bytes(b"")
    n = 2000
    before = writes(daemon)
    procs = [subprocess.Popen([sys.executable, "-c", _APPEND, str(f), t, str(n)])
             for t in "ab"]
    for p in procs:
        assert p.wait(120) == 0
    assert writes(daemon) == before
    for data in (f.read_bytes(), get(s3, key(f, daemon))[0]):
        lines = data.splitlines()
        assert len(lines) == 2 * n
        assert sorted(lines) == sorted(
            f"{t}{i:06d}".encode().ljust(63, b".") for t in "ab" for i in range(n))


def test_truncate_while_open(daemon: Daemon, work: Path, s3: Any) -> None:
    f = work / "trunc.bin"
    data = os.urandom(1 << 20)
    with open(f, "wb", buffering=0) as w:
        w.write(data)
        os.ftruncate(w.fileno(), 1000)  # SETATTR with the size: after writes it never saw
        assert f.stat().st_size == 1000
        w.seek(0, os.SEEK_END)
        w.write(b"more")
        os.truncate(f, 2000)  # by path, while open: grows with zeros
        w.seek(3000)
        w.write(b"z")
    want = data[:1000] + b"more" + bytes(996) + bytes(1000) + b"z"
    assert f.read_bytes() == want
    assert get(s3, key(f, daemon)) == (want, hashlib.md5(want).hexdigest())


def test_evicted_while_open_for_writing(daemon: Daemon, work: Path, s3: Any) -> None:
    """The kernel writes the hot file itself: an eviction while the writer is open must
    not drop its blocks (the open holds the inode); after the close, it goes through and
    the new bytes come back from cold."""
    data = os.urandom(2 << 20)
    f = work / "held.bin"
    f.write_bytes(data)
    prefix = f"{BUCKET}/{key(f, daemon)}"
    admin(daemon, "POST", "/v1/placement/persist", {"prefix": prefix, "timeout": 60})
    before = writes(daemon)
    with open(f, "r+b", buffering=0) as w:
        w.seek(1 << 20)
        w.write(b"Y" * 4096)
        held = admin(daemon, "POST", "/v1/placement/evict", {"prefix": prefix})
        assert held["tiers"]["hot"] == 0, held
        w.write(b"Z" * 4096)
        os.fsync(w.fileno())
    assert writes(daemon) == before
    want = data[:1 << 20] + b"Y" * 4096 + b"Z" * 4096 + data[(1 << 20) + 8192:]
    admin(daemon, "POST", "/v1/placement/persist", {"prefix": prefix, "timeout": 60})
    deadline = time.monotonic() + 5
    # the writer's RELEASE comes after its close, and may commit a version of its own after
    # the persist above: persist again until the eviction goes through
    while admin(daemon, "POST", "/v1/placement/evict", {"prefix": prefix})["tiers"][
            "hot"] == 0:
        assert time.monotonic() < deadline
        admin(daemon, "POST", "/v1/placement/persist", {"prefix": prefix, "timeout": 5})
        time.sleep(0.1)
    assert f.read_bytes() == want
    assert get(s3, key(f, daemon)) == (want, hashlib.md5(want).hexdigest())


_SETUID = r"""
import os, sys
path = sys.argv[1]
os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
fd = os.open(path, os.O_WRONLY)
os.write(fd, b"x")
os.close(fd)
"""


def test_killpriv_a_write_by_a_non_owner_clears_setuid(daemon: Daemon, work: Path) -> None:
    """Set-id files keep the normal write path (no write is seen otherwise), so the
    write of a user without CAP_FSETID clears setuid as on a local file system."""
    f = work / "suid.bin"
    f.write_bytes(b"0123")
    f.chmod(0o4777)
    r = subprocess.run([sys.executable, "-c", _SETUID, str(f)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(f.stat().st_mode) == 0o777
    assert f.read_bytes() == b"x123"


# -- restart and kill -9 -------------------------------------------------------------------------
@contextlib.contextmanager
def own_daemon(public_tmp: Path, name: str) -> Iterator[tuple[Daemon, Path]]:
    with serving(public_tmp, name, *ARGS) as d:
        w = d.mnt / BUCKET / "w"
        w.mkdir()
        yield d, w


def restart(d: Daemon, sig: int) -> Daemon:
    stop_daemon(d, sig)
    return start_daemon(d.data_dir, d.mnt, d.log_path, *ARGS)


_WRITER = r"""
import os, sys, time
path, fsynced = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
block = bytes(range(256)) * 4096  # 1 MiB
for i in range(fsynced):
    os.write(fd, block)
os.fsync(fd)
print("synced", flush=True)
try:
    while True:  # unacknowledged writes, slowly (they go on after the daemon died)
        os.write(fd, b"U" * (1 << 16))
        time.sleep(0.01)
except OSError:
    pass
"""


def test_kill_9_during_a_passthrough_write(public_tmp: Path) -> None:
    """An fsynced prefix survives a kill -9 of the daemon in the middle of passthrough
    writes and reads back exact; a file closed before it is whole; a file rewritten in
    place under the intention gets a new version whose ETag is its bytes' MD5 (never the
    old version's over new bytes)."""
    with own_daemon(public_tmp, "ptk") as (d, w):
        closed = os.urandom(3 << 20)
        (w / "closed.bin").write_bytes(closed)
        inplace = w / "inplace.bin"
        inplace.write_bytes(os.urandom(1 << 20))
        s3 = s3_client(d)
        old_etag = get(s3, "w/inplace.bin")[1]
        rewriter = open(inplace, "r+b", buffering=0)  # noqa: SIM115 - dies with the daemon
        rewriter.write(b"R" * 8192)  # never acknowledged: no fsync, no close
        p = subprocess.Popen([sys.executable, "-c", _WRITER, str(w / "big.bin"), "8"],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "synced"
        time.sleep(0.3)  # unacknowledged passthrough writes going on
        d2 = restart(d, signal.SIGKILL)
        try:
            s3 = s3_client(d2)
            body, _ = get(s3, "w/big.bin")
            synced = bytes(range(256)) * 4096 * 8
            assert len(body) >= len(synced)
            assert body[:len(synced)] == synced
            assert get(s3, "w/closed.bin") == (closed, hashlib.md5(closed).hexdigest())
            body, etag = get(s3, "w/inplace.bin")
            assert etag == hashlib.md5(body).hexdigest()
            assert etag != old_etag or not body.startswith(b"R" * 8192)
            # The kernel lets both writers go on after their daemon died (a backing file
            # outlives the FUSE connection): their writes must not reach the bytes the
            # new daemon's versions name (the start gave those files data files of their
            # own)
            rewriter.seek(0)
            rewriter.write(b"Z" * 8192)
            rewriter.flush()
            time.sleep(0.3)
            assert get(s3, "w/inplace.bin") == (body, etag)
            assert (d2.mnt / BUCKET / "w" / "inplace.bin").read_bytes() == body
            big = (d2.mnt / BUCKET / "w" / "big.bin").read_bytes()
            assert big == get(s3, "w/big.bin")[0]
            assert big[:len(synced)] == synced
        finally:
            p.kill()
            p.wait(60)
            with contextlib.suppress(OSError):
                rewriter.close()
            stop_daemon(d2)


def test_written_bytes_read_through_s3_after_a_restart(public_tmp: Path) -> None:
    with own_daemon(public_tmp, "ptr") as (d, w):
        data = os.urandom(5 << 20)
        before = writes(d)
        with open(w / "f.bin", "wb", buffering=0) as f:
            f.write(data)
        assert writes(d) == before
        d2 = restart(d, signal.SIGTERM)
        try:
            assert get(s3_client(d2), "w/f.bin") == (data, hashlib.md5(data).hexdigest())
            assert (d2.mnt / BUCKET / "w" / "f.bin").read_bytes() == data
        finally:
            stop_daemon(d2)


def test_s3_put_while_a_passthrough_writer_is_open(daemon: Daemon, work: Path,
                                                   s3: Any) -> None:
    """An S3 PUT over the key gives it a new inode: the open writer goes on writing the
    old one (passthrough, no WRITE reaches the daemon), whose bytes never show under the
    key; the next open through the mount and S3 both give the PUT's bytes."""
    f = work / "crossed.bin"
    f.write_bytes(b"old" * 1000)
    put = os.urandom(70000)
    before = writes(daemon)
    with open(f, "r+b", buffering=0) as w:
        w.write(b"W" * 5000)
        s3.put_object(Bucket=BUCKET, Key=key(f, daemon), Body=put)
        w.write(b"V" * 5000)
        os.fsync(w.fileno())
    assert writes(daemon) == before
    assert get(s3, key(f, daemon)) == (put, hashlib.md5(put).hexdigest())
    assert f.read_bytes() == put


def test_s3_reads_while_a_passthrough_writer_is_open(daemon: Daemon, work: Path,
                                                     s3: Any) -> None:
    """An S3 GET while the kernel writes the file in place: the ETag it is given is the
    MD5 of the bytes it is given (the namespace looks at the hot file first and makes what
    the kernel wrote a version of its own), never the committed version's ETag over
    rewritten bytes."""
    f = work / "busy.bin"
    data = os.urandom(1 << 20)
    f.write_bytes(data)
    k = key(f, daemon)
    assert get(s3, k) == (data, hashlib.md5(data).hexdigest())
    before = writes(daemon)
    with open(f, "r+b", buffering=0) as w:
        for i in range(3):
            w.seek(4096 * i)
            w.write(bytes([65 + i]) * 4096)
            body, etag = get(s3, k)
            assert etag == hashlib.md5(body).hexdigest(), i
            assert body[4096 * i:4096 * (i + 1)] == bytes([65 + i]) * 4096
    assert writes(daemon) == before
    want = b"A" * 4096 + b"B" * 4096 + b"C" * 4096 + data[3 * 4096:]
    assert get(s3, k) == (want, hashlib.md5(want).hexdigest())


def test_a_writer_kept_open_is_persisted_at_each_fsync(daemon: Daemon, work: Path,
                                                       s3: Any) -> None:
    """A log or checkpoint kept open across fsyncs reaches the cold store after each fsync,
    as on the WRITE path, not only at its last close (the persister treats a kernel
    writer whose hot file did not change since its last durability point as settled:
    namespace/base.py ``_open_unsettled``).  Bytes written after the fsync are not
    uploaded until the next durability point, and eviction still leaves the file alone."""
    f = work / "kept-open.log"
    k = key(f, daemon)
    prefix = f"{BUCKET}/{k}"
    cold = daemon.data_dir / "cold" / BUCKET / k
    first, second, third = os.urandom(300_000), os.urandom(70_000), os.urandom(5_000)
    before = writes(daemon)
    with open(f, "wb", buffering=0) as w:
        w.write(first)
        os.fsync(w.fileno())
        done = admin(daemon, "POST", "/v1/placement/persist", {"prefix": prefix, "timeout": 8})
        assert done["persisted"], f"an fsynced file kept open was not persisted: {done}"
        assert cold.read_bytes() == first
        assert get(s3, k) == (first, hashlib.md5(first).hexdigest())
        w.write(second)
        os.fsync(w.fileno())
        done = admin(daemon, "POST", "/v1/placement/persist", {"prefix": prefix, "timeout": 8})
        assert done["persisted"], done
        assert cold.read_bytes() == first + second
        w.write(third)  # not yet a durability point: cold keeps what the fsync made
        time.sleep(0.3)
        assert cold.read_bytes() == first + second
        held = admin(daemon, "POST", "/v1/placement/evict", {"prefix": prefix})
        assert held["tiers"]["hot"] == 0, held  # the kernel may still write it
    assert writes(daemon) == before, "the writes reached the daemon"
    whole = first + second + third
    done = admin(daemon, "POST", "/v1/placement/persist", {"prefix": prefix, "timeout": 30})
    assert done["persisted"], done
    assert cold.read_bytes() == whole
    assert get(s3, k) == (whole, hashlib.md5(whole).hexdigest())
