"""Reads, writes, copies and syncs of local files: the one home of these helpers.

Every write of a whole buffer (:func:`pwrite_all`, :func:`pwritev_all`), every copy between
descriptors (:func:`copy_range`) and every directory sync (:func:`fsync_dir`) of the tiers,
the namespace and the key store goes through here, so a short write, a file system without
``copy_file_range`` or a forgotten ``O_CLOEXEC`` is handled once.  Those are blocking: call
them in a thread.  The async :func:`pread` and :func:`pwrite` are for the event loop.

A hop to a thread costs ~50 us (DESIGN.md); most reads of a hot tier hit the page cache.  So
reads try the syscall inline with RWF_NOWAIT, which fails with EAGAIN instead of blocking,
and go to a thread only then.  Buffered writes with RWF_NOWAIT are refused by many file
systems (ext4 answers EOPNOTSUPP): there, small writes (a page-cache copy of microseconds)
run inline and larger ones in a thread.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import sys
from collections.abc import Callable, Sequence

_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EINVAL)
#: Bytes of work cheap enough to do on the event loop; above it, a thread (hashlib, zlib and
#: the system calls release the GIL).  An MD5 of this many bytes, the slowest thing done
#: inline (~650 MB/s), takes ~0.1 ms and a page-cache copy ~10 µs: a tenth of the loop's
#: 1 ms budget at most, while a hop to a thread costs ~50 µs (DESIGN.md), so a smaller
#: piece would pay more for the hop than for the work.  The one threshold for hashing bodies
#: and chunks inline (S3 door, namespace staging and writes) and for writing inline where
#: RWF_NOWAIT is refused.
INLINE_BYTES = 64 << 10
#: how much one copy step moves: a stop request or a progress tick waits at most this long
COPY_CHUNK = 8 << 20
#: errors of ``copy_file_range`` that mean "not between these files": copy through a buffer
NO_COPY_RANGE = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP,
                           errno.EBADF})
#: buffers one ``pwritev`` may take (Linux's IOV_MAX; EINVAL beyond)
_IOV_MAX = 1024
Buffer = bytes | bytearray | memoryview


class _Support:
    read = bool(_NOWAIT)
    write = bool(_NOWAIT)


async def pread(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes at ``offset`` (fewer at end of file)."""
    if size <= 0:
        return b""
    if _Support.read:
        try:
            got = _pread_nowait(fd, size, offset)
        except BlockingIOError:
            got = None
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
            _Support.read = False
            got = None
        if got is not None:
            n = len(got)
            # a short read may just mean part of the range was not cached: finish in a thread
            if n == size or (n == 0 and offset >= os.fstat(fd).st_size):
                return got
            if n > 0:
                return got + await asyncio.to_thread(os.pread, fd, size - n, offset + n)
    return await asyncio.to_thread(os.pread, fd, size, offset)


def _pread_nowait_copying(fd: int, size: int, offset: int) -> bytes:
    """``preadv2(RWF_NOWAIT)`` into a bytearray, then a copy into ``bytes``."""
    buf = bytearray(size)
    n = os.preadv(fd, [buf], offset, _NOWAIT)
    return bytes(memoryview(buf)[:n])


def _direct_reader() -> Callable[[int, int, int], bytes] | None:
    """``preadv2(RWF_NOWAIT)`` straight into a new ``bytes`` object, as CPython's own
    ``os.pread`` fills the object it returns (one copy, page cache -> result; the
    bytearray route costs a zero-fill and a second copy: a 1 MiB re-read from the page cache
    ran at 8 GB/s that way and at 21 GB/s this way, the speed of ``os.pread``).  The object is
    filled before anything else can see it, and checked once here; None when this is not
    CPython or the check fails (the copying reader is used then)."""
    if sys.implementation.name != "cpython" or not _NOWAIT:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        preadv2 = libc.preadv2
    except (OSError, AttributeError):
        return None

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    preadv2.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_int, ctypes.c_int64,
                        ctypes.c_int]
    preadv2.restype = ctypes.c_ssize_t
    new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
    new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
    new_bytes.restype = ctypes.py_object
    data_offset = sys.getsizeof(b"") - 1  # PyBytesObject header; ob_sval follows

    def read(fd: int, size: int, offset: int) -> bytes:
        out: bytes = new_bytes(None, size)
        iov = IoVec(id(out) + data_offset, size)
        n = preadv2(fd, ctypes.byref(iov), 1, offset, _NOWAIT)
        if n < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return out if n == size else out[:n]

    probe = new_bytes(None, 3)
    ctypes.memmove(id(probe) + data_offset, b"abc", 3)
    return read if probe == b"abc" and len(probe) == 3 else None


