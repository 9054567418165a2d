"""The kernel-protocol FUSE backend (``fuse_backend = kernel``, tierd_fuse.kdev) in the normal
suite: a few core tests of the other modules run again against a daemon that speaks the
FUSE protocol itself (with passthrough on), plus what only this backend does -- read-only
passthrough of hot files, the writer rule that comes with it, and invalidations written to
the device.  The whole FUSE suite runs on this backend by default, and on pyfuse3 with
``TIERD_FUSE_BACKEND=pyfuse3`` (tests/fuse/conftest.py).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BUCKET, Daemon, serving
from core_tests import *  # noqa: F403  (the core tests, run again on this backend)
from core_tests import overwrite_and_read
from public_dir import public_tempdir

pytestmark = [
    pytest.mark.timeout(180),
    # mount(2) and FUSE_DEV_IOC_BACKING_OPEN need root, as do the other users' tests
    pytest.mark.skipif(os.geteuid() != 0, reason="the kernel backend's tests need root"),
]


@pytest.fixture(scope="module")
def daemon(public_tmp: Path) -> Iterator[Daemon]:
    """This module's own daemon, on the kernel backend with passthrough (overrides the
    session's: every fixture built on ``daemon`` here uses it)."""
    with serving(public_tmp, "k", "--fuse-backend", "kernel",
                 "--fuse-passthrough", "true",
                 # the read-only rules, whatever the suite's TIERD_FUSE_PASSTHROUGH_WRITES
                 "--fuse-passthrough-writes", "false") as d:
        yield d


