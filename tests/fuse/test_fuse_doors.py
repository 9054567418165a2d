"""One namespace, two doors: the mount and S3 see the same bytes without stale caches.

The kernel caches entries, attributes and pages of the mount for minutes; an S3 PUT or
DELETE must still be visible through the mount at once (the daemon invalidates the kernel's
cache), and a file written through the mount must read back through S3 with the MD5 ETag.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import pytest
from conftest import BUCKET, Daemon

pytestmark = pytest.mark.timeout(120)



def key_of(daemon: Daemon, path: Path) -> str:
    return str(path.relative_to(daemon.mnt / BUCKET))


def test_file_written_through_mount_reads_back_through_s3(
    daemon: Daemon, s3: Any, work: Path
) -> None:
    data = random.Random(1).randbytes((3 << 20) + 17)
    with open(work / "model.bin", "wb") as f:
        f.write(data)
    obj = s3.get_object(Bucket=BUCKET, Key=key_of(daemon, work / "model.bin"))
    assert obj["Body"].read() == data
    assert obj["ETag"].strip('"') == hashlib.md5(data).hexdigest()
    # out-of-order writes: the ETag is computed when S3 asks for it
    with open(work / "sparse.bin", "wb") as f:
        f.seek(1 << 20)
        f.write(b"tail")
        f.seek(0)
        f.write(b"head")
    body = (work / "sparse.bin").read_bytes()
    head = s3.head_object(Bucket=BUCKET, Key=key_of(daemon, work / "sparse.bin"))
    assert head["ETag"].strip('"') == hashlib.md5(body).hexdigest()
    assert head["ContentLength"] == len(body)


def test_s3_put_is_visible_through_mount_without_stale_cache(
    daemon: Daemon, s3: Any, work: Path
) -> None:
    key = key_of(daemon, work / "shard-0.bin")
    path = work / "shard-0.bin"
    assert not path.exists()  # the kernel now caches a negative entry for the name
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"version one")
    assert path.read_bytes() == b"version one"
    assert os.stat(path).st_size == 11  # attributes and page cache now hold version one
    ino1 = os.stat(path).st_ino
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"version two, longer")
    assert path.read_bytes() == b"version two, longer"
    assert os.stat(path).st_size == 19 and os.stat(path).st_ino != ino1
    assert "shard-0.bin" in os.listdir(work)
    # a file open through the mount keeps reading the bytes it opened (close-to-open)
    with open(path, "rb") as reader:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"version three")
        assert reader.read() == b"version two, longer"
    assert path.read_bytes() == b"version three"
    s3.delete_object(Bucket=BUCKET, Key=key)
    assert not path.exists()
    assert "shard-0.bin" not in os.listdir(work)


def test_s3_put_creates_directories_seen_by_the_mount(
    daemon: Daemon, s3: Any, work: Path
) -> None:
    base = key_of(daemon, work)
    assert not (work / "deep").exists()
    s3.put_object(Bucket=BUCKET, Key=f"{base}/deep/er/file.txt", Body=b"nested")
    assert (work / "deep" / "er" / "file.txt").read_bytes() == b"nested"
    s3.delete_object(Bucket=BUCKET, Key=f"{base}/deep/er/file.txt")
    # the implicit directories went with their last key, and the mount sees that too
    assert not (work / "deep").exists()
    assert os.listdir(work) == []


def test_listing_through_s3_matches_the_mount(daemon: Daemon, s3: Any, work: Path) -> None:
    for name in ("a", "a-b", "c/d", "c/e/f"):
        p = work / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(name.encode())
    base = key_of(daemon, work)
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{base}/")
    keys = [o["Key"][len(base) + 1:] for o in listed.get("Contents", [])]
    assert keys == ["a", "a-b", "c/d", "c/e/f"]
