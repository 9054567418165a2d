"""What only the file:// engine has: atomic installs, the ETag xattr, staying inside the
root, ``a`` vs ``a/b`` conflicts, housekeeping."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from tierd.tiers import (
    FileObjectTier,
    KeyConflict,
    KeyRejected,
    ObjectNotFound,
    open_object_tier,
)
from tierd.tiers.file_tier import TMP_DIR

from .conftest import pattern


def src(tmp_path: Path, data: bytes, name: str = "src") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


@pytest.fixture
def tier(tmp_path: Path) -> FileObjectTier:
    t = open_object_tier(str(tmp_path / "cold"))  # a plain path means file://
    assert isinstance(t, FileObjectTier)
    return t


async def test_objects_are_plain_files(tier: FileObjectTier, tmp_path: Path) -> None:
    await tier.put_file("bkt/a/b.txt", src(tmp_path, b"hello"), 5)
    assert (tmp_path / "cold" / "bkt" / "a" / "b.txt").read_bytes() == b"hello"
    assert tier.path("bkt/a/b.txt") == str(tmp_path / "cold" / "bkt" / "a" / "b.txt")
    assert os.listdir(tmp_path / "cold" / TMP_DIR) == []  # nothing left staged
    await tier.close()


async def test_failed_put_leaves_old_object_and_no_temp(tier: FileObjectTier,
                                                        tmp_path: Path) -> None:
    await tier.put_file("bkt/k", src(tmp_path, b"old"), 3)
    with pytest.raises(OSError):
        await tier.put_file("bkt/k", src(tmp_path, b"short", "s2"), 1000)
    assert await tier.get_range("bkt/k", 0, 10) == b"old"
    assert os.listdir(tmp_path / "cold" / TMP_DIR) == []


async def test_etag_xattr_and_outside_changes(tier: FileObjectTier, tmp_path: Path) -> None:
    info = await tier.put_file("bkt/k", src(tmp_path, b"content"), 7)
    assert len(info.etag) == 32
    # someone edits the file in place: the recorded MD5 no longer applies
    path = tmp_path / "cold" / "bkt" / "k"
    time.sleep(0.01)
    path.write_bytes(b"edited!")
    head = await tier.head("bkt/k")
    assert head is not None and head.etag != info.etag and "-" in head.etag
    time.sleep(0.01)
    path.write_bytes(b"edited again")
    head2 = await tier.head("bkt/k")
    assert head2 is not None and head2.etag != head.etag


async def test_copy_keeps_md5_etag(tier: FileObjectTier, tmp_path: Path) -> None:
    info = await tier.put_file("bkt/k", src(tmp_path, pattern(3 << 20)), 3 << 20)
    copied = await tier.copy("bkt/k", "bkt2/k")
    assert copied.etag == info.etag
    head = await tier.head("bkt2/k")
    assert head is not None and head.etag == info.etag


async def test_a_and_a_slash_b_conflict(tier: FileObjectTier, tmp_path: Path) -> None:
    await tier.put_file("bkt/a", src(tmp_path, b"1"), 1)
    with pytest.raises(KeyConflict):
        await tier.put_file("bkt/a/b", src(tmp_path, b"2"), 1)
    await tier.put_file("bkt/d/e", src(tmp_path, b"3"), 1)
    with pytest.raises(KeyConflict):
        await tier.put_file("bkt/d", src(tmp_path, b"4"), 1)
    with pytest.raises(KeyConflict):
        await tier.copy("bkt/a", "bkt/d")
    assert await tier.get_range("bkt/a", 0, 1) == b"1"


async def test_symlinks_are_not_followed(tier: FileObjectTier, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"outside the root")
    (tmp_path / "cold" / "bkt").mkdir(parents=True)
    os.symlink(secret, tmp_path / "cold" / "bkt" / "link")
    assert await tier.head("bkt/link") is None
    with pytest.raises(ObjectNotFound):
        await tier.get_range("bkt/link", 0, 100)
    page = await tier.list("bkt/")
    assert page.objects == []


async def test_delete_prunes_empty_directories(tier: FileObjectTier, tmp_path: Path) -> None:
    await tier.put_file("bkt/x/y/z", src(tmp_path, b"1"), 1)
    await tier.delete("bkt/x/y/z")
    assert not (tmp_path / "cold" / "bkt" / "x").exists()
    assert (tmp_path / "cold" / "bkt").is_dir()  # the bucket directory stays
    await tier.put_file("bkt/d/e", src(tmp_path, b"1"), 1)
    await tier.delete("bkt/d")  # a prefix, not an object: nothing happens
    assert await tier.head("bkt/d/e") is not None


def test_stale_temps_are_cleared_at_open(tmp_path: Path) -> None:
    tmp = tmp_path / "cold" / TMP_DIR
    tmp.mkdir(parents=True)
    (tmp / "old").write_bytes(b"crash leftover")
    os.utime(tmp / "old", (time.time() - 7200, time.time() - 7200))
    (tmp / "young").write_bytes(b"maybe another node's upload in progress")
    FileObjectTier(tmp_path / "cold")
    assert sorted(os.listdir(tmp)) == ["young"]


async def test_listing_ignores_housekeeping_and_non_keys(tier: FileObjectTier,
                                                         tmp_path: Path) -> None:
    root = tmp_path / "cold"
    (root / ".hidden-bucket").mkdir()
    (root / ".hidden-bucket" / "k").write_bytes(b"x")
    (root / "top-level-file").write_bytes(b"not <bucket>/<key>")
    await tier.put_file("bkt/k", src(tmp_path, b"v"), 1)
    page = await tier.list("")
    assert [o.key for o in page.objects] == ["bkt/k"]
    page = await tier.list("", delimiter="/")
    assert page.common_prefixes == ["bkt/"] and page.objects == []


async def test_holes_stay_holes_and_the_md5_covers_them(tier: FileObjectTier,
                                                        tmp_path: Path) -> None:
    """A sparse source is stored sparse (only its data extents are written), with the MD5
    of every byte, zeros of the holes included; a source shorter than the size is still
    the caller's error."""
    path = tmp_path / "sparse"
    data = os.urandom(1 << 20)
    with open(path, "wb") as f:
        f.truncate(64 << 20)
        f.seek(32 << 20)
        f.write(data)
    info = await tier.put_file("bkt/sparse", str(path), 64 << 20)
    whole = bytes(32 << 20) + data + bytes(31 << 20)
    assert info.etag == hashlib.md5(whole, usedforsecurity=False).hexdigest()
    st = (tmp_path / "cold" / "bkt" / "sparse").stat()
    assert st.st_size == 64 << 20 and st.st_blocks * 512 < 4 << 20
    assert await tier.get_range("bkt/sparse", 32 << 20, 1 << 20) == data
    assert await tier.get_range("bkt/sparse", 0, 16) == bytes(16)


