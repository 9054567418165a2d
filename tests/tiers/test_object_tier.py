"""The backend suite: one contract, every ObjectTier engine (file://, s3:// on moto, memory://).

Each test runs three times through the parametrized ``cold`` fixture.  Where engines
legitimately differ (what an ETag is), the test says so next to the assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from pathlib import Path

import pytest

from tierd.tiers import (
    InvalidKey,
    ObjectChanged,
    ObjectInfo,
    ObjectNotFound,
    ObjectTier,
    TierError,
    TierUnavailable,
)

from .conftest import SMALL, Cold, pattern

MIB = 1 << 20


def src_file(tmp_path: Path, data: bytes, name: str = "src") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


async def put_bytes(tier: ObjectTier, tmp_path: Path, key: str, data: bytes) -> ObjectInfo:
    p = src_file(tmp_path, data, "src-" + hashlib.md5(key.encode()).hexdigest())
    return await tier.put_file(key, str(p), len(data))


async def list_all(tier: ObjectTier, prefix: str, delimiter: str = "",
                   limit: int = 1000) -> tuple[list[str], list[str], int]:
    """Every key and common prefix, page by page; also returns the page count."""
    keys: list[str] = []
    prefixes: list[str] = []
    start = ""
    pages = 0
    while True:
        page = await tier.list(prefix, start_after=start, delimiter=delimiter, limit=limit)
        pages += 1
        assert len(page.objects) + len(page.common_prefixes) <= limit
        keys += [o.key for o in page.objects]
        prefixes += page.common_prefixes
        if not page.truncated:
            return keys, prefixes, pages
        assert page.next_start_after > start
        start = page.next_start_after
        assert pages < 1000


# --- put / head / get_range -----------------------------------------------------------------


async def test_put_head_get_range(cold: Cold, tmp_path: Path) -> None:
    data = pattern(100_000)
    info = await put_bytes(cold.tier, tmp_path, "bkt/dir/obj.bin", data)
    assert (info.key, info.size) == ("bkt/dir/obj.bin", len(data))
    head = await cold.tier.head("bkt/dir/obj.bin")
    assert head is not None
    assert (head.key, head.size, head.etag) == ("bkt/dir/obj.bin", len(data), info.etag)
    assert head.mtime_ns > 0
    if cold.kind != "memory":  # file: MD5 kept in an xattr; S3: single-PUT ETag is the MD5
        assert head.etag == hashlib.md5(data).hexdigest()
    t = cold.tier
    assert await t.get_range("bkt/dir/obj.bin", 0, len(data)) == data
    assert await t.get_range("bkt/dir/obj.bin", 10, 20) == data[10:30]
    assert await t.get_range("bkt/dir/obj.bin", len(data) - 5, 100) == data[-5:]
    assert await t.get_range("bkt/dir/obj.bin", len(data), 10) == b""
    assert await t.get_range("bkt/dir/obj.bin", len(data) + 100, 10) == b""
    assert await t.get_range("bkt/dir/obj.bin", 5, 0) == b""
    with pytest.raises(ValueError):
        await t.get_range("bkt/dir/obj.bin", -1, 5)


async def test_empty_object(cold: Cold, tmp_path: Path) -> None:
    info = await put_bytes(cold.tier, tmp_path, "bkt/empty", b"")
    assert info.size == 0
    head = await cold.tier.head("bkt/empty")
    assert head is not None and head.size == 0
    assert await cold.tier.get_range("bkt/empty", 0, 10) == b""
    fd = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT)
    try:
        assert await cold.tier.read_into("bkt/empty", 0, 10, fd, 0) == 0
    finally:
        os.close(fd)
    assert cold.raw_get("bkt/empty") == b""


async def test_put_from_descriptor_keeps_its_position(cold: Cold, tmp_path: Path) -> None:
    data = pattern(50_000, seed=3)
    p = src_file(tmp_path, data + b"trailing bytes not part of the object")
    fd = os.open(p, os.O_RDONLY)
    try:
        os.lseek(fd, 123, os.SEEK_SET)
        md5 = hashlib.md5(data).hexdigest()
        info = await cold.tier.put_file("bkt/fromfd", fd, len(data), md5_hex=md5)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 123
    finally:
        os.close(fd)
    assert info.size == len(data)
    assert cold.raw_get("bkt/fromfd") == data
    if cold.kind != "memory":
        assert info.etag == md5


async def test_overwrite_replaces_content_and_etag(cold: Cold, tmp_path: Path) -> None:
    a = await put_bytes(cold.tier, tmp_path, "bkt/k", b"first version")
    await asyncio.sleep(0.01)
    b = await put_bytes(cold.tier, tmp_path, "bkt/k", b"second, longer version")
    assert a.etag != b.etag
    assert await cold.tier.get_range("bkt/k", 0, 100) == b"second, longer version"
    head = await cold.tier.head("bkt/k")
    assert head is not None and head.etag == b.etag


async def test_multipart_put_and_parallel_reads(cold: Cold, tmp_path: Path) -> None:
    size = 11 * MIB + 12345  # above the 6 MiB threshold: 3 parts of 5 MiB
    data = pattern(size, seed=7)
    info = await put_bytes(cold.tier, tmp_path, "bkt/big/model.safetensors", data)
    assert info.size == size
    if cold.kind == "s3":
        assert info.etag.endswith("-3")  # S3's multipart ETag: md5-of-part-md5s-N
    head = await cold.tier.head("bkt/big/model.safetensors")
    assert head is not None and head.size == size and head.etag == info.etag
    # ranges across part and range-size boundaries (parallel ranged GETs: range_size 1 MiB)
    for off, ln in [(0, size), (5 * MIB - 10, 20), (MIB // 2, 3 * MIB + 7), (size - 3, 10)]:
        assert await cold.tier.get_range("bkt/big/model.safetensors", off, ln) == \
            data[off : off + ln]
    dst = tmp_path / "hot"
    fd = os.open(dst, os.O_RDWR | os.O_CREAT)
    try:
        n = await cold.tier.read_into("bkt/big/model.safetensors", 0, size, fd, 0)
        assert n == size
        n = await cold.tier.read_into("bkt/big/model.safetensors", 4 * MIB, 4 * MIB, fd,
                                      size + MIB)
        assert n == 4 * MIB
    finally:
        os.close(fd)
    got = dst.read_bytes()
    assert got[:size] == data
    assert got[size : size + MIB] == bytes(MIB)  # untouched gap stays a hole
    assert got[size + MIB :] == data[4 * MIB : 8 * MIB]
    assert cold.raw_get("bkt/big/model.safetensors") == data


async def test_read_into_offsets_and_short_reads(cold: Cold, tmp_path: Path) -> None:
    data = pattern(3 * MIB + 100, seed=11)
    await put_bytes(cold.tier, tmp_path, "bkt/r", data)
    dst = tmp_path / "dst"
    fd = os.open(dst, os.O_RDWR | os.O_CREAT)
    try:
        assert await cold.tier.read_into("bkt/r", 100, 50, fd, 1000) == 50
        # asks past the end: only what exists is written
        assert await cold.tier.read_into("bkt/r", 3 * MIB, 10 * MIB, fd, 4096) == 100
        assert await cold.tier.read_into("bkt/r", 4 * MIB, 10, fd, 0) == 0
    finally:
        os.close(fd)
    got = dst.read_bytes()
    assert got[1000:1050] == data[100:150]
    assert got[4096 : 4096 + 100] == data[3 * MIB :]


async def test_if_match_pins_one_version(cold: Cold, tmp_path: Path) -> None:
    data = pattern(2 * MIB + 5, seed=5)
    info = await put_bytes(cold.tier, tmp_path, "bkt/v", data)
    assert await cold.tier.get_range("bkt/v", 0, 10, if_match=info.etag) == data[:10]
    fd = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT)
    try:
        n = await cold.tier.read_into("bkt/v", 0, len(data), fd, 0, if_match=info.etag)
        assert n == len(data)
        with pytest.raises(ObjectChanged):
            await cold.tier.read_into("bkt/v", 0, len(data), fd, 0, if_match="0" * 32)
        with pytest.raises(ObjectChanged):
            await cold.tier.read_into("bkt/v", 0, 10, fd, 0, if_match="0" * 32)
    finally:
        os.close(fd)
    with pytest.raises(ObjectChanged):
        await cold.tier.get_range("bkt/v", 0, 10, if_match="0" * 32)


# --- missing objects and bad keys -----------------------------------------------------------


async def test_missing_objects(cold: Cold, tmp_path: Path) -> None:
    t = cold.tier
    assert await t.head("bkt/nope") is None
    with pytest.raises(ObjectNotFound) as e:
        await t.get_range("bkt/nope", 0, 10)
    assert isinstance(e.value, KeyError) and "bkt/nope" in str(e.value)
    with pytest.raises(ObjectNotFound):
        await t.get_range("bkt/nope", 0, 0)
    with pytest.raises(ObjectNotFound):
        await t.get_range("bkt/nope", 0, 5 * MIB)  # the parallel path too
    fd = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(ObjectNotFound):
            await t.read_into("bkt/nope", 0, 10, fd, 0)
        with pytest.raises(ObjectNotFound):
            await t.read_into("bkt/nope", 0, 5 * MIB, fd, 0)
    finally:
        os.close(fd)
    with pytest.raises(ObjectNotFound):
        await t.copy("bkt/nope", "bkt/other")
    await t.delete("bkt/nope")  # deleting nothing succeeds, as in S3
    # a prefix is not an object
    await put_bytes(t, tmp_path, "bkt/dir/child", b"x")
    assert await t.head("bkt/dir") is None
    with pytest.raises(ObjectNotFound):
        await t.get_range("bkt/dir", 0, 1)


@pytest.mark.parametrize(
    "key", ["", "bkt", "bkt/", "/bkt/k", "bkt//k", "bkt/./k", "bkt/../k", "../etc/passwd",
            "bkt/k/..", ".tierd-tmp/k", "bkt/a\x00b", "bkt/" + "x" * 256]
)
async def test_invalid_keys_are_refused_everywhere(cold: Cold, tmp_path: Path, key: str) -> None:
    t = cold.tier
    p = str(src_file(tmp_path, b"data"))
    for call in (t.head(key), t.get_range(key, 0, 1), t.put_file(key, p, 4), t.delete(key),
                 t.copy(key, "bkt/ok"), t.copy("bkt/ok", key)):
        with pytest.raises(InvalidKey) as e:
            await call
        assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError):
        await t.list("bkt/", limit=0)
    with pytest.raises(ValueError):
        await t.list("bkt/", limit=1001)


# --- delete / copy --------------------------------------------------------------------------


async def test_delete(cold: Cold, tmp_path: Path) -> None:
    await put_bytes(cold.tier, tmp_path, "bkt/a/b/c", b"1")
    await put_bytes(cold.tier, tmp_path, "bkt/a/keep", b"2")
    await cold.tier.delete("bkt/a/b/c")
    assert await cold.tier.head("bkt/a/b/c") is None
    assert not cold.raw_exists("bkt/a/b/c")
    assert await cold.tier.head("bkt/a/keep") is not None
    keys, prefixes, _ = await list_all(cold.tier, "bkt/", "/")
    assert (keys, prefixes) == ([], ["bkt/a/"])  # "a/b/" vanished with its last key
    await cold.tier.delete("bkt/a/b/c")


async def test_copy_small_and_multipart(cold: Cold, tmp_path: Path) -> None:
    small = pattern(1000, seed=1)
    src = await put_bytes(cold.tier, tmp_path, "bkt/src", small)
    dst = await cold.tier.copy("bkt/src", "bkt/renamed/dst")
    assert dst.key == "bkt/renamed/dst" and dst.size == len(small)
    if cold.kind != "memory":
        assert dst.etag == src.etag
    assert cold.raw_get("bkt/renamed/dst") == small
    assert await cold.tier.head("bkt/src") is not None  # a copy, not a move
    big = pattern(11 * MIB, seed=2)  # above the threshold: multipart copy on S3
    await put_bytes(cold.tier, tmp_path, "bkt/bigsrc", big)
    info = await cold.tier.copy("bkt/bigsrc", "other-bucket/bigdst")
    assert info.size == len(big)
    assert await cold.tier.get_range("other-bucket/bigdst", 0, len(big)) == big
    head = await cold.tier.head("other-bucket/bigdst")
    assert head is not None and head.etag == info.etag


# --- listing --------------------------------------------------------------------------------

KEYS = ["bkt/a.txt", "bkt/a/1", "bkt/a/2", "bkt/a-b", "bkt/a0", "bkt/c/d/e", "bkt/é",
        "bkt/日本/語", "bkt/😀", "bkt/z", "bkt2/x"]


def utf8_sorted(keys: list[str]) -> list[str]:
    return sorted(keys, key=lambda k: k.encode())


@pytest.fixture
def listing(cold: Cold, tmp_path: Path) -> Cold:
    async def fill() -> None:
        await asyncio.gather(*(put_bytes(cold.tier, tmp_path, k, k.encode()) for k in KEYS))

    asyncio.run(fill())
    return cold


async def test_list_recursive_sorted_with_info(listing: Cold) -> None:
    page = await listing.tier.list("bkt/")
    assert [o.key for o in page.objects] == utf8_sorted([k for k in KEYS
                                                         if k.startswith("bkt/")])
    assert not page.truncated and page.common_prefixes == []
    by_key = {o.key: o for o in page.objects}
    assert by_key["bkt/é"].size == len("bkt/é".encode())
    head = await listing.tier.head("bkt/é")
    assert head is not None and by_key["bkt/é"].etag == head.etag


async def test_list_with_delimiter(listing: Cold) -> None:
    page = await listing.tier.list("bkt/", delimiter="/")
    assert [o.key for o in page.objects] == utf8_sorted(
        ["bkt/a.txt", "bkt/a-b", "bkt/a0", "bkt/é", "bkt/😀", "bkt/z"])
    assert page.common_prefixes == ["bkt/a/", "bkt/c/", "bkt/日本/"]
    top = await listing.tier.list("", delimiter="/")
    assert (top.objects, top.common_prefixes) == ([], ["bkt/", "bkt2/"])
    part = await listing.tier.list("bkt/a", delimiter="/")
    assert [o.key for o in part.objects] == ["bkt/a-b", "bkt/a.txt", "bkt/a0"]
    assert part.common_prefixes == ["bkt/a/"]
    deep = await listing.tier.list("bkt/c/", delimiter="/")
    assert (deep.objects, deep.common_prefixes) == ([], ["bkt/c/d/"])
    none = await listing.tier.list("bkt/nothing/", delimiter="/")
    assert none == ([], [], False)


@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_list_pagination(listing: Cold, limit: int) -> None:
    everything = utf8_sorted([k for k in KEYS if k.startswith("bkt/")])
    keys, prefixes, pages = await list_all(listing.tier, "bkt/", limit=limit)
    assert keys == everything and prefixes == []
    assert pages >= len(everything) // limit
    keys, prefixes, _ = await list_all(listing.tier, "bkt/", "/", limit=limit)
    # each common prefix exactly once, even when a page ends on one
    assert prefixes == ["bkt/a/", "bkt/c/", "bkt/日本/"]
    assert keys == utf8_sorted(["bkt/a.txt", "bkt/a-b", "bkt/a0", "bkt/é", "bkt/😀", "bkt/z"])


async def test_list_start_after(listing: Cold) -> None:
    page = await listing.tier.list("bkt/", start_after="bkt/a/1")
    assert [o.key for o in page.objects][:2] == ["bkt/a/2", "bkt/a0"]
    page = await listing.tier.list("bkt/", start_after="bkt/b")  # not a key itself
    assert page.objects[0].key == "bkt/c/d/e"
    page = await listing.tier.list("bkt/", start_after="bkt/a/", delimiter="/")
    assert page.common_prefixes[0] == "bkt/c/"  # a common prefix skips its whole subtree
    page = await listing.tier.list("bkt/", start_after="bkt/é")  # UTF-8 order: z < é < 日 < 😀
    assert [o.key for o in page.objects] == ["bkt/日本/語", "bkt/😀"]
    page = await listing.tier.list("bkt2/", start_after="zzz")
    assert page == ([], [], False)


# --- transparent layout ---------------------------------------------------------------------


async def test_layout_is_transparent_both_ways(cold: Cold, tmp_path: Path) -> None:
    data = pattern(20_000, seed=9)
    await put_bytes(cold.tier, tmp_path, "photos/2024/cat.jpg", data)
    assert cold.raw_get("photos/2024/cat.jpg") == data  # plain client, no tierd
    outside = pattern(30_000, seed=10)
    cold.raw_put("datasets/imagenet/train/0001.jpg", outside)  # uploaded by someone else
    head = await cold.tier.head("datasets/imagenet/train/0001.jpg")
    assert head is not None and head.size == len(outside)
    assert await cold.tier.get_range("datasets/imagenet/train/0001.jpg", 0, 10**6) == outside
    page = await cold.tier.list("datasets/", delimiter="/")
    assert page.common_prefixes == ["datasets/imagenet/"]
    page = await cold.tier.list("datasets/imagenet/train/")
    assert [(o.key, o.size, o.etag) for o in page.objects] == [
        ("datasets/imagenet/train/0001.jpg", len(outside), head.etag)]


# --- concurrency, cancellation, caller errors -----------------------------------------------


async def test_concurrent_operations(cold: Cold, tmp_path: Path) -> None:
    blobs = {f"bkt/many/{i:03d}": pattern(1000 + i, seed=i) for i in range(24)}
    await asyncio.gather(*(put_bytes(cold.tier, tmp_path, k, v) for k, v in blobs.items()))
    got = await asyncio.gather(*(cold.tier.get_range(k, 0, 10**6) for k in blobs))
    assert got == list(blobs.values())
    keys, _, _ = await list_all(cold.tier, "bkt/many/", limit=7)
    assert keys == sorted(blobs)


async def test_cancelled_read_into_writes_nothing_afterwards(cold: Cold, tmp_path: Path) -> None:
    data = pattern(11 * MIB, seed=4)
    await put_bytes(cold.tier, tmp_path, "bkt/cancel", data)
    dst = tmp_path / "dst"
    fd = os.open(dst, os.O_RDWR | os.O_CREAT)
    try:
        task = asyncio.ensure_future(cold.tier.read_into("bkt/cancel", 0, len(data), fd, 0))
        await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # once the call has returned, no thread may still write into the descriptor
        before = os.fstat(fd).st_size, dst.read_bytes()
        await asyncio.sleep(0.3)
        assert (os.fstat(fd).st_size, dst.read_bytes()) == before
    finally:
        os.close(fd)
    # the tier is still usable
    assert await cold.tier.get_range("bkt/cancel", 0, 100) == data[:100]


async def test_errors_of_the_callers_file_stay_oserror(cold: Cold, tmp_path: Path) -> None:
    data = pattern(2 * MIB, seed=6)
    await put_bytes(cold.tier, tmp_path, "bkt/o", data)
    ro = src_file(tmp_path, b"", "readonly")
    fd = os.open(ro, os.O_RDONLY)
    try:
        for length in (10, len(data)):  # one range, and parallel ranges
            with pytest.raises(OSError) as e:
                await cold.tier.read_into("bkt/o", 0, length, fd, 0)
            assert not isinstance(e.value, TierError)
    finally:
        os.close(fd)
    short = src_file(tmp_path, b"only this", "short")
    with pytest.raises(OSError):
        await cold.tier.put_file("bkt/short", str(short), 1000)
    assert await cold.tier.head("bkt/short") is None  # nothing half-written appears


async def test_probe_and_close(cold: Cold) -> None:
    await cold.tier.probe()
    await cold.tier.close()
    with pytest.raises(TierUnavailable, match="closed"):
        await cold.tier.head("bkt/k")
    await cold.tier.close()  # idempotent


def test_transfer_settings_reach_the_engine(cold: Cold) -> None:
    assert cold.tier.transfer.multipart_threshold == SMALL["multipart_threshold"]
    assert cold.tier.transfer.concurrency == SMALL["concurrency"]


async def test_read_into_with_a_range_size_and_if_match(cold: Cold, tmp_path: Path) -> None:
    """Placement's stream fills: a per-call range size, the version pinned by ``if_match``
    (no HEAD needed); past the end only what exists is written; a stale ETag is refused."""
    data = pattern(5 * MIB + 3, seed=13)
    info = await put_bytes(cold.tier, tmp_path, "bkt/rs", data)
    fd = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT)
    try:
        n = await cold.tier.read_into("bkt/rs", 0, 8 * MIB, fd, 0, if_match=info.etag,
                                      range_size=2 * MIB)
        assert n == len(data)
        assert await cold.tier.read_into("bkt/rs", MIB, 3 * MIB, fd, MIB,
                                         range_size=MIB + 1) == 3 * MIB
        await put_bytes(cold.tier, tmp_path, "bkt/rs", data[::-1])
        with pytest.raises(ObjectChanged):
            await cold.tier.read_into("bkt/rs", 0, 4 * MIB, fd, 0, if_match=info.etag,
                                      range_size=MIB)
    finally:
        os.close(fd)
    assert (tmp_path / "dst").read_bytes()[: len(data)] == data
