"""The kernel's I/O modes under passthrough (fuse/kpass.py): while an inode has a
passthrough open, every other open of it must be passthrough too, so a writer the daemon
must see (the namespace refuses to let the kernel write it) would wait for the readers and
fail ``ETXTBSY``.  With write passthrough on, a read-only open therefore passes through
only where a writer could too; these tests drive the shapes a user of ext4 takes for
granted -- ``cat f; echo x >> f`` and a long-lived reader beside a writer -- on the files
whose writers keep the WRITE path: set-id files and every file of a cluster node.  Each
failed before (the writer got ``ETXTBSY`` after 2 s).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BUCKET, Daemon, run, serving
from test_fuse_kernel import fuse_reads
from test_fuse_ptwrite import ARGS

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="the kernel backend's tests need root"),
]

@pytest.fixture(scope="module")
def daemon(public_tmp: Path) -> Iterator[Daemon]:
    with serving(public_tmp, "ptm", *ARGS) as d:
        yield d


def _scenarios(d: Path, mode: int) -> list[bytes]:
    """The same steps on a mount's directory or a local one: what each reader saw and
    what the file held.  Raises what the writer's open raised (ETXTBSY before the fix)."""
    f = d / "f"
    f.write_bytes(b"first\n")
    os.chmod(f, mode)
    seen: list[bytes] = []
    # cat f; echo x >> f (the reader's RELEASE comes after its close)
    seen.append(subprocess.run(["cat", str(f)], check=True, capture_output=True,
                               timeout=30).stdout)
    t0 = time.monotonic()
    subprocess.run(["sh", "-c", f"echo x >> '{f}'"], check=True, timeout=30)
    assert time.monotonic() - t0 < 1.5, "the writer waited for a reader"
    # a long-lived reader (tail -f) beside a writer
    with open(f, "rb") as reader:
        seen.append(reader.read())
        t0 = time.monotonic()
        with open(f, "ab") as w:
            w.write(b"appended\n")
        assert time.monotonic() - t0 < 1.5, "the writer waited for a reader"
        seen.append(reader.read())  # the appended line, read on from where it stopped
        with open(f, "r+b") as rw:  # a read-write open beside it
            rw.seek(0)
            rw.write(b"F")
        reader.seek(0)
        seen.append(reader.read())
    seen.append(f.read_bytes())
    seen.append(oct(os.stat(f).st_mode & 0o7777).encode())
    return seen


def _local(mode: int) -> list[bytes]:
    with tempfile.TemporaryDirectory() as t:
        return _scenarios(Path(t), mode)


def test_a_set_id_file_read_and_written_as_on_ext4(daemon: Daemon, work: Path) -> None:
    """A set-id file's writers keep the WRITE path (the set-id bits are the daemon's to
    clear), so its readers must not pass through: the writer opens at once."""
    assert _scenarios(work, 0o4755) == _local(0o4755)


def test_a_plain_file_is_still_read_through_the_kernel(daemon: Daemon, work: Path) -> None:
    """The rule refuses only what it must: a plain file's reader and writer both pass
    through (no READ and no WRITE reaches the daemon) and behave as on ext4."""
    f = work / "warm"
    f.write_bytes(b"x" * (1 << 20))
    reads, writes = fuse_reads(daemon, "read"), fuse_reads(daemon, "write")
    assert f.read_bytes() == b"x" * (1 << 20)
    assert _scenarios(work, 0o644) == _local(0o644)
    assert fuse_reads(daemon, "read") == reads
    assert fuse_reads(daemon, "write") == writes


def test_a_set_id_file_is_read_through_the_daemon(daemon: Daemon, work: Path) -> None:
    """The other side of the first test: its reads do reach the daemon (so it is the rule
    that made the writer's open succeed, not a reader's timing)."""
    f = work / "suid"
    f.write_bytes(b"y" * 4096)
    os.chmod(f, 0o4755)
    time.sleep(0.5)  # the writer's RELEASE (after its close) ends its backing file
    reads = fuse_reads(daemon, "read")
    with open(f, "rb") as r:
        assert r.read() == b"y" * 4096
    assert fuse_reads(daemon, "read") > reads


_NOBODY_APPENDS = """
import os, sys
os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
with open(sys.argv[1], "ab") as w:
    w.write(b"by nobody\\n")
"""


