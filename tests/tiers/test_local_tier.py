"""LocalTier: sparse per-inode files, hole punching, space accounting, HotDir compatibility,
the descriptor cache, and filling the hot tier from every cold engine."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tierd.tiers import BLOCK_SIZE, LocalTier, blocks_of, local_tier, punch_hole
from tierd.tiers.hotdir import HotDir

from .conftest import Cold, pattern

B = BLOCK_SIZE


@pytest.fixture
def hot(tmp_path: Path) -> LocalTier:
    return LocalTier(tmp_path / "hot", name="hot")


async def test_sparse_writes_and_present_blocks(hot: LocalTier) -> None:
    a, b = pattern(B, 1), pattern(1000, 2)
    await hot.write(7, 0, a)
    await hot.write(7, 3 * B + 10, b)
    st = await hot.stat(7)
    assert st is not None and st.st_size == 3 * B + 1010
    assert await hot.allocated(7) < 2 * B  # blocks 1 and 2 are holes
    assert await hot.present_blocks(7) == [0, 3]
    assert await hot.present_blocks(7, B, 2 * B) == []
    assert await hot.present_blocks(7, 2 * B, 2 * B) == [3]
    assert await hot.read(7, B, 100) == bytes(100)  # a hole reads as zeros
    assert await hot.read(7, 0, B) == a
    assert await hot.read(7, 3 * B + 10, 5000) == b  # short at end of file
    ranges = await hot.data_ranges(7)
    assert ranges[0][0] == 0 and ranges[-1][1] == 3 * B + 1010


async def test_punch_keeps_size_and_frees_blocks(hot: LocalTier) -> None:
    await hot.write(1, 0, pattern(3 * B, 3))
    before = await hot.allocated(1)
    assert before >= 3 * B
    assert await hot.punch(1, B, B)
    st = await hot.stat(1)
    assert st is not None and st.st_size == 3 * B
    assert await hot.allocated(1) <= before - B
    assert await hot.present_blocks(1) == [0, 2]
    assert await hot.read(1, B, B) == bytes(B)
    assert await hot.evict_blocks(1, [0, 2])
    assert await hot.present_blocks(1) == []
    assert await hot.allocated(1) == 0
    with pytest.raises(FileNotFoundError):
        await hot.punch(404, 0, B)


async def test_punch_fallback_without_fallocate(hot: LocalTier,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_tier, "_fallocate", None)
    await hot.write(2, 0, pattern(2 * B, 4))
    assert not await hot.punch(2, 0, B)  # a part: cannot free, says so
    assert await hot.read(2, 0, 10) == pattern(2 * B, 4)[:10]
    assert await hot.punch(2, 0, 2 * B)  # the whole file: truncate and re-extend
    st = await hot.stat(2)
    assert st is not None and st.st_size == 2 * B
    assert await hot.allocated(2) == 0


async def test_truncate_remove_fsync(hot: LocalTier) -> None:
    await hot.truncate(3, 10 * B)
    st = await hot.stat(3)
    assert st is not None and st.st_size == 10 * B and st.st_blocks == 0
    await hot.write(3, 0, b"x")
    await hot.fsync(3)  # new file: data and directory entry
    await hot.remove(3)
    assert await hot.stat(3) is None
    with pytest.raises(FileNotFoundError):
        await hot.read(3, 0, 1)
    await hot.remove(3)  # missing is fine
    assert await hot.present_blocks(3) == []
    with pytest.raises(FileNotFoundError):
        await hot.fsync(3)


async def test_used_and_capacity(tmp_path: Path) -> None:
    t = LocalTier(tmp_path / "t", capacity=123 << 20)
    assert t.capacity() == 123 << 20
    assert LocalTier(tmp_path / "u").capacity() == os.statvfs(tmp_path).f_blocks * \
        os.statvfs(tmp_path).f_frsize
    assert 0 < t.fs_free() <= LocalTier(tmp_path / "u").capacity()
    empty = await t.used()
    await t.write(1, 0, pattern(B, 5))
    await t.write(2, 5 * B, pattern(B, 6))
    used = await t.used()
    assert used - empty >= 2 * B
    assert used - empty < 3 * B  # holes cost nothing
    await t.remove(1)
    assert await t.used() < used


async def test_hotdir_uses_the_tiers_layout_and_descriptors(tmp_path: Path) -> None:
    """HotDir (the namespace's side) owns no layout or descriptor of its own: its paths
    are the tier's, and an open file's descriptor (pin) is the tier's cached one, kept
    through cache churn and closed only once let go of and dropped."""
    lt = LocalTier(tmp_path / "hot", max_open=1)
    hd = HotDir(lt)
    for ino in (1, 0xABCDEF, 2**63 - 1):
        h = f"{ino:016x}"
        assert hd.path(ino) == lt.path(ino) == str(tmp_path / "hot" / h[-2:] / h)
    fd = hd.open(42)
    os.pwrite(fd, b"written by the namespace", 0)
    os.close(fd)
    assert await lt.read(42, 0, 100) == b"written by the namespace"
    pinned, unpin = hd.pin(7)  # created empty
    async with lt.fd(7) as fd:
        assert fd == pinned  # placement's reads use the open file's descriptor
    for ino in range(20, 25):  # churn past max_open: a pinned descriptor stays open
        await lt.write(ino, 0, b"x")
    os.pwrite(pinned, b"still open", 0)
    assert await lt.read(7, 0, 10) == b"still open"
    unpin()
    lt.release_fd(7)
    with pytest.raises(OSError):
        os.fstat(pinned)


async def test_a_full_cache_of_descriptors_in_use_still_opens_more(tmp_path: Path) -> None:
    """Every cached descriptor in use (open files pin theirs): a new one is opened beyond
    the bound instead of being closed under its first user."""
    t = LocalTier(tmp_path / "hot", max_open=1)
    async with t.fd(1, create=True):
        await t.write(2, 0, b"beyond the bound")
        assert await t.read(2, 0, 100) == b"beyond the bound"
    await t.close()


async def test_descriptor_cache_is_bounded_and_safe(tmp_path: Path) -> None:
    t = LocalTier(tmp_path / "hot", max_open=2)
    for ino in range(10):
        await t.write(ino, 0, f"file {ino}".encode())
    assert len(t._fds) <= 2
    for ino in range(10):
        assert await t.read(ino, 0, 20) == f"file {ino}".encode()
    # removal while a descriptor is in use: the holder keeps a valid descriptor
    async with t.fd(5) as fd:
        await t.remove(5)
        for ino in range(20, 30):  # churn the cache meanwhile
            await t.write(ino, 0, b"x")
        assert os.pread(fd, 6, 0) == b"file 5"
    with pytest.raises(OSError):
        os.fstat(fd)  # closed at the last release
    await t.close()
    assert not t._fds


async def test_descriptor_cache_closes_the_least_recently_used_idle_ones(
        tmp_path: Path) -> None:
    """Past the bound the oldest descriptors no one holds are closed, and only as many as
    the bound asks: a held one is skipped, the recently used stay."""
    t = LocalTier(tmp_path / "hot", max_open=3)
    async with t.fd(1, create=True):  # held: the oldest, never closed under its user
        for ino in (2, 3, 4, 5):
            await t.write(ino, 0, b"x")
        assert list(t._fds) == [1, 4, 5]  # 2 and 3 went, oldest first
        await t.read(4, 0, 1)  # used again: the most recent
        await t.write(6, 0, b"x")
        assert list(t._fds) == [1, 4, 6]
    await t.close()


async def test_concurrent_block_writes(hot: LocalTier) -> None:
    blocks = {i: pattern(B // 4, i) for i in range(0, 16, 2)}
    await asyncio.gather(*(hot.write(9, i * (B // 4), d) for i, d in blocks.items()))
    for i, d in blocks.items():
        assert await hot.read(9, i * (B // 4), B // 4) == d


def test_helpers(tmp_path: Path) -> None:
    assert list(blocks_of(0, 1)) == [0]
    assert list(blocks_of(B - 1, 2)) == [0, 1]
    assert list(blocks_of(3 * B, B)) == [3]
    assert list(blocks_of(5, 0)) == []
    p = tmp_path / "f"
    p.write_bytes(pattern(2 * B, 8))
    fd = os.open(p, os.O_RDWR)
    try:
        assert punch_hole(fd, 0, 0)
        assert punch_hole(fd, 0, B)
        assert os.pread(fd, 4, 0) == bytes(4)
    finally:
        os.close(fd)


# --- the hot tier filled from the cold tier (what placement does on a miss) -----------------


async def test_fill_hot_blocks_from_every_cold_engine(cold: Cold, tmp_path: Path,
                                                      hot: LocalTier) -> None:
    size = 2 * B + 12345
    data = pattern(size, 12)
    p = tmp_path / "object"
    p.write_bytes(data)
    info = await cold.tier.put_file("bkt/dataset/shard-0", str(p), size)
    async with hot.fd(77, create=True) as fd:
        os.ftruncate(fd, size)
        # block 2 (the tail) and block 0, as two misses would
        assert await cold.tier.read_into("bkt/dataset/shard-0", 2 * B, B, fd, 2 * B,
                                         if_match=info.etag) == 12345
        assert await cold.tier.read_into("bkt/dataset/shard-0", 0, B, fd, 0) == B
    assert await hot.present_blocks(77) == [0, 2]
    assert await hot.read(77, 0, B) == data[:B]
    assert await hot.read(77, 2 * B, B) == data[2 * B :]
    # persisting from the hot tier goes the other way, from the same descriptor
    async with hot.fd(77) as fd:
        await cold.tier.put_file("bkt/dataset/copy", fd, B)
    assert await cold.tier.get_range("bkt/dataset/copy", 0, B) == data[:B]


async def test_copy_between_local_tiers(tmp_path: Path) -> None:
    """Demotion and promotion copy a range of one inode's file to the same range of the
    other tier's file; holes stay zeros, the source is untouched."""
    hot = LocalTier(tmp_path / "hot", name="hot")
    warm = LocalTier(tmp_path / "warm", name="warm")
    a = pattern(2 * B + 5, 3)
    await hot.write(9, 0, a)
    assert await warm.copy_from(hot, 9, B, B + 5) == B + 5
    assert await warm.read(9, B, B + 5) == a[B:]
    assert await warm.read(9, 0, 10) == bytes(10)  # not copied: a hole
    assert await warm.present_blocks(9) == [1, 2]
    assert await hot.copy_from(warm, 9, 2 * B, 100) == 5  # short at the source's end
    assert await hot.read(9, 0, 2 * B + 5) == a
    await hot.evict_blocks(9, [0])
    assert await warm.copy_from(hot, 9, 0, B) == B
    assert await warm.read(9, 0, B) == bytes(B)


async def test_pread_is_one_copy_and_handles_ends(tmp_path: Path) -> None:
    """fileio.pread: the inline path returns exactly the bytes (short at the end, empty past
    it), and an uncached range still reads (via a thread)."""
    from tierd.tiers import fileio

    p = tmp_path / "f"
    data = pattern(3 * B // 2, 8)
    p.write_bytes(data)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert await fileio.pread(fd, B, 0) == data[:B]
        assert await fileio.pread(fd, B, B) == data[B:]
        assert await fileio.pread(fd, 10, len(data) + 5) == b""
        assert await fileio.pread(fd, 0, 0) == b""
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # likely not cached now
        assert await fileio.pread(fd, 1000, 12345) == data[12345:13345]
        out = await fileio.pread(fd, 7, 3)
        assert type(out) is bytes and out == data[3:10] and hash(out) == hash(data[3:10])
    finally:
        os.close(fd)
