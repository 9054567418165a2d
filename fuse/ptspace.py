"""The hot tier's free space while passthrough writers are open.

A passthrough write (fuse/kpass.py) goes from the kernel to the hot file: the daemon never
sees it, so it is not admitted by the placement engine first, and when the hot file system
is full the writer gets ``ENOSPC`` at once -- the WRITE path would have evicted clean data
and tried again (``tierd/namespace/staging.py`` ``retry_full``).  Nothing in the kernel lets
the daemon hold such a write back, so the door keeps **headroom** instead:
``NamespaceAPI.passthrough_room`` evicts clean data when the file system's free space is
below it, and this watch calls it

* when a passthrough writer's hot file is written: an ``inotify`` ``IN_MODIFY`` watch on
  each such file (the kernel's write of the backing file raises it) wakes the watch, at
  most once per :data:`MIN_GAP` (a writer of small blocks must not wake the daemon per
  write), and
* every :data:`POLL` seconds whatever happened (stores through a shared mapping raise no
  event).

A writer's ``inotify`` watch is added at the first look after its open, not at the open:
a file created, written a little and closed within one poll (a create burst: most of them)
costs no ``inotify_add_watch`` and ``inotify_rm_watch`` on the loop (about 60 us of
system calls a file, and the ctypes calls around them), and its writes are seen by the
poll meanwhile.

A look costs one ``statvfs`` (about 3 microseconds); eviction only happens below the
headroom.  What the watch cannot do is stop a writer that fills the headroom faster than
the daemon evicts (measured in docs/fuse.md, "Write passthrough").
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tierd.namespace.api import NamespaceAPI

log = logging.getLogger("tierd.fuse")

#: seconds between looks when no write event comes
POLL = 0.02
#: the least seconds between two looks woken by write events
MIN_GAP = 0.005
_IN_MODIFY = 0x2
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


def _wake(fut: asyncio.Future[None] | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


class SpaceWatch:
    """Keeps the hot tier's headroom while passthrough writers are open."""

    def __init__(self, ns: NamespaceAPI) -> None:
        self.ns = ns
        self._wds: dict[int, int] = {}  # ino -> inotify watch of its hot file
        #: ino -> (hot file descriptor, looks made before its open): writers not watched
        #: yet; the descriptor is the namespace's, open until the writer's release, whose
        #: :meth:`remove` comes first
        self._pending: dict[int, tuple[int, int]] = {}
        self._looks = 0
        self._ifd = -1
        self._libc: ctypes.CDLL | None = None
        self._wake: asyncio.Future[None] | None = None  # what the watch waits on now
        self._task: asyncio.Future[None] | None = None
        self._armed = False

    def add(self, ino: int, fd: int) -> None:
        """A passthrough writer of ``ino`` (hot file ``fd``) was opened: watched from the
        next look on (:meth:`_promote`)."""
        if ino not in self._wds and ino not in self._pending:
            self._pending[ino] = (fd, self._looks)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def remove(self, ino: int) -> None:
        """The last passthrough writer of ``ino`` went."""
        if self._pending.pop(ino, None) is not None:
            return  # never watched: no system call
        wd = self._wds.pop(ino, -1)
        if wd >= 0 and self._libc is not None:
            self._libc.inotify_rm_watch(self._ifd, wd)  # (-1 when the file went: harmless)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._disarm()
        if self._ifd >= 0:
            os.close(self._ifd)
            self._ifd = -1
        self._wds.clear()
        self._pending.clear()

    def _promote(self) -> None:
        """At a look: writers opened before the previous look, and open still, get their
        ``inotify`` watch."""
        if not self._pending:
            return
        due = [(ino, fd) for ino, (fd, seen) in self._pending.items() if seen < self._looks]
        for ino, fd in due:
            del self._pending[ino]
            self._wds[ino] = self._watch(fd)

    # -- inotify ---------------------------------------------------------------------------
    def _watch(self, fd: int) -> int:
        """An ``IN_MODIFY`` watch on the file of ``fd`` (-1 where inotify is unavailable:
        the poll alone then)."""
        try:
            if self._libc is None:
                self._libc = ctypes.CDLL(None, use_errno=True)
            if self._ifd < 0:
                ifd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
                if ifd < 0:
                    raise OSError(ctypes.get_errno(), "inotify_init1")
                self._ifd = ifd
            wd = int(self._libc.inotify_add_watch(
                self._ifd, f"/proc/self/fd/{fd}".encode(), _IN_MODIFY))
            if wd < 0:
                raise OSError(ctypes.get_errno(), "inotify_add_watch")
            return wd
        except (OSError, AttributeError) as e:
            log.warning("no write events of passthrough writers' hot files (%s): the free "
                        "space is polled every %.0f ms", e, POLL * 1000)
            return -1

    def _arm(self) -> None:
        if self._ifd >= 0 and not self._armed:
            asyncio.get_running_loop().add_reader(self._ifd, self._readable)
            self._armed = True

    def _disarm(self) -> None:
        if self._armed:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._ifd)
            self._armed = False

    def _readable(self) -> None:
        self._disarm()  # re-armed after the look (at most one wake per MIN_GAP)
        with contextlib.suppress(OSError):
            while os.read(self._ifd, 4096):
                pass
        _wake(self._wake)

    # -- the watch -------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._wds or self._pending:
                self._promote()
                self._arm()
                # (a future and a timer, not wait_for: no task per wake)
                self._wake = loop.create_future()
                timer = loop.call_later(POLL, _wake, self._wake)
                await self._wake
                timer.cancel()
                self._looks += 1
                try:
                    await self.ns.passthrough_room()
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        log.exception("making room for passthrough writers failed")
                except Exception:
                    log.exception("making room for passthrough writers failed")
                await asyncio.sleep(MIN_GAP)
        finally:
            self._disarm()