async def test_a_path_too_long_for_the_file_system_is_the_keys_error(
        tier: FileObjectTier, tmp_path: Path) -> None:
    """ENAMETOOLONG is :class:`KeyRejected` (one key), never TierUnavailable (the store):
    the store stays reachable, a listing of such a prefix is empty, a delete is that key's
    KeyRejected too (placement's delete worker takes it as nothing to delete)."""
    deep = "bkt/" + "/".join(["d" * 250] * 17) + "/f"
    with pytest.raises(KeyRejected):
        await tier.put_file(deep, src(tmp_path, b"x"), 1)
    assert tier.reachable()
    assert (await tier.list(deep.rsplit("/", 1)[0] + "/")).objects == []
    with pytest.raises(KeyRejected):
        await tier.delete(deep)
    await tier.put_file("bkt/ok", src(tmp_path, b"ok"), 2)  # everything else works
    assert await tier.get_range("bkt/ok", 0, 2) == b"ok"


async def test_a_metadata_call_does_not_queue_behind_transfers(tmp_path: Path) -> None:
    """Every transfer thread busy with a long upload (sparse sources, hashed whole): a
    ``head`` and a ``probe`` still answer within ``call_timeout`` -- waiting for a thread
    is not the store failing to answer, and a busy store must not read as unreachable."""
    tier = open_object_tier(str(tmp_path / "cold"), concurrency=1)
    tier.call_timeout = 0.5
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(4 << 30)  # hashing 4 GiB of zeros takes seconds: the threads stay busy
    uploads = [asyncio.ensure_future(tier.put_file(f"bkt/big{i}", str(big), 4 << 30))
               for i in range(2)]  # concurrency 1: a pool of two threads, both taken
    try:
        await asyncio.sleep(0.2)
        assert await tier.head("bkt/none") is None
        await tier.probe()
        assert not any(u.done() for u in uploads)  # the threads were busy all along
        assert tier.reachable(), tier.describe_health()
    finally:
        for u in uploads:
            u.cancel()
        await asyncio.gather(*uploads, return_exceptions=True)
        await tier.close()
