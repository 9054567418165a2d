"""Polling ``/dev/fuse`` before the request loop sleeps (``fuse_poll_us``, fuse/kpoll.py).

The window's rules on their own, with a clock the test moves: a request within the window
leaves it as it is, a gap longer than the window but within the most doubles it (from a
quarter), a longer one halves it down to none, and a short gap after that starts it again.
Then on a real mount: a program's stream of stats is answered with polling on (the windows
found requests, every answer is right, a handler that waits still finishes), and a sparse
one -- a stat every 20 ms, with 5 ms windows -- shrinks the window, so the loop's thread
spends about what the answers cost, not a window per gap.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
from kdev_mount import kernel_session
from tierd_fuse import kpoll
from tierd_fuse.kdev import KernelSession
from tierd_fuse.kpoll import DevicePoll

ROOT = pyfuse3.ROOT_INODE


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(kpoll.time, "monotonic_ns", c)
    return c


def gap(p: DevicePoll, clock: Clock, ns: int) -> bool:
    """One gap of ``ns`` as the request loop sees it: True if polling caught its end."""
    p.empty()
    d = p.deadline()
    if d and clock.ns + ns < d:
        clock.ns += ns
        p.found()
        return True
    clock.ns += ns
    if d:
        assert p.expired(d)
    p.woke()
    p.found()
    return False


def test_the_window_adapts_to_the_gaps(clock: Clock) -> None:
    p = DevicePoll(100)
    assert p.window_ns == 100_000 and p.grow_start_ns == 25_000
    assert gap(p, clock, 40_000) and p.window_ns == 100_000 and p.hits == 1
    assert not gap(p, clock, 5_000_000)  # longer than any window: halved
    assert p.window_ns == 50_000 and p.misses == 1
    assert not gap(p, clock, 5_000_000)
    assert p.window_ns == 25_000
    assert not gap(p, clock, 5_000_000)  # below the quarter: none
    assert p.window_ns == 0
    assert p.deadline() == 0  # the loop sleeps at once
    assert not gap(p, clock, 5_000_000)
    assert p.window_ns == 0 and p.misses == 3  # (no window, no miss)
    assert not gap(p, clock, 30_000)  # a window would have caught it: a quarter again
    assert p.window_ns == 25_000
    assert gap(p, clock, 20_000) and p.window_ns == 25_000
    assert not gap(p, clock, 60_000)  # longer than the window, within the most: doubled
    assert p.window_ns == 50_000
    assert not gap(p, clock, 90_000)
    assert p.window_ns == 100_000
    assert not gap(p, clock, 101_000)  # (just past the most: halved)
    assert p.window_ns == 50_000


def test_a_gap_spent_waiting_for_a_request_does_not_count(clock: Clock) -> None:
    p = DevicePoll(100)
    p.empty()
    p.busy()  # a handler waits for its result: the loop sleeps, not idle
    clock.ns += 10_000_000
    p.woke()
    assert p.window_ns == 100_000


class StatOps:
    """``fast`` answered at once, ``slow`` after a sleep (its handler becomes a task); no
    attribute caching, so every stat is a request."""

    readdir_reply: Any = None
    NAMES = {b"fast": 2, b"slow": 3}

    def init(self) -> None:
        pass

    def _attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.entry_timeout = a.attr_timeout = 0
        a.st_mode = (stat.S_IFDIR | 0o755) if ino == ROOT else (stat.S_IFREG | 0o644)
        a.st_nlink = 1
        a.st_size = ino * 10
        return a

    async def lookup(self, parent: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        ino = self.NAMES.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if name == b"slow":
            await asyncio.sleep(0.002)
        return self._attrs(ino)

    async def getattr(self, ino: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return self._attrs(ino)

    async def forget(self, inodes: Any) -> None:
        pass


STATS = r"""
import os, sys, time
sizes = []
for i in range(int(sys.argv[2])):
    name = "slow" if i % 50 == 0 else "fast"
    sizes.append(os.stat(os.path.join(sys.argv[1], name)).st_size)
    time.sleep(float(sys.argv[3]))
print(sorted(set(sizes)), len(sizes))
"""


@pytest.fixture
def polled(request: pytest.FixtureRequest,
           ) -> Iterator[tuple[Path, KernelSession, asyncio.AbstractEventLoop]]:
    if os.geteuid() != 0:
        pytest.skip("mount(2) of the kernel backend needs root")
    with kernel_session(StatOps(), "tierd-kpoll-", poll_us=request.param) as mounted:
        yield mounted


def stats(mnt: Path, loop: asyncio.AbstractEventLoop, n: int, pause: float) -> str:
    async def client() -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", STATS, str(mnt), str(n), str(pause), stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        return out.decode().strip()
    return loop.run_until_complete(asyncio.wait_for(client(), 60))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("polled", [200, 5000], ids=["200us", "5ms"], indirect=True)
def test_a_stream_of_requests_is_polled(
        polled: tuple[Path, KernelSession, asyncio.AbstractEventLoop]) -> None:
    mnt, session, loop = polled
    assert session.poll is not None
    assert stats(mnt, loop, 2000, 0) == "[20, 30] 2000"
    assert session.poll.hits > 100  # the stream's next requests were read without a sleep
    assert not session._tasks


@pytest.mark.timeout(120)
@pytest.mark.parametrize("polled", [5000], ids=["5ms"], indirect=True)
def test_a_sparse_stream_stops_the_polling(
        polled: tuple[Path, KernelSession, asyncio.AbstractEventLoop]) -> None:
    mnt, session, loop = polled
    assert session.poll is not None and session.poll.max_ns == 5_000_000
    t0 = time.thread_time()
    assert stats(mnt, loop, 60, 0.02) == "[20, 30] 60"  # 2 requests per stat, 20 ms apart
    spent = time.thread_time() - t0
    # the whole window every 20 ms would be 60 x 5 ms = 0.3 s; the quarter window that a
    # stat's two requests start again, 60 x 1.25 ms
    assert session.poll.window_ns < session.poll.max_ns
    assert spent < 0.2, f"the loop's thread used {spent:.3f} s of CPU for 60 sparse stats"
