"""Small new files written and made durable in groups, by one thread.

A small PUT must have its data file durable (contents and directory entry) before it is
acknowledged.  Done per request -- create, write, ``fdatasync``, ``fsync`` of the shard
directory, in a thread from the shared pool -- eight requests in flight cost ~1 ms of
kernel CPU each on this kind of machine: concurrent creates and journal commits from many
threads contend on the file system's locks, and every file pays its own two journal
commits.  Measured on ext4 (2 cores, 2,000 x 16 KiB): 8 threads doing it per file 1.0 ms
of system CPU per file; one thread doing batches of 32 with one ``syncfs`` 0.19 ms.

So one thread takes every small file waiting, creates and writes them all, then makes the
whole group durable with one ``syncfs(2)`` of the tier's file system (the contents and the
directory entries of every file in it; the file system's journal commits once), and wakes
the writers.  Requests that arrive while a group is being synced form the next group, so
the group grows with the load and a lone request pays what it paid before (it gets an
``fdatasync`` and a directory ``fsync``, not a ``syncfs``: nothing to share, and a
``syncfs`` would also wait for unrelated dirty data).  ``syncfs`` reports write-back errors
of the file system since Linux 5.8; an error fails every file of the group.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable, Sequence

from tierd.tiers.fileio import pwritev_all

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def syncfs(fd: int) -> None:
    """``syncfs(2)``: write back and commit everything of the file system holding ``fd``."""
    if _libc.syncfs(fd) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class _Job:
    __slots__ = ("chunks", "done", "durable", "fd", "path")

    def __init__(self, path: str, chunks: Sequence[bytes | memoryview], durable: bool) -> None:
        self.path = path
        self.chunks = chunks
        self.durable = durable
        self.fd = -1
        self.done: cf.Future[None] = cf.Future()


class GroupWriter:
    """Creates files with given contents and makes them durable, in groups (module doc).

    ``open_new(path)`` returns a write descriptor on a new, empty file at ``path`` (it may
    create missing directories); ``fsync_dir(path)`` makes the directory entry durable."""

    def __init__(self, open_new: Callable[[str], int], fsync_dir: Callable[[str], None],
                 name: str = "tierd-group-sync") -> None:
        self._open_new = open_new
        self._fsync_dir = fsync_dir
        self._name = name
        self._lock = threading.Lock()
        self._more = threading.Condition(self._lock)
        self._jobs: list[_Job] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self.groups = 0  # groups handled, and files in them (tests look)
        self.files = 0

    async def write(self, path: str, chunks: Sequence[bytes | memoryview],
                    durable: bool = True) -> None:
        """Create ``path`` holding ``chunks`` and return once it is durable (or, with
        ``durable=False``, once it is written: the caller keeps the bytes safe elsewhere
        until a later :func:`syncfs`).  Cancelled, the file is still written and then
        removed: it is never left behind."""
        job = _Job(path, chunks, durable)
        with self._lock:
            if self._closed:
                raise RuntimeError("the group writer is closed")
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name,
                                                daemon=True)
                self._thread.start()
            self._more.notify()
        try:
            await asyncio.shield(asyncio.wrap_future(job.done))
        except asyncio.CancelledError:
            job.done.add_done_callback(lambda _: _unlink(path))
            raise

    def close(self) -> None:
        """Stop the thread once the files already handed in are durable."""
        with self._lock:
            self._closed = True
            self._more.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self._closed:
                    self._more.wait()
                if not self._jobs:
                    return
                group, self._jobs = self._jobs, []
            try:
                self._group(group)
            except BaseException as e:  # never leave a writer waiting on a dead thread
                for job in group:
                    if not job.done.done():
                        job.done.set_exception(e)

    def _group(self, group: list[_Job]) -> None:
        # counted before any writer wakes, so a writer that returns sees its group counted
        self.groups += 1
        self.files += len(group)
        written: list[_Job] = []
        for job in group:
            try:
                job.fd = self._open_new(job.path)
                pwritev_all(job.fd, job.chunks, 0)
            except BaseException as e:
                _fail(job, e)
                continue
            if job.durable:
                written.append(job)
            else:  # in the page cache is all it asked for
                os.close(job.fd)
                job.done.set_result(None)
        try:
            if len(written) == 1:
                os.fdatasync(written[0].fd)
                self._fsync_dir(written[0].path)
            elif written:
                syncfs(written[0].fd)
        except BaseException as e:
            for job in written:
                _fail(job, e)
            written = []
        for job in written:
            os.close(job.fd)
            job.done.set_result(None)


def _fail(job: _Job, e: BaseException) -> None:
    if job.fd >= 0:
        os.close(job.fd)
        job.fd = -1
    _unlink(job.path)
    job.done.set_exception(e)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):  # clean-up only: missing, or never creatable
        os.unlink(path)
