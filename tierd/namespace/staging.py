"""Streaming a request body into a staging file while hashing it, without serialising the
three costs: receiving (the loop), writing (a thread) and MD5 (another thread; hashlib
releases the GIL).  Small network chunks are gathered into batches of ~1 MiB so a thread
hop is paid per MiB, not per 16 KiB chunk, and batch N is written and hashed while batch N+1
is received.  Nothing is buffered beyond two batches.

**A full hot tier** is answered, not failed: every write to it here goes through
:func:`retry_full`, which on ENOSPC has placement evict clean (persisted) data and runs the
write once more -- a write that may be repeated (``pwrite`` at fixed offsets) -- and
otherwise raises ``FsError(ENOSPC)`` saying why (S3 507 InsufficientStorage, FUSE
ENOSPC).  The other write paths of the namespace (FUSE writes, copies, parts) use it too.
A failed body leaves nothing behind: the staging (or data) file is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tierd.errors import FsError, Reason, no_space
from tierd.namespace.smalllog import SmallLog
from tierd.tiers.fileio import INLINE_BYTES, pwritev_all
from tierd.tiers.hotdir import HotDir

if TYPE_CHECKING:
    from tierd.placement import Placement

BATCH = 1 << 20

T = TypeVar("T")


def full_error(e: OSError, what: str, nbytes: int) -> FsError:
    """The ENOSPC to answer for a write of ``nbytes`` (``what``) the hot tier cannot take."""
    if isinstance(e, FsError):
        return e
    return FsError(e.errno or errno.ENOSPC, f"the hot tier is full: {what} of {nbytes} "
                   "bytes does not fit and no clean (persisted) data is left to evict; "
                   f"retry once the cold store has taken the dirty data ({e.strerror})")


def refuse_over_dirty_limit(placement: Placement) -> None:
    """Backpressure of every S3 write that adds dirty bytes (PUT, CopyObject, UploadPart,
    UploadPartCopy, CompleteMultipartUpload): past ``dirty_limit`` it is refused with
    503 SlowDown before any byte is taken (the FUSE door waits instead:
    ``Placement.admit``)."""
    if placement.over_dirty_limit():
        raise FsError(errno.EAGAIN, "too much data is waiting to be persisted to the cold "
                      "store; retry later", reason=Reason.SLOW_DOWN)


async def retry_full(placement: Placement, nbytes: int,
                     write: Callable[[], Awaitable[T]], what: str = "a write",
                     *, again: bool = True) -> T:
    """``await write()``; on ENOSPC evict clean data and, if that freed anything, await
    it once more (``again=False``: never -- a write that cannot be repeated, such as the
    ``fsync`` of bytes an earlier call wrote).  ENOSPC that remains is raised as
    :func:`full_error`."""
    try:
        return await write()
    except OSError as e:
        if not no_space(e):
            raise
        if not again or not await placement.room_for_write(
                nbytes, failed=True):
            raise full_error(e, what, nbytes) from e
    try:
        return await write()
    except OSError as e:
        if not no_space(e):
            raise
        raise full_error(e, what, nbytes) from e


async def close_source(chunks: AsyncIterator[Any]) -> None:
    """Close a body's iterator that its consumer leaves early (a refused or failed
    write).  Left to the garbage collector, a chain of async generators whose reader task
    is still pending is finalized in no fixed order: the task is destroyed while pending
    and the generators' ``aclose`` run while another of them is still running.  Closing
    here, on the consumer's task, unwinds the chain in order and stops the socket reads."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


def _hash_batch(md5: hashlib._Hash, chunks: list[bytes]) -> None:
    for c in chunks:
        md5.update(c)


def _finish(hot: HotDir, fd: int, chunks: list[bytes], offset: int, path: str,
            install_as: int) -> None:
    """The last thread hop of a staged upload: write, sync, and maybe install."""
    pwritev_all(fd, chunks, offset)
    os.fdatasync(fd)
    if install_as:
        hot.install_durable(path, install_as)


async def stage_body(
    hot: HotDir, body: AsyncIterable[bytes], placement: Placement, install_as: int = 0,
    smalllog: SmallLog | None = None,
) -> tuple[str, int, str, bytes | None]:
    """Write ``body`` to a new fsynced staging file: (path, size, MD5 hex).  On any error
    (including the body iterator raising: a bad checksum, a client gone) the file is
    removed and the error propagates.

    With ``install_as`` (a fresh inode number) the data ends up durably as that inode's
    data file instead, and the returned path is that file's: a small body is written there
    directly, a large one staged and renamed in the same thread hop as its last write.

    With ``smalllog`` admitting it, a small body's data file is only written, not synced,
    and the bytes are returned (last item) for the caller to log in its commit
    (:mod:`tierd.namespace.smalllog`); otherwise that item is None.

    On ENOSPC, ``placement`` makes room and the write is retried (:func:`retry_full`)."""
    path, fd = "", -1
    md5 = hashlib.md5()
    size = 0
    pending: list[bytes] = []
    pending_len = 0
    inflight: asyncio.Future[tuple[None, None]] | None = None

    async def flush_batch() -> None:
        nonlocal pending, pending_len, inflight, size, path, fd
        if inflight is not None:
            await inflight
            inflight = None
        if not pending:
            return
        if fd < 0:
            path, fd = hot.new_temp()
        chunks, offset, n = pending, size, pending_len
        size += pending_len
        pending, pending_len = [], 0
        inflight = asyncio.gather(
            retry_full(placement, n, lambda: asyncio.to_thread(pwritev_all, fd, chunks, offset),
                       "an upload"),
            asyncio.to_thread(_hash_batch, md5, chunks),
        )

    chunks = aiter(body)
    try:
        async for chunk in chunks:
            if not chunk:
                continue
            pending.append(bytes(chunk))
            pending_len += len(chunk)
            if pending_len >= BATCH:
                await flush_batch()
        if fd < 0 and pending_len <= INLINE_BYTES:
            # a small object (most of them): hashed here, one thread hop for the rest
            _hash_batch(md5, pending)
            size = pending_len
            if install_as:
                # straight into the fresh inode's data file (no staging file, no rename:
                # the number is new, nothing sees the file before the metadata names it),
                # made durable by the caller's log record or with other small files
                logged = smalllog is not None and smalllog.admits(size)
                await retry_full(placement, size, lambda: hot.write_new(
                    install_as, pending, durable=not logged), "an upload")
                data = b"".join(pending) if logged else None
                return hot.path(install_as), size, md5.hexdigest(), data
            path, fd = hot.new_temp()
            await retry_full(placement, size, lambda: asyncio.to_thread(
                _finish, hot, fd, pending, 0, path, 0), "an upload")
        else:
            await flush_batch()
            if inflight is not None:
                await inflight
                inflight = None
            if fd < 0:
                path, fd = hot.new_temp()
            # (the sync of bytes written earlier: a failed one is never retried)
            await retry_full(placement, size, lambda: asyncio.to_thread(
                _finish, hot, fd, [], size, path, install_as), "an upload", again=False)
    except BaseException:
        await close_source(chunks)
        if inflight is not None:
            await asyncio.gather(inflight, return_exceptions=True)
        if fd >= 0:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if install_as:
            hot.remove(install_as)
        raise
    os.close(fd)
    return (hot.path(install_as) if install_as else path), size, md5.hexdigest(), None
