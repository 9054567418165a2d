"""The blocking file helpers of :mod:`tierd.tiers.fileio` (whole writes, copies, directory
syncs), on real files: every tier and the namespace write through these, so a short write,
a copy across file systems or a batch of many buffers must come out byte for byte."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierd.namespace.mpu_parts import _write_hash
from tierd.tiers import fileio


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


@pytest.fixture
def fds(tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    """A source file of 20 MiB + 5 bytes (three copy chunks) and an empty destination."""
    src = tmp_path / "src"
    src.write_bytes(pattern(2 * fileio.COPY_CHUNK + (4 << 20) + 5))
    dst = tmp_path / "dst"
    s = os.open(src, os.O_RDONLY)
    d = os.open(dst, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        yield s, d, dst
    finally:
        os.close(s)
        os.close(d)


def test_pwritev_all_more_buffers_than_one_call_takes(tmp_path: Path) -> None:
    """More buffers than IOV_MAX (one pwritev refuses them with EINVAL), empty ones among
    them, at an offset: all written in order."""
    bufs: list[fileio.Buffer] = [pattern(i % 7, i) for i in range(2500)]
    bufs[100] = memoryview(b"")
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fileio.pwritev_all(fd, bufs, 3)
        assert os.pread(fd, 1 << 20, 0) == b"\0" * 3 + b"".join(bytes(b) for b in bufs)
    finally:
        os.close(fd)


def test_part_batch_of_many_small_chunks(tmp_path: Path) -> None:
    """A multipart part's write batch of more than IOV_MAX small chunks (a client sending
    tiny chunks) is written and hashed whole; one pwritev of them all failed with EINVAL."""
    chunks = [pattern(100, i) for i in range(1500)]
    md5 = hashlib.md5()
    fd = os.open(tmp_path / "part", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _write_hash(fd, list(chunks), 0, [md5])
        assert os.pread(fd, 1 << 20, 0) == b"".join(chunks)
    finally:
        os.close(fd)
    assert md5.hexdigest() == hashlib.md5(b"".join(chunks)).hexdigest()


def test_pwrite_all_memoryview_slice(tmp_path: Path) -> None:
    data = pattern(300_000)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fileio.pwrite_all(fd, memoryview(data)[1000:], 10)
        assert os.pread(fd, 1 << 20, 10) == data[1000:]
    finally:
        os.close(fd)


def test_copy_range_in_kernel_at_offsets(fds: tuple[int, int, Path]) -> None:
    src, dst, path = fds
    data = os.pread(src, 64 << 20, 0)
    ticks: list[int] = []
    n = fileio.copy_range(src, dst, len(data) - 7, 7, 100, tick=lambda: ticks.append(1))
    assert n == len(data) - 7
    assert path.read_bytes() == b"\0" * 100 + data[7:]
    assert len(ticks) == 3  # one per chunk


def test_copy_range_short_source_returns_what_it_copied(fds: tuple[int, int, Path]) -> None:
    src, dst, path = fds
    size = os.fstat(src).st_size
    assert fileio.copy_range(src, dst, 1 << 30, size - 10, 0) == 10
    assert fileio.copy_range(src, dst, 5, size + 1, 0) == 0
    assert path.stat().st_size == 10


def test_copy_range_with_digest_goes_through_the_buffer(fds: tuple[int, int, Path]) -> None:
    """A digest sees every byte, in order; the given read and write do the copy."""
    src, dst, path = fds
    data = os.pread(src, 64 << 20, 0)
    md5 = hashlib.md5()
    calls: list[str] = []

    def read(fd: int, n: int, pos: int) -> bytes:
        calls.append("r")
        return os.pread(fd, n, pos)

    def write(fd: int, buf: bytes, pos: int) -> None:
        calls.append("w")
        fileio.pwrite_all(fd, buf, pos)

    assert fileio.copy_range(src, dst, len(data), 0, 0, digest=md5.update,
                             read=read, write=write) == len(data)
    assert md5.digest() == hashlib.md5(data).digest()
    assert path.read_bytes() == data
    assert calls == ["r", "w"] * 3


def test_copy_range_stops_between_chunks(fds: tuple[int, int, Path]) -> None:
    src, dst, path = fds
    ticks: list[int] = []
    n = fileio.copy_range(src, dst, 1 << 30, 0, 0, stop=lambda: len(ticks) == 1,
                          tick=lambda: ticks.append(1))
    assert n == fileio.COPY_CHUNK == path.stat().st_size


def test_copy_range_across_file_systems(tmp_path: Path) -> None:
    """From /dev/shm (tmpfs) to the test's directory: ``copy_file_range`` may refuse
    (EXDEV); the copy then goes through a buffer and still comes out whole."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    data = pattern(3 << 20, 5)
    src_path = Path("/dev/shm") / f"tierd-fileio-{os.getpid()}"
    src_path.write_bytes(data)
    try:
        src = os.open(src_path, os.O_RDONLY)
        dst = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            assert fileio.copy_range(src, dst, len(data), 0, 0) == len(data)
        finally:
            os.close(src)
            os.close(dst)
    finally:
        src_path.unlink()
    assert (tmp_path / "dst").read_bytes() == data


def test_copy_range_passes_other_errors(tmp_path: Path) -> None:
    """An error of ``copy_file_range`` that is not "no copy_file_range here" (a directory
    as the source: EISDIR) reaches the caller as it is, without a try through the buffer
    (whose ``pread`` would fail the same way: hence the read that counts)."""
    src = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    dst = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT, 0o600)
    reads: list[int] = []

    def read(fd: int, n: int, pos: int) -> bytes:
        reads.append(n)
        return os.pread(fd, n, pos)

    try:
        with pytest.raises(IsADirectoryError):
            fileio.copy_range(src, dst, 10, 0, 0, read=read)
        assert reads == []
    finally:
        os.close(src)
        os.close(dst)


def test_fsync_dir(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    fileio.fsync_dir(tmp_path)
    fileio.fsync_parent(str(tmp_path / "f"))
    with pytest.raises(NotADirectoryError):
        fileio.fsync_dir(tmp_path / "f")
