"""A :class:`tierd_fuse.kdev.KernelSession` over test operations on a real mount, for tests
of the request loop itself (no daemon, no namespace): mounted with mount(2), so root only."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from public_dir import public_tempdir
from tierd_fuse.kdev import KernelSession
from tierd_fuse.mount import kernel_device, mount_options, unmount


@contextmanager
def kernel_session(ops: object, prefix: str, **session: Any,
                   ) -> Iterator[tuple[Path, KernelSession, asyncio.AbstractEventLoop]]:
    """``ops`` served at a fresh mount point; the loop runs whenever the test runs it
    (``loop.run_until_complete``).  Unmounted, and the session closed, after."""
    with public_tempdir(prefix) as tmp:
        mnt = tmp / "mnt"
        mnt.mkdir()
        loop = asyncio.new_event_loop()
        fd = kernel_device(mnt, mount_options(True))
        s = KernelSession(cast(Any, ops), fd, **session)
        served = loop.create_task(s.serve())
        try:
            yield mnt, s, loop
        finally:
            unmount(mnt, lazy=True)
            s.terminate()
            loop.run_until_complete(served)
            s.close()
            loop.close()