def _chmod_while_read(d: Path) -> list[bytes]:
    """A plain file's reader is open (through the kernel, on the mount) when the file gets
    set-id bits; then root appends, then another user does: what the reader saw and the
    mode after each writer, and the whole file read again through the same reader."""
    f = d / "c"
    f.write_bytes(b"first\n")
    os.chmod(f, 0o777)
    time.sleep(0.3)  # the writer's RELEASE (after its close) ends its backing file
    seen: list[bytes] = []
    with open(f, "rb") as reader:
        seen.append(reader.read())
        os.chmod(f, 0o4777)
        for cmd in (["sh", "-c", f"echo root >> '{f}'"],
                    [sys.executable, "-c", _NOBODY_APPENDS, str(f)]):
            t0 = time.monotonic()
            subprocess.run(cmd, check=True, timeout=30)
            assert time.monotonic() - t0 < 1.5, "the writer waited for the reader"
            seen.append(reader.read())
            seen.append(oct(os.stat(f).st_mode & 0o7777).encode())
        reader.seek(0)
        seen.append(reader.read())
    return seen


def test_set_id_bits_set_while_a_reader_is_open(daemon: Daemon, work: Path) -> None:
    """Set-id bits set while a passthrough reader holds the file: a writer must still pass
    through (the kernel lets nothing else in), so it joins, and the daemon clears the bits
    after another user's write as for a chmod made while writers are open (before: the
    writer waited 2 s for the reader and got ``ETXTBSY``).  Root's append keeps them, as on
    ext4."""
    reads = fuse_reads(daemon, "read")
    got = _chmod_while_read(work)
    assert fuse_reads(daemon, "read") == reads, "the reader was not passthrough"
    with tempfile.TemporaryDirectory() as t:
        os.chmod(t, 0o755)
        assert got == _chmod_while_read(Path(t))


def _tierctl(daemon: Daemon, *args: str) -> str:
    return run([sys.executable, "-m", "tierd_client.tierctl", "--data-dir",
                str(daemon.data_dir), *args]).stdout


def test_a_memory_tier_policy_set_while_a_reader_is_open(daemon: Daemon, work: Path) -> None:
    """A memory-tier file's writers keep the WRITE path, so its readers do not pass
    through; but a reader opened before the policy was set does, and then the writer joins
    its backing file (before: it waited 2 s for the reader and got ``ETXTBSY``).  The
    reader and the file see what they would on ext4, and once the handles are gone the new
    version is the one the pool holds."""
    import json

    f = work / "m"
    f.write_bytes(b"first\n")
    time.sleep(0.3)  # the writer's RELEASE (after its close) ends its backing file
    reads = fuse_reads(daemon, "read")
    seen: list[bytes] = []
    prefix = f"{BUCKET}/{work.name}/"
    try:
        with open(f, "rb") as reader:
            seen.append(reader.read())
            _tierctl(daemon, "policy", "set", prefix, "--tier", "mem")
            t0 = time.monotonic()
            with open(f, "ab") as w:
                w.write(b"appended\n")
            assert time.monotonic() - t0 < 1.5, "the writer waited for the reader"
            seen.append(reader.read())
        assert fuse_reads(daemon, "read") == reads, "the reader was not passthrough"
        assert seen == [b"first\n", b"appended\n"]
        assert f.read_bytes() == b"first\nappended\n"
        ino, size = os.stat(f).st_ino, os.stat(f).st_size

        def regions() -> dict[str, int]:
            doc = json.loads(_tierctl(daemon, "pool", "status", "--json"))
            return {r["name"]: r["size"] for r in doc["region_list"]}
        deadline = time.monotonic() + 30
        while regions().get(f"mem:{ino}") != size:
            _tierctl(daemon, "persist", prefix, "--wait")
            assert time.monotonic() < deadline, regions()
            time.sleep(0.2)
        assert f.read_bytes() == b"first\nappended\n"  # (now through the daemon, the pool)
    finally:
        _tierctl(daemon, "policy", "set", prefix, "--tier", "hot")


def test_a_cluster_node_s_files_read_and_written_as_on_ext4(tmp_path: Path) -> None:
    """On a cluster node no writer passes through (other nodes learn of changes from
    commits), so no reader does: ``cat f; echo x >> f`` and a reader beside a writer work
    as on ext4 (before: ``ETXTBSY`` after 2 s)."""
    from cluster.clusterlib import running_cluster
    from meta.pg_server import PgServer, find_bindir
    from moto_server import running_moto

    bindir = find_bindir()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed")
        pytest.skip("PostgreSQL is not installed")
    pg = PgServer(bindir, fsync=False)
    try:
        with running_moto() as moto, running_cluster(
                tmp_path, pg, moto, 1, TIERD_FUSE_PASSTHROUGH="true",
                TIERD_FUSE_PASSTHROUGH_WRITES="true") as cluster:
            node = cluster[1]
            bucket = node.path("ptmodes")
            with contextlib.suppress(FileExistsError):
                bucket.mkdir()
            work = bucket / "w"
            work.mkdir()
            assert _scenarios(work, 0o644) == _local(0o644)
    finally:
        pg.stop()
