"""Reads and writes of local tier files without stalling the event loop needlessly.

A hop to a thread costs ~50 us (DESIGN.md); most reads of a hot tier hit the page cache.  So
reads try the syscall inline with RWF_NOWAIT, which fails with EAGAIN instead of blocking,
and go to a thread only then.  Buffered writes with RWF_NOWAIT are refused by many file
systems (ext4 answers EOPNOTSUPP): there, small writes (a page-cache copy of microseconds)
run inline and larger ones in a thread.
"""

from __future__ import annotations

import asyncio
import errno
import os

_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EINVAL)
INLINE_WRITE = 64 << 10


class _Support:
    read = bool(_NOWAIT)
    write = bool(_NOWAIT)


async def pread(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes at ``offset`` (fewer at end of file)."""
    if size <= 0:
        return b""
    if _Support.read:
        buf = bytearray(size)
        try:
            n = os.preadv(fd, [buf], offset, _NOWAIT)
        except BlockingIOError:
            pass
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
            _Support.read = False
        else:
            # a short read may just mean part of the range was not cached: finish in a thread
            if n == size or (n == 0 and offset >= os.fstat(fd).st_size):
                return bytes(buf[:n])
            if n > 0:
                rest = await asyncio.to_thread(os.pread, fd, size - n, offset + n)
                return bytes(buf[:n]) + rest
    return await asyncio.to_thread(os.pread, fd, size, offset)


async def pwrite(fd: int, data: bytes | memoryview, offset: int) -> int:
    """Write all of ``data`` at ``offset``."""
    view = memoryview(data)
    done = 0
    if _Support.write:
        try:
            done = os.pwritev(fd, [view], offset, _NOWAIT)
        except BlockingIOError:
            done = 0
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
            _Support.write = False
    elif view.nbytes <= INLINE_WRITE:
        _pwrite_all(fd, view, offset)
        return view.nbytes
    if done < view.nbytes:
        await asyncio.to_thread(_pwrite_all, fd, view[done:], offset + done)
    return view.nbytes


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
