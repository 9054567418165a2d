"""Tell the kernel about changes made through other doors (S3 PUT/DELETE, ...).

The namespace calls :meth:`Invalidator.on_change` synchronously on the event loop after an
object-door change.  The kernel notifications themselves can block: an entry invalidation
waits for a concurrent request on the same directory, and an inode invalidation waits for
writeback of dirty pages -- requests that this very loop must serve.  So notifications are
queued to one worker thread (in order: entry first, then the inode's data), never sent from
the loop.  ``on_change`` returns a future the worker completes once the change's
notifications are sent, and the object call waits for it before it answers its client
(``NamespaceBase._announce``; the loop serves requests meanwhile): an S3 DELETE
answered before the worker ran left a ``stat`` through the mount a moment in which the
kernel still had the entry.

Errors are expected and ignored: ENOENT means the kernel did not cache that entry or inode,
which is the cheap case.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyfuse3

from tierd.namespace import Change

log = logging.getLogger("tierd.fuse")


@dataclass(frozen=True, slots=True)
class _Entry:
    parent: int
    name: bytes


@dataclass(frozen=True, slots=True)
class _Inode:
    ino: int


#: a notification, and the future to complete once it is sent (the last of a change's)
_Job = tuple[_Entry | _Inode, "tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None"]


class Invalidator:
    """Queue of kernel cache invalidations, sent by one daemon thread."""

    def __init__(self, on_inode: Callable[[int], None] | None = None) -> None:
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._on_inode = on_inode
        #: who writes the notifications: pyfuse3's session, or the kernel backend's
        #: (tierd_fuse.kdev.KernelSession): both have invalidate_entry/invalidate_inode
        self.notifier: Any = pyfuse3
        self.sent = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tierd-fuse-invalidate",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the worker; must happen before the FUSE session is destroyed (the worker
        would otherwise notify a freed session)."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("kernel cache invalidation thread did not stop in %.0f s", timeout)
        self._thread = None

    def on_change(self, ch: Change) -> asyncio.Future[None] | None:
        """Namespace subscriber: runs on the loop, never blocks; the future the worker
        completes once the change's notifications are sent (see the module doc)."""
        if self._thread is None:
            return None
        jobs: list[_Entry | _Inode] = []
        if ch.parent is not None and ch.name is not None:
            jobs.append(_Entry(ch.parent, ch.name))
        if ch.ino is not None:
            if self._on_inode is not None:
                self._on_inode(ch.ino)
            jobs.append(_Inode(ch.ino))
        if not jobs:
            return None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        for job in jobs[:-1]:
            self._queue.put((job, None))
        self._queue.put((jobs[-1], (loop, fut)))
        return fut

    def attrs_now(self, ino: int) -> None:
        """Make the kernel drop the cached attributes (and ACLs) of ``ino`` now, on the
        calling thread (the loop): an attribute-only invalidation takes no page lock and
        waits for no request, unlike the page invalidations the worker sends."""
        try:
            if self.notifier is pyfuse3:
                pyfuse3.invalidate_inode(ino, attr_only=True)
            else:
                self.notifier.invalidate_attrs(ino)
            self.sent += 1
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTCONN, errno.EBADF):
                log.warning("kernel attribute invalidation of inode %d failed: %s", ino, e)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, done = item
            try:
                if isinstance(job, _Entry):
                    self.notifier.invalidate_entry(job.parent, job.name)
                else:
                    self.notifier.invalidate_inode(job.ino)
                self.sent += 1
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTCONN, errno.EBADF):
                    log.warning("kernel cache invalidation %s failed: %s", job, e)
            except Exception:
                log.exception("kernel cache invalidation %s failed", job)
            finally:
                if done is not None:
                    loop, fut = done
                    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
                        loop.call_soon_threadsafe(_set_done, fut)


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

