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
    data = await read_buffer(fd, size, offset)
    return data if isinstance(data, bytes) else bytes(data)


async def read_buffer(fd: int, size: int, offset: int) -> bytes | bytearray:
    """:func:`pread` without the final copy: the ``bytearray`` the bytes were read into is
    returned as it is (a FUSE read reply copies it to the kernel anyway; each extra copy of
    a 1 MiB read costs as much CPU as the rest of the daemon's work for it)."""
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
            if n == size:
                return buf
            if n == 0 and offset >= os.fstat(fd).st_size:
                return b""
            if n > 0:
                # a short read may just mean part of the range was not cached: finish in a
                # thread, into the same buffer
                with memoryview(buf) as whole, whole[n:] as view:
                    rest = await asyncio.to_thread(os.preadv, fd, [view], offset + n)
                del buf[n + rest:]  # after the views are released
                return buf
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
