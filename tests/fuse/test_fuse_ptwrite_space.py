"""Hot-tier space under write passthrough: the kernel writes the hot file itself, so no
write is admitted by the placement engine first and an ENOSPC goes straight to the
writer.  The door keeps headroom instead (``NamespaceAPI.passthrough_room``: clean data
evicted at a writable passthrough open and every few milliseconds while such a writer is
open), so a passthrough writer gets ENOSPC only when the WRITE path would: when nothing
clean is left to evict.

The hot tier is a real 64 MiB tmpfs; files are written by plain ``open``/``write``/
``fsync``/``close`` through the mount (the daemon's WRITE counter shows they were
passthrough) and read back through S3.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BUCKET, Daemon, s3_client, serving
from test_fuse_kernel import admin
from test_fuse_ptwrite import ARGS, writes

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="the kernel backend and tmpfs need root"),
]

MiB = 1 << 20
#: the writer's pace: 1 MiB per PACE seconds (50 MiB/s), well inside what the door keeps
#: up with on a 64 MiB tier (eviction starts below 16 MiB free and takes 6-40 ms here;
#: unpaced writers at ~500 MB/s outrun it about one time in four: docs/fuse.md)
PACE = 0.02


@pytest.fixture(scope="module")
def hot(public_tmp: Path) -> Iterator[Path]:
    where = public_tmp / "ptspace-hot"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(scope="module")
def daemon(public_tmp: Path, hot: Path) -> Iterator[Daemon]:
    """Passthrough writes on; the hot tier on the tmpfs; nothing persisted by itself (so
    what is written stays dirty until the admin API persists it)."""
    with serving(public_tmp, "pts", *ARGS, "--hot-dir", str(hot),
                 "--persist-delay", "3600") as d:
        yield d


def write_paced(path: Path, nbytes: int, fsync_every: int = 4 * MiB) -> tuple[int, int]:
    """Write ``nbytes`` of a known pattern through one descriptor, 1 MiB a write at
    :data:`PACE`, fsync every ``fsync_every``; returns (bytes fsynced -- acknowledged --,
    errno of the write that failed or 0).  The descriptor is closed either way."""
    block = bytes(range(256)) * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    done = synced = err = 0
    try:
        while done < nbytes:
            try:
                done += os.write(fd, block[done % MiB:][:nbytes - done])
            except OSError as e:
                err = e.errno or -1
                break
            if done % fsync_every == 0:
                os.fsync(fd)
                synced = done
            time.sleep(PACE)
    finally:
        try:
            os.close(fd)
        except OSError as e:
            err = err or (e.errno or -1)
    return synced, err


def pattern(n: int) -> bytes:
    block = bytes(range(256)) * 4096
    return (block * (n // MiB + 1))[:n]


def fs_free(p: Path) -> int:
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def stats(d: Daemon) -> dict[str, Any]:
    doc = admin(d, "GET", "/v1/status", {})
    return dict(doc["placement"]["stats"])


def test_clean_data_makes_room_then_dirty_data_is_enospc(daemon: Daemon, hot: Path) -> None:
    s3 = s3_client(daemon)
    blobs: dict[str, bytes] = {}
    for i in range(12):  # 48 MiB of the 64: clean once persisted
        k, data = f"fill/{i}", os.urandom(4 * MiB)
        s3.put_object(Bucket=BUCKET, Key=k, Body=data)
        blobs[k] = data
    admin(daemon, "POST", "/v1/placement/persist", {"prefix": f"{BUCKET}/fill",
                                                    "timeout": 120})
    free = fs_free(hot)
    assert free < 20 * MiB, free
    evicted = stats(daemon).get("write_evicted_bytes", 0)

    # more than the free space, through the kernel: clean data is evicted meanwhile
    before = writes(daemon)
    a = daemon.mnt / BUCKET / "a.bin"
    want_a = free + 16 * MiB - (free + 16 * MiB) % (4 * MiB)
    synced, err = write_paced(a, want_a)
    assert err == 0, (os.strerror(err), synced, free)
    assert writes(daemon) == before, "the writes reached the daemon: not passthrough"
    assert stats(daemon).get("write_evicted_bytes", 0) > evicted
    body = s3.get_object(Bucket=BUCKET, Key="a.bin")["Body"].read()
    assert body == pattern(want_a)
    for k, data in blobs.items():  # evicted ones come back from cold
        assert s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() == data, k

    # now only dirty data can fill the tier: the writer gets ENOSPC, as on the WRITE
    # path, and nothing it (or anyone) had acknowledged is lost
    b = daemon.mnt / BUCKET / "b.bin"
    synced, err = write_paced(b, 128 * MiB)
    assert err == errno.ENOSPC, (err, synced)
    assert writes(daemon) == before
    body = s3.get_object(Bucket=BUCKET, Key="b.bin")["Body"].read()
    assert len(body) >= synced
    assert body == pattern(len(body))
    etag = s3.head_object(Bucket=BUCKET, Key="b.bin")["ETag"].strip('"')
    assert etag == hashlib.md5(body).hexdigest()
    assert s3.get_object(Bucket=BUCKET, Key="a.bin")["Body"].read() == pattern(want_a)
    assert a.read_bytes() == pattern(want_a)
    # reading evicted data back needs room on hot too (507 while it is full of dirty
    # data, as without passthrough): a delete makes room, and every byte is there
    b.unlink()
    deadline = time.monotonic() + 30
    while fs_free(hot) < 8 * MiB:  # (its data file goes once the delete is durable)
        assert time.monotonic() < deadline, fs_free(hot)
        time.sleep(0.1)
    for k, data in blobs.items():
        assert s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() == data, k