_pread_nowait = _direct_reader() or _pread_nowait_copying


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
    elif view.nbytes <= INLINE_BYTES:
        pwrite_all(fd, view, offset)
        return view.nbytes
    if done < view.nbytes:
        await asyncio.to_thread(pwrite_all, fd, view[done:], offset + done)
    return view.nbytes


def pwrite_all(fd: int, data: Buffer, offset: int) -> None:
    """All of ``data`` at ``offset``, whatever short writes happen (blocking).  A failure
    leaves no view of ``data`` in this frame: the traceback keeps the frame, and a buffer
    with a view alive cannot be released (a caller writing from an ``mmap`` would get a
    BufferError from closing it instead of this OSError)."""
    view = memoryview(data)
    del data
    try:
        while view.nbytes:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n
    except BaseException:
        view.release()
        raise


def pwritev_all(fd: int, bufs: Sequence[Buffer], offset: int) -> None:
    """All of ``bufs``, one after the other, from ``offset`` on (blocking).  One
    ``pwritev`` per :data:`_IOV_MAX` buffers (a system call, not one a buffer); a short
    write (rare) is finished buffer by buffer."""
    total = 0
    for first in range(0, len(bufs), _IOV_MAX):
        group = bufs[first:first + _IOV_MAX]
        size = sum(memoryview(b).nbytes for b in group)
        done = os.pwritev(fd, group, offset + total) if size else 0
        pos = 0
        for b in group:
            view = memoryview(b)
            end = pos + view.nbytes
            if end > done:  # this buffer's tail (or all of it) was not written
                skip = max(0, done - pos)
                pwrite_all(fd, view[skip:], offset + total + pos + skip)
            pos = end
        total += size


def copy_range(src: int, dst: int, count: int, src_offset: int, dst_offset: int, *,
               digest: Callable[[bytes], object] | None = None,
               stop: Callable[[], bool] | None = None,
               tick: Callable[[], None] | None = None,
               read: Callable[[int, int, int], bytes] = os.pread,
               write: Callable[[int, bytes, int], None] = pwrite_all) -> int:
    """Copy up to ``count`` bytes from ``src`` at ``src_offset`` to ``dst`` at
    ``dst_offset`` (blocking); returns the bytes copied, fewer when ``src`` ends first or
    ``stop()`` turns true.  In the kernel (``copy_file_range``: no copy through user space,
    a reflink on btrfs/XFS) unless ``digest`` must see the bytes or the file systems refuse
    (:data:`NO_COPY_RANGE`); then through a buffer with ``read`` and ``write``, which a
    caller replaces to tell a source's faults from a destination's (``copy_file_range``'s
    own errors pass through as they are).  ``tick()`` after each :data:`COPY_CHUNK`."""
    done = 0
    in_kernel = digest is None
    while done < count:
        if stop is not None and stop():
            break
        if tick is not None:
            tick()
        n = min(COPY_CHUNK, count - done)
        if in_kernel:
            try:
                got = os.copy_file_range(src, dst, n, src_offset + done, dst_offset + done)
            except OSError as e:
                if e.errno not in NO_COPY_RANGE:
                    raise
                in_kernel = False
                continue
        else:
            data = read(src, n, src_offset + done)
            if digest is not None:
                digest(data)
            if data:
                write(dst, data, dst_offset + done)
            got = len(data)
        if got <= 0:
            break
        done += got
    return done


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of directory ``path`` durable (a created, renamed or removed name
    survives a crash only once its directory is synced; blocking)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_parent(path: str) -> None:
    """:func:`fsync_dir` of the directory holding ``path`` (its name made durable)."""
    fsync_dir(os.path.dirname(path))


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sfr = _sync_file_range()
SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing ``[offset, offset+length)`` of ``fd`` to the device without waiting
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``).  A large file written in batches and made
    durable at the end then has most of its pages on the device already when ``fdatasync``
    runs, instead of all of them queued behind it: a 2 GiB sendfile + fdatasync took 1.6 s
    here, with this after each 64 MiB batch 1.05 s.  Not a durability point (no metadata, no
    cache flush): the caller still syncs.  A no-op where the call is missing."""
    if _sfr is not None and length > 0:
        _sfr(fd, offset, length, SYNC_FILE_RANGE_WRITE)
