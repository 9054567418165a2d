"""Reads and writes of local tier files without stalling the event loop needlessly.

A hop to a thread costs ~50 us (DESIGN.md); most reads of a hot tier hit the page cache.  So
try the syscall inline with RWF_NOWAIT, which fails with EAGAIN instead of blocking, and go
to a thread only then.
"""

from __future__ import annotations

import asyncio
import os

_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_nowait_ok = bool(_NOWAIT)


async def pread(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes at ``offset`` (fewer at end of file)."""
    global _nowait_ok
    if size <= 0:
        return b""
    if _nowait_ok:
        buf = bytearray(size)
        try:
            n = os.preadv(fd, [buf], offset, _NOWAIT)
        except BlockingIOError:
            pass
        except OSError as e:  # EOPNOTSUPP on file systems without RWF_NOWAIT
            if e.errno not in (95, 22):
                raise
            _nowait_ok = False
        else:
            # a short read may just mean part of the range was not cached: finish in a thread
            if n == size:
                return bytes(buf)
            if n > 0:
                rest = await asyncio.to_thread(os.pread, fd, size - n, offset + n)
                return bytes(buf[:n]) + rest
    return await asyncio.to_thread(os.pread, fd, size, offset)


async def pwrite(fd: int, data: bytes | memoryview, offset: int) -> int:
    """Write all of ``data`` at ``offset``."""
    global _nowait_ok
    view = memoryview(data)
    done = 0
    if _nowait_ok and view.nbytes:
        try:
            done = os.pwritev(fd, [view], offset, _NOWAIT)
        except BlockingIOError:
            done = 0
        except OSError as e:
            if e.errno not in (95, 22):
                raise
            _nowait_ok = False
    if done < view.nbytes:
        await asyncio.to_thread(_pwrite_all, fd, view[done:], offset + done)
    return view.nbytes


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
