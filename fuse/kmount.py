"""Mounting for the kernel backend (``fuse_backend = "kernel"``): a ``/dev/fuse`` descriptor
and the :class:`~tierd_fuse.kdev.KernelSession` that serves it.

As root the door mounts by itself with ``mount(2)`` (:func:`tierd_fuse.mount.mount_posixacl`:
``fd=N,rootmode=40000,user_id=0,group_id=0[,allow_other]`` with ``MS_POSIXACL``, so the
kernel leaves the umask to the daemon); otherwise ``fusermount3`` mounts and passes the
descriptor back over a socket (``_FUSE_COMMFD``, libfuse's own protocol).  Unmounting is
:func:`tierd_fuse.mount.unmount` as for the pyfuse3 backend.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from .kdev import KernelSession
from .mount import MountError, find_mount, mount_posixacl, unmount

if TYPE_CHECKING:
    from .ops import TierdOps


def fusermount_fd(mountpoint: Path, opts: set[str]) -> int:
    """Mount through ``fusermount3`` (no root needed) and return the device descriptor it
    sends back."""
    if shutil.which("fusermount3") is None:
        raise MountError("the kernel FUSE backend needs root or fusermount3")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        env = dict(os.environ, _FUSE_COMMFD=str(theirs.fileno()))
        r = subprocess.run(["fusermount3", "-o", ",".join(sorted(opts)), "--", str(mountpoint)],
                           env=env, pass_fds=(theirs.fileno(),), capture_output=True,
                           text=True, timeout=30, stdin=subprocess.DEVNULL)
        theirs.close()
        if r.returncode != 0:
            raise MountError(f"fusermount3 cannot mount {mountpoint}: "
                             f"{(r.stderr or r.stdout).strip()}")
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    finally:
        ours.close()
        theirs.close()
    if not fds:
        raise MountError(f"fusermount3 mounted {mountpoint} but sent no descriptor")
    return fds[0]


class KernelBackend:
    """The mount's device descriptor and its session (start once, close once)."""

    def __init__(self, ops: TierdOps, mountpoint: Path, *, passthrough: bool = False,
                 max_tasks: int = 64) -> None:
        self.ops = ops
        self.mountpoint = mountpoint
        self.passthrough = passthrough
        self.max_tasks = max_tasks
        self.session: KernelSession | None = None

    def mount(self, opts: set[str]) -> None:
        """Mount (blocking: run it in a thread); requests wait in the kernel until
        :meth:`serve` answers INIT."""
        fd = mount_posixacl(self.mountpoint, "allow_other" in opts)
        if fd is None:
            fd = fusermount_fd(self.mountpoint, opts)
        self.session = KernelSession(self.ops, fd, passthrough=self.passthrough,
                                     max_tasks=self.max_tasks)

    async def serve(self) -> None:
        assert self.session is not None
        await self.session.serve()

    def terminate(self) -> None:
        if self.session is not None:
            self.session.terminate()

    def close(self, unmount_it: bool) -> None:
        """Close the device (the kernel fails what is still pending with ENOTCONN), then
        unmount if asked and still mounted: lazily when busy."""
        if self.session is not None:
            self.session.close()
        if unmount_it and find_mount(self.mountpoint) is not None:
            try:
                unmount(self.mountpoint)
            except MountError:
                with contextlib.suppress(MountError):
                    unmount(self.mountpoint, lazy=True)
