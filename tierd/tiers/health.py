"""Reachability of a cold store, from the outcomes of its calls.

Every call an :class:`~tierd.tiers.object_tier.ObjectTier` makes goes through
:meth:`Health.begin`/:meth:`Health.end`, and long transfers report :meth:`Health.progress`.
The store is *reachable* while the last outcome was an answer and no call has waited longer
than the tier's ``call_timeout`` since the last answer: a hung store (a stopped process, a
dead NFS server) shows as unreachable even when no call ever returns.
"""

from __future__ import annotations

import time
from typing import Any


class Health:
    """Reachability of a store, from the outcomes of its calls (see the module docstring).

    ``ok_at`` is when the store last answered (a call returned, even with "no such key", or
    a long transfer made progress), ``failed_at`` when a call last failed as unavailable;
    calls in flight are remembered by start time.  Threads may call :meth:`progress`."""

    def __init__(self) -> None:
        self.ok_at = time.monotonic()  # presumed reachable until a call says otherwise
        self.failed_at = 0.0
        self.error = ""
        self._calls: dict[int, float] = {}
        self._seq = 0

    def begin(self) -> int:
        self._seq += 1
        self._calls[self._seq] = time.monotonic()
        return self._seq

    def end(self, call: int, outcome: bool | None, error: str = "") -> None:
        """``True``: answered; ``False``: failed as unavailable (``error`` says how);
        ``None``: says nothing about the store (the caller's own error, a cancel)."""
        self._calls.pop(call, None)
        if outcome is True:
            self.ok_at = time.monotonic()
        elif outcome is False:
            self.failed_at = time.monotonic()
            self.error = error

    def progress(self) -> None:
        """A long call moved (bytes sent or received): the store is answering."""
        self.ok_at = time.monotonic()

    def stalled_for(self) -> float:
        """How long the oldest call started after the last answer has waited (0: none)."""
        waiting = [t for t in self._calls.values() if t > self.ok_at]
        return time.monotonic() - min(waiting) if waiting else 0.0

    def reachable(self, stall_after: float) -> bool:
        return self.failed_at <= self.ok_at and self.stalled_for() < stall_after

    def describe(self, stall_after: float) -> dict[str, Any]:
        """For status pages: reachability and the evidence for it."""
        now = time.monotonic()
        stalled = self.stalled_for()
        reason = ""
        if self.failed_at > self.ok_at:
            reason = self.error
        elif stalled >= stall_after:
            reason = f"a call has not answered for {stalled:.0f} s"
        return {"reachable": not reason, "reason": reason or None,
                "last_answer_seconds_ago": round(now - self.ok_at, 3),
                "calls_in_flight": len(self._calls),
                "timeout_seconds": stall_after}
