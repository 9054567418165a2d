"""Polling ``/dev/fuse`` for a moment before the request loop sleeps (``fuse_poll_us``).

Why: a file operation is a conversation of requests -- a create is five (LOOKUP, CREATE,
FLUSH, the parent's GETATTR, RELEASE), four of which the caller waits for -- and between
two of them the loop has nothing to do for the few tens of microseconds the caller takes
to send the next.  When the loop goes back to ``epoll_wait`` for that gap its CPU goes
idle, and the next request must wake it.  On a virtual machine whose idle vCPUs halt at
once (``guest_halt_poll_ns`` 0, as this project's VMs boot) that wake goes through the
host and costs more than the gap itself: the empty-handler loop (``bench/fuse_null.py``)
makes ~3,400 creates/s that way and ~19,000/s with the guest's halt polling on.  Reading the
device again without sleeping for up to the window catches the next request as the
kernel queues it; the caller's own wake-up still goes through the host.  Go's scheduler
spins the same way before it parks an idle thread, which is why FUSE daemons written in
Go (JuiceFS, rclone) get this without asking; the kernel's haltpoll driver does it for
the whole guest, where it is left on.

The window adapts as the guest's haltpoll governor's does: each gap is measured from the
first empty read to the next request; a gap longer than the window but within the most
it may be (``fuse_poll_us``) doubles the window (from a quarter of the most), one longer
than that halves it, down to none.  A stream of requests a few tens of microseconds apart
keeps the whole window; a sparse one (a stat every 20 ms) shrinks it to nothing, and costs
at most the quarter window per burst after that.  The window is never polled while a
request of this session waits for something (its result comes through the loop), and it
is polled once per ``_readable`` call at most, so the loop's other callbacks wait no longer
than that.  Polling releases the GIL in each ``readv`` as sleeping does.  docs/fuse.md
("Polling the device before sleeping") has the measurements.
"""

from __future__ import annotations

import time


class DevicePoll:
    """How long the request loop reads the device again before it sleeps."""

    __slots__ = ("_idle_since", "grow_start_ns", "hits", "max_ns", "misses", "window_ns")

    def __init__(self, window_us: int) -> None:
        self.max_ns = window_us * 1000
        self.window_ns = self.max_ns  # this gap's window (adapted: _adjust)
        self.grow_start_ns = max(1000, self.max_ns // 4)
        #: windows that found a request / that ended without one (tests)
        self.hits = 0
        self.misses = 0
        self._idle_since = 0  # when the device was last found empty (0: not idle)

    def empty(self) -> None:
        """The device had no request: a gap starts (unless one has already)."""
        if not self._idle_since:
            self._idle_since = time.monotonic_ns()

    def deadline(self) -> int:
        """The end of the window the loop may poll for in this callback
        (``time.monotonic_ns``), or 0: sleep now."""
        return time.monotonic_ns() + self.window_ns if self.window_ns else 0

    def found(self) -> None:
        """A request was read: one that ended a gap came within the window, which stays
        as it is."""
        if self._idle_since:
            self.hits += 1
            self._idle_since = 0

    def expired(self, deadline: int) -> bool:
        """Whether the window ending at ``deadline`` is over (the loop then sleeps, and the
        gap goes on until :meth:`woke`)."""
        if time.monotonic_ns() < deadline:
            return False
        self.misses += 1
        return True

    def busy(self) -> None:
        """The loop goes back to a request that waits: the gap is not an idle one."""
        self._idle_since = 0

    def woke(self) -> None:
        """The device became readable while the loop slept on it."""
        if self._idle_since:
            self._adjust(time.monotonic_ns() - self._idle_since)
            self._idle_since = 0

    def _adjust(self, gap: int) -> None:
        if self.window_ns < gap <= self.max_ns:  # a longer window would have caught it
            self.window_ns = min(self.max_ns, max(self.window_ns * 2, self.grow_start_ns))
        elif gap > self.max_ns:  # no window would have
            self.window_ns //= 2
            if self.window_ns < self.grow_start_ns:
                self.window_ns = 0