def admin(d: Daemon, method: str, path: str, doc: dict[str, Any]) -> Any:
    """An admin API call with the operator token."""
    ep = d.endpoints()["admin"]
    assert isinstance(ep, dict)
    token = (d.data_dir / "admin-token").read_text().strip()
    req = urllib.request.Request(f"{ep['url']}{path}", method=method,
                                 data=json.dumps(doc).encode(),
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def fuse_reads(d: Daemon, op: str = "read") -> int:
    """``op`` requests (READ unless told) the daemon answered so far, whatever their
    outcome (its Prometheus counter)."""
    ep = d.endpoints()["admin"]
    assert isinstance(ep, dict)
    token = (d.data_dir / "read-token").read_text().strip()
    req = urllib.request.Request(f"{ep['url']}/metrics",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    pattern = (r'tierd_requests_total\{door="fuse",operation="' + op
               + r'",status="\w+"\} (\S+)')
    return sum(int(float(n)) for n in re.findall(pattern, text))


def test_the_mount_is_served_by_the_kernel_backend(daemon: Daemon) -> None:
    assert "backend=kernel" in daemon.log
    st = os.statvfs(daemon.mnt)
    assert st.f_namemax == 255


def test_passthrough_reads_never_reach_the_daemon(daemon: Daemon, work: Path, s3: Any) -> None:
    """A file put through S3 (no page of it in the mount's cache) read through the mount:
    passthrough serves it from the hot file, no READ request; the same bytes."""
    data = os.urandom(3 << 20)
    key = f"{work.name}/put.bin"
    s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    before = fuse_reads(daemon)
    got = (work / "put.bin").read_bytes()
    assert hashlib.md5(got).hexdigest() == hashlib.md5(data).hexdigest()
    assert fuse_reads(daemon) == before
    assert "FUSE passthrough is off" not in daemon.log


def test_a_file_open_for_writing_is_read_through_the_daemon(daemon: Daemon, work: Path,
                                                            s3: Any) -> None:
    """While a writer holds the file (cached mode), a reader is not passthrough: its reads
    are READ requests and see the writer's bytes (the control of the test above)."""
    key = f"{work.name}/w.bin"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"x" * (1 << 20))
    with open(work / "w.bin", "r+b") as w:
        w.write(b"y" * 4096)
        w.flush()
        before = fuse_reads(daemon)
        with open(work / "w.bin", "rb", buffering=0) as r:
            os.posix_fadvise(r.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            head = r.read(8192)
    assert head == b"y" * 4096 + b"x" * 4096
    assert fuse_reads(daemon) > before


def test_a_writer_waits_for_passthrough_readers_then_gets_etxtbsy(daemon: Daemon,
                                                                   work: Path) -> None:
    f = work / "busy"
    f.write_bytes(b"content")
    with open(f, "rb") as reader:
        assert reader.read() == b"content"
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            open(f, "r+b").close()
        assert e.value.errno == 26  # ETXTBSY
        assert time.monotonic() - t0 >= 1.5  # it waited for the readers first
    # the reader's RELEASE arrives after close(2): a writer now gets in
    deadline = time.monotonic() + 5
    while True:
        try:
            with open(f, "r+b") as w:
                w.write(b"C")
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert f.read_bytes() == b"Content"


def test_a_reader_closing_right_before_a_writer_opens(daemon: Daemon, work: Path) -> None:
    """``cat f; echo >> f``: the reader's RELEASE comes asynchronously after its close, so
    the writer's OPEN may arrive first; it waits instead of failing."""
    f = work / "log"
    f.write_bytes(b"a\n")
    for i in range(20):
        r = subprocess.run(["sh", "-c", f'cat "{f}" >/dev/null && echo {i} >> "{f}"'],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    assert f.read_text().splitlines() == ["a", *map(str, range(20))]


def test_s3_overwrite_is_seen_by_the_next_open(daemon: Daemon, work: Path, s3: Any) -> None:
    """Entry and inode invalidations written to /dev/fuse (FUSE_NOTIFY_INVAL_*): a PUT over a
    file the kernel has cached is read back new by the next open."""
    f = work / "over"
    f.write_bytes(b"old contents")
    assert f.read_bytes() == b"old contents"
    s3.put_object(Bucket=BUCKET, Key=f"{work.name}/over", Body=b"new!")
    deadline = time.monotonic() + 5
    while f.read_bytes() != b"new!":
        assert time.monotonic() < deadline, f.read_bytes()
        time.sleep(0.05)
    assert f.stat().st_size == 4


def test_a_passthrough_file_is_not_evicted_while_open(daemon: Daemon, work: Path) -> None:
    """The kernel reads a passthrough file's hot blocks itself: an eviction while it is
    open would punch them and the reader would get zeros.  The open holds the inode; once
    released, the same eviction goes through, and the file reads back from cold."""
    data = os.urandom(2 << 20)
    f = work / "held.bin"
    f.write_bytes(data)
    prefix = f"{BUCKET}/{work.name}/held.bin"
    admin(daemon, "POST", "/v1/placement/persist", {"prefix": prefix, "timeout": 60})
    with open(f, "rb", buffering=0) as r:
        assert r.read(4096) == data[:4096]
        held = admin(daemon, "POST", "/v1/placement/evict", {"prefix": prefix})
        assert held["tiers"]["hot"] == 0, held
        assert r.read() == data[4096:]
    deadline = time.monotonic() + 5
    while True:  # the reader's RELEASE comes after its close
        done = admin(daemon, "POST", "/v1/placement/evict", {"prefix": prefix})
        if done["tiers"]["hot"] > 0:
            break
        assert time.monotonic() < deadline, done
        time.sleep(0.1)
    assert hashlib.md5(f.read_bytes()).digest() == hashlib.md5(data).digest()


def test_mmap_of_a_passthrough_file_reads_the_hot_file(daemon: Daemon, work: Path,
                                                       s3: Any) -> None:
    """A read-only mapping of a passthrough open maps the hot file's pages (the kernel's
    passthrough mmap): page faults are no READ requests, and the bytes are the object's."""
    data = os.urandom(1 << 20)
    s3.put_object(Bucket=BUCKET, Key=f"{work.name}/mapped.bin", Body=data)
    before = fuse_reads(daemon)
    with open(work / "mapped.bin", "rb") as f, mmap.mmap(f.fileno(), 0,
                                                          prot=mmap.PROT_READ) as m:
        assert m[:] == data
    assert fuse_reads(daemon) == before


def test_s3_overwrites_are_seen_at_once_through_the_kernel_backend(daemon: Daemon, work: Path,
                                                                   s3: Any) -> None:
    """As on pyfuse3 (test_fuse_pyfuse3.overwrite_and_read): a stale cached entry after an
    S3 overwrite costs the kernel a fresh lookup (ESTALE), never an ENOENT."""
    overwrite_and_read(daemon, work, s3)


_WRITE_AS = r"""
import os, stat, sys
path, uid, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_WRONLY)  # opened by root when uid is not 0
if uid:
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
block = os.urandom(1 << 16)
for _ in range(n):
    os.write(fd, block)
print(oct(stat.S_IMODE(os.fstat(fd).st_mode)))
"""


def _write_as(f: Path, uid: int, n: int) -> str:
    r = subprocess.run([sys.executable, "-c", _WRITE_AS, str(f), str(uid), str(n)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_writes_ask_no_security_capability_each_time(daemon: Daemon, work: Path) -> None:
    """HANDLE_KILLPRIV_V2 (with it the kernel marks the super block SB_NOSEC): a file
    without set-id bits is checked for ``security.capability`` once, not before every
    WRITE (before: one GETXATTR round trip per write).  A user without CAP_FSETID writing
    through a descriptor root opened still clears setuid and setgid-with-group-exec, as
    on a local file system (the WRITE carries WRITE_KILL_SUIDGID; no killpriv chmod)."""
    n = 32
    plain = work / "plain.bin"
    plain.write_bytes(b"")
    before = fuse_reads(daemon, "getxattr")
    assert _write_as(plain, 0, n) == "0o644"
    assert fuse_reads(daemon, "getxattr") - before <= 2

    with public_tempdir("tierd-killpriv-") as local:
        answers = []
        for d in (work, local):
            f = d / "setid.bin"
            f.write_bytes(b"x")
            os.chmod(f, 0o6775)
            before = fuse_reads(daemon, "getxattr")
            answers.append(_write_as(f, 3000, n))
            if d == work:
                assert fuse_reads(daemon, "getxattr") - before < n // 2
    assert answers[0] == answers[1] == "0o775", answers
