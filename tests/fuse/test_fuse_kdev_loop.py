"""The kernel backend's request loop (tierd_fuse.kdev) on a real mount, with operations that
are only what the loop needs: a handler's first step runs as the request is read, and only
a handler that waits becomes a task (``_Resume`` carries it on).  Checked: an answer given
without waiting, one given after waiting, an errno raised after waiting, and an exception
of the awaited call thrown into the handler, which handles it -- each seen by a real
program's system call -- and that each request keeps a context of its own (a context
variable one handler sets is not seen by the next request, and is still there when a
waiting handler goes on).  The namespace's operations are not involved: the daemon's whole
suite (test_fuse_kernel.py and the others) runs them through the same loop.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
from kdev_mount import kernel_session
from tierd_fuse.kdev import KernelSession

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="mount(2) of the kernel backend needs root"),
]

ROOT = pyfuse3.ROOT_INODE
NAMES = {b"fast": 2, b"slow": 3, b"denied": 4, b"thrown": 5}
#: what one request's handler sets; each request has a context of its own
SEEN: ContextVar[bytes | None] = ContextVar("SEEN", default=None)


class LoopOps:
    """Lookups of four names: answered at once, after a sleep, EACCES after a sleep, and
    after an awaited call that fails (its OSError is caught by the handler)."""

    readdir_reply: Any = None

    def __init__(self) -> None:
        self.caught: list[str] = []

    def init(self) -> None:
        pass

    def _attrs(self, ino: int, size: int = 0) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.entry_timeout = a.attr_timeout = 0  # every stat asks again
        a.st_mode = (stat.S_IFDIR | 0o755) if ino == ROOT else (stat.S_IFREG | 0o644)
        a.st_nlink = 1
        a.st_size = size
        return a

    async def getattr(self, ino: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return await self.lookup(ROOT, next(n for n, i in NAMES.items() if i == ino), ctx) \
            if ino != ROOT else self._attrs(ROOT)

    async def lookup(self, parent: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        if SEEN.get() is not None:  # set by another request: contexts leak between them
            raise pyfuse3.FUSEError(errno.EIO)
        SEEN.set(name)
        ino = NAMES.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if name == b"slow":
            await asyncio.sleep(0.01)
            if SEEN.get() != name:  # the task goes on in the context its first step had
                raise pyfuse3.FUSEError(errno.EIO)
            return self._attrs(ino, 11)
        if name == b"denied":
            await asyncio.sleep(0.01)
            raise pyfuse3.FUSEError(errno.EACCES)
        if name == b"thrown":
            try:
                await asyncio.to_thread(os.stat, "/nonexistent/tierd-kdev-loop")
            except FileNotFoundError as e:
                self.caught.append(type(e).__name__)
                return self._attrs(ino, 13)
        return self._attrs(ino, 7)

    async def forget(self, inodes: Any) -> None:
        pass


STAT = r"""
import os, sys
for name in sys.argv[2:]:
    try:
        print(name, os.stat(os.path.join(sys.argv[1], name)).st_size)
    except OSError as e:
        print(name, os.strerror(e.errno))
"""


@pytest.fixture
def mounted() -> Iterator[tuple[Path, LoopOps, KernelSession, asyncio.AbstractEventLoop]]:
    ops = LoopOps()
    with kernel_session(ops, "tierd-kdev-loop-") as (mnt, session, loop):
        yield mnt, ops, session, loop


def test_answers_with_and_without_waiting(
        mounted: tuple[Path, LoopOps, KernelSession, asyncio.AbstractEventLoop]) -> None:
    mnt, ops, session, loop = mounted

    async def client() -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", STAT, str(mnt), "fast", "slow", "denied", "thrown",
            "missing", "fast", stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        return out.decode()

    out = loop.run_until_complete(asyncio.wait_for(client(), 60))
    assert out.splitlines() == [
        "fast 7", "slow 11", "denied Permission denied", "thrown 13",
        "missing No such file or directory", "fast 7"]
    assert ops.caught and set(ops.caught) == {"FileNotFoundError"}  # lookup, getattr
    assert not session._tasks  # every task that waited has finished and was dropped
