"""Hot data survives kill -9 at every step of replacing, removing, truncating or rewriting it.

The rule (docs/durability.md): bytes a committed version names are never destroyed before
the change that supersedes them is durable, and a file changed in place after its last
durable point gets a new version at start.  Each test runs the real daemon with its FUSE
mount and S3 door, puts an acknowledged old version in place, then does one operation and
kills the daemon with SIGKILL either at a named step inside it (``TIERD_CRASHPOINT``,
armed only for the operation) or right after the call returned.  After a restart the
file must be exactly one of the states the operation may leave -- read through FUSE and
S3, every read with a timeout -- with an ETag that is the MD5 of those bytes, and after
a persist (the admin API's) the cold store (``file://``) must hold the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .coldlib import Cold, Tierd

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse"),
]

BUCKET = "hotcrash"
OP_TIMEOUT = 30.0

OLD = os.urandom(256 << 10)  # FUSE files: written through the page cache, fsynced
NEW = os.urandom(100 << 10)
PATCH = os.urandom(64 << 10)  # written in place over the start of OLD
MIXED = PATCH + OLD[len(PATCH):]


class Node(Tierd):
    """One data directory and the daemon serving it (FUSE mount, S3 and admin doors, the
    cold store a ``file://`` directory), with a crash point armed per operation."""

    mnt: Path  # always mounted

    def __init__(self, base: Path) -> None:
        super().__init__(base, Cold("file", base), mount=True)
        # the daemon's own persist delay and import TTL: the old versions stay hot and
        # dirty until a test persists them
        for k in ("TIERD_PERSIST_DELAY", "TIERD_IMPORT_TTL"):
            del self.settings[k]
        self.mnt = base / "mnt"
        self.armed = base / "armed"

    def start(self, timeout: float = 60.0, crashpoint: str = "") -> Node:
        """Start the daemon; ``crashpoint`` makes it kill itself at that step once
        :meth:`arm` was called."""
        self.armed.unlink(missing_ok=True)
        self.settings.pop("TIERD_CRASHPOINT", None)
        if crashpoint:
            self.settings["TIERD_CRASHPOINT"] = f"{crashpoint}@{self.armed}"
        super().start(timeout)
        return self

    def arm(self) -> None:
        self.armed.touch()

    def died(self) -> None:
        """The daemon killed itself at its crash point (the test reached the step)."""
        assert self.proc is not None
        try:
            code = self.proc.wait(OP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise AssertionError("the crash point was never reached") from None
        self._unmount()
        assert code == -signal.SIGKILL, f"tierd exited with {code}, not by its crash point"

    # -- doors -----------------------------------------------------------------------------
    def s3(self, **config: Any) -> Any:
        return super().s3(connect_timeout=5, read_timeout=15, **config)

    def fuse(self, code: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        """Run ``code`` (Python, ``a`` = the arguments) in a child process: a FUSE call
        that hangs or fails must not take the test with it."""
        prog = f"import os, sys\na = sys.argv[1:]\n{code}"
        return subprocess.run([sys.executable, "-c", prog, *args], capture_output=True,
                              timeout=OP_TIMEOUT, stdin=subprocess.DEVNULL)

    def path(self, key: str) -> str:
        return str(self.mnt / BUCKET / key)

    def write_sync(self, key: str, data: bytes) -> None:
        src = self.base / "src"
        src.write_bytes(data)
        r = self.fuse("d = open(a[1], 'rb').read()\n"
                      "with open(a[0], 'wb') as f:\n"
                      "    f.write(d); f.flush(); os.fsync(f.fileno())",
                      self.path(key), str(src))
        assert r.returncode == 0, r.stderr.decode()

    def read_fuse(self, key: str) -> bytes | None:
        r = self.fuse("try:\n"
                      "    sys.stdout.buffer.write(open(a[0], 'rb').read())\n"
                      "except FileNotFoundError:\n"
                      "    sys.exit(3)", self.path(key))
        if r.returncode == 3:
            return None
        assert r.returncode == 0, r.stderr.decode()
        return r.stdout

    def read_s3(self, key: str) -> bytes | None:
        """The object's bytes; its ETag must be their MD5."""
        try:
            got = self.s3().get_object(Bucket=BUCKET, Key=key)
        except ClientError as e:
            assert e.response["Error"]["Code"] == "NoSuchKey", e
            return None
        body: bytes = got["Body"].read()
        assert len(body) == got["ContentLength"]
        assert got["ETag"].strip('"') == hashlib.md5(body).hexdigest(), (
            f"{key}: the ETag is not the MD5 of the bytes served")
        return body

    def persist(self, prefix: str) -> None:
        """Everything under ``prefix`` is in the cold store (the admin API that
        ``tierctl persist --wait`` calls; the CLI's own tests are in tests/cli/)."""
        doc = self.persist_wait(prefix, timeout=90.0)
        assert doc["persisted"], f"{prefix}: not persisted: {doc}"

    def evict(self, prefix: str) -> None:
        self.admin("POST", "/v1/placement/evict", {"prefix": prefix, "tier": "all"})

    def cold_bytes(self, key: str) -> bytes | None:
        p = self.cold.root / BUCKET / key
        return p.read_bytes() if p.exists() else None


def show(data: bytes | None) -> str:
    if data is None:
        return "absent"
    for name, v in (("OLD", OLD), ("NEW", NEW), ("MIXED", MIXED), ("PATCH", PATCH)):
        if data == v:
            return name
    return f"{len(data)} bytes ({data.count(0)} zero bytes)"


def verify(node: Node, key: str, allowed: list[bytes | None], evict: bool = False) -> bytes | None:
    """After the restart: FUSE and S3 agree on one allowed state, the ETag is right, and
    once persisted the cold store holds exactly those bytes (also after an eviction)."""
    got = node.read_fuse(key)
    assert got in allowed, (f"{key}: FUSE reads {show(got)}, expected one of "
                            f"{[show(a) for a in allowed]}")
    assert node.read_s3(key) == got, f"{key}: S3 and FUSE disagree"
    node.persist(f"{BUCKET}/")
    if got is not None:
        cold = node.cold_bytes(key)
        assert cold == got, f"{key}: cold holds {show(cold)}, not {show(got)}"
    if evict:
        node.evict(f"{BUCKET}/")
        assert node.read_fuse(key) == got, f"{key}: other bytes after an eviction"
        assert node.read_s3(key) == got
    return got


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.stop()
    text = n.log if n.log_path.exists() else ""  # every start's
    assert "bytes are lost" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def crash_during(node: Node, point: str, op: Any) -> None:
    """Run ``op`` with the crash point armed; the daemon must die there (with ``point``
    empty: SIGKILL as soon as ``op`` returned)."""
    node.arm()
    if point:
        with contextlib.suppress(Exception):
            op()
        node.died()
    else:
        op()
        node.kill9()


# -- FUSE ----------------------------------------------------------------------------------
GC_POINTS = ["gc.committed", "gc.durable", "gc.removed", ""]


@pytest.mark.parametrize("point", GC_POINTS)
def test_rename_over_an_fsynced_file(node: Node, point: str) -> None:
    node.start(crashpoint=point)
    (node.mnt / BUCKET).mkdir()
    node.write_sync("f", OLD)
    node.write_sync("tmp", NEW)
    crash_during(node, point, lambda: node.fuse("os.rename(a[0], a[1])",
                                                node.path("tmp"), node.path("f")))
    node.start()
    f = verify(node, "f", [OLD, NEW])
    verify(node, "tmp", [NEW] if f == OLD else [None])


@pytest.mark.parametrize("point", GC_POINTS)
def test_unlink_of_an_fsynced_file(node: Node, point: str) -> None:
    node.start(crashpoint=point)
    (node.mnt / BUCKET).mkdir()
    node.write_sync("f", OLD)
    crash_during(node, point, lambda: node.fuse("os.unlink(a[0])", node.path("f")))
    node.start()
    verify(node, "f", [OLD, None])


def test_open_unlinked_file_keeps_its_bytes_until_released(node: Node) -> None:
    """An orphan (unlinked while open) is read to its end, then reclaimed at release."""
    node.start()
    (node.mnt / BUCKET).mkdir()
    node.write_sync("f", OLD)
    r = node.fuse("fd = os.open(a[0], os.O_RDONLY)\n"
                  "os.unlink(a[0])\n"
                  "import time; time.sleep(0.3)\n"
                  "sys.stdout.buffer.write(os.pread(fd, 1 << 20, 0)); os.close(fd)",
                  node.path("f"))
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == OLD
    assert node.read_fuse("f") is None


@pytest.mark.parametrize("point", ["truncate.committed", "truncate.durable", "truncate.cut",
                                   "durable.synced", "durable.committed", ""])
def test_open_with_o_trunc_over_a_persisted_file(node: Node, point: str) -> None:
    """open(O_TRUNC), write, close over a file whose cold copy is good (the hot file is
    whole, so a lost truncate would be served as zeros without a word)."""
    node.start(crashpoint=point)
    (node.mnt / BUCKET).mkdir()
    node.write_sync("f", OLD)
    node.persist(f"{BUCKET}/")
    src = node.base / "new"
    src.write_bytes(NEW)
    crash_during(node, point, lambda: node.fuse(
        "d = open(a[1], 'rb').read()\nwith open(a[0], 'wb') as f: f.write(d)",
        node.path("f"), str(src)))
    node.start()
    verify(node, "f", [NEW] if not point else [OLD, b"", NEW], evict=True)


@pytest.mark.parametrize("point", ["write.intended", "write.done", "durable.synced",
                                   "durable.committed", ""])
def test_in_place_overwrite_of_a_persisted_file(node: Node, point: str) -> None:
    """pwrite over the start of a clean file: after the crash the content, its ETag and
    the cold copy agree, and an eviction never brings the old bytes back.  ``write.done``
    is a step of the WRITE path, which write passthrough (the default) skips: that case
    runs with it off; the others run on the default mount."""
    if point == "write.done":
        node.settings["TIERD_FUSE_PASSTHROUGH_WRITES"] = "false"
    node.start(crashpoint=point)
    (node.mnt / BUCKET).mkdir()
    node.write_sync("f", OLD)
    node.persist(f"{BUCKET}/")
    src = node.base / "patch"
    src.write_bytes(PATCH)
    crash_during(node, point, lambda: node.fuse(
        "fd = os.open(a[0], os.O_WRONLY)\n"
        "os.pwrite(fd, open(a[1], 'rb').read(), 0)\nos.close(fd)",
        node.path("f"), str(src)))
    node.start()
    verify(node, "f", [MIXED] if not point else [OLD, MIXED], evict=True)


def test_extending_truncate_reads_zeros_after_a_crash_left_a_tail(node: Node) -> None:
    """A crash between a shrink's durable commit and the cut leaves the old bytes past the
    new size; growing the file again must show zeros there, never those bytes."""
    node.start(crashpoint="truncate.durable")
    (node.mnt / BUCKET).mkdir()
    node.write_sync("f", OLD)
    crash_during(node, "truncate.durable",
                 lambda: node.fuse("os.truncate(a[0], 1000)", node.path("f")))
    node.start()
    assert node.read_fuse("f") == OLD[:1000]
    r = node.fuse("os.truncate(a[0], 5000)", node.path("f"))
    assert r.returncode == 0, r.stderr.decode()
    assert node.read_fuse("f") == OLD[:1000] + bytes(4000)
    assert node.read_s3("f") == OLD[:1000] + bytes(4000)


# -- S3 ------------------------------------------------------------------------------------
SIZES = {"small": 4 << 10, "large": 3 << 20}  # small PUTs are logged, large ones staged


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("point", ["put.committed", *GC_POINTS[:-1], "put.durable", ""])
def test_put_over_an_acknowledged_object(node: Node, point: str, size: str) -> None:
    old, new = os.urandom(SIZES[size]), os.urandom(SIZES[size] + 1)
    node.start(crashpoint=point)
    s3 = node.s3()
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="k", Body=old)
    crash_during(node, point, lambda: s3.put_object(Bucket=BUCKET, Key="k", Body=new))
    node.start()
    verify(node, "k", [new] if not point else [old, new])


@pytest.mark.parametrize("point", ["delete.committed", *GC_POINTS])
def test_delete_of_an_acknowledged_object(node: Node, point: str) -> None:
    node.start(crashpoint=point)
    s3 = node.s3()
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="k", Body=OLD)
    crash_during(node, point, lambda: s3.delete_object(Bucket=BUCKET, Key="k"))
    node.start()
    verify(node, "k", [None] if not point else [OLD, None])
