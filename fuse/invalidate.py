"""Tell the kernel about changes made through other doors (S3 PUT/DELETE, ...).

The namespace calls :meth:`Invalidator.on_change` synchronously on the event loop after an
object-door change.  The kernel notifications themselves can block: an entry invalidation
waits for a concurrent request on the same directory, and an inode invalidation waits for
writeback of dirty pages -- requests that this very loop must serve.  So notifications are
queued to one worker thread (in order: entry first, then the inode's data), never sent from
the loop.

Errors are expected and ignored: ENOENT means the kernel did not cache that entry or inode,
which is the cheap case.
"""

from __future__ import annotations

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


_Job = _Entry | _Inode | None


class Invalidator:
    """Queue of kernel cache invalidations, sent by one daemon thread."""

    def __init__(self, on_inode: Callable[[int], None] | None = None) -> None:
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
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

    def on_change(self, ch: Change) -> None:
        """Namespace subscriber: runs on the loop, never blocks."""
        if self._thread is None:
            return
        if ch.parent is not None and ch.name is not None:
            self._queue.put(_Entry(ch.parent, ch.name))
        if ch.ino is not None:
            if self._on_inode is not None:
                self._on_inode(ch.ino)
            self._queue.put(_Inode(ch.ino))

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
            job = self._queue.get()
            if job is None:
                return
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

