"""The passthrough writers' space watch (tierd_fuse.ptspace.SpaceWatch) adds a writer's
``inotify`` watch at the first look after its open, not at the open: a writer closed
before that look (most files of a create burst) costs no ``inotify_add_watch`` and
``inotify_rm_watch`` on the loop; one open across a look is watched, and a write to its
file wakes the next look before the poll would.  Real files and real inotify; the
namespace is reduced to what the watch calls (its headroom look, counted here)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, cast

import pytest
from tierd_fuse import ptspace
from tierd_fuse.ptspace import SpaceWatch


class _Room:
    """The one namespace call the watch makes: ``passthrough_room``, timed."""

    def __init__(self) -> None:
        self.looks: list[float] = []

    async def passthrough_room(self) -> int:
        self.looks.append(time.monotonic())
        return 0


def _watches(ifd: int) -> int:
    """The inotify watches on descriptor ``ifd`` of this process (its fdinfo lines)."""
    text = Path(f"/proc/self/fdinfo/{ifd}").read_text()
    return sum(1 for line in text.splitlines() if line.startswith("inotify wd:"))


def test_a_writer_closed_before_the_first_look_is_never_watched(tmp_path: Path) -> None:
    async def main() -> None:
        sw = SpaceWatch(cast(Any, _Room()))
        fds = [os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_RDWR, 0o644) for i in range(50)]
        try:
            for i, fd in enumerate(fds):  # a create burst: open, close, next
                sw.add(100 + i, fd)
                sw.remove(100 + i)
            await asyncio.sleep(ptspace.POLL * 3)
            assert sw._ifd == -1  # no inotify instance made, so no watch added or removed
        finally:
            sw.close()
            for fd in fds:
                os.close(fd)

    asyncio.run(main())


def test_a_writer_open_across_a_look_is_watched_and_its_writes_wake_the_watch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ptspace, "POLL", 0.5)  # a look sooner than this: the write woke it

    async def main() -> None:
        room = _Room()
        sw = SpaceWatch(cast(Any, room))
        fd = os.open(tmp_path / "long", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            sw.add(7, fd)
            deadline = time.monotonic() + 5
            while sw._ifd < 0 or _watches(sw._ifd) == 0:
                assert time.monotonic() < deadline, "the open writer was never watched"
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # the watch now waits for its next wake
            before = len(room.looks)
            t = time.monotonic()
            os.pwrite(fd, b"x" * 4096, 0)  # as the kernel's write of the backing file
            while len(room.looks) == before:
                await asyncio.sleep(0.0005)
            assert room.looks[before] - t < 0.25, room.looks[before] - t  # not the poll
            sw.remove(7)
            assert _watches(sw._ifd) == 0
        finally:
            sw.close()
            os.close(fd)

    asyncio.run(main())
