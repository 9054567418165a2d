"""Mount points and the mount's life cycle in the daemon's event loop.

* :func:`find_mount` reads ``/proc/self/mountinfo``.
* :func:`prepare_mountpoint` runs before mounting: a stale tierd mount (its daemon was
  killed; ``stat`` fails with ENOTCONN) is lazily unmounted; a live mount of anything is
  refused with a message naming it (a second mount would hide the first one's files).
* :class:`FuseDoor` mounts (pyfuse3, or :func:`kernel_device` for the kernel backend's
  :class:`~tierd_fuse.kdev.KernelSession`), serves requests as tasks of the daemon's loop,
  and unmounts at shutdown.  When the mount disappears from outside (``tierd umount``,
  ``fusermount3 -u``), the door closes and calls ``on_unmounted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyfuse3
import pyfuse3.asyncio

from tierd.logs import get_logger, kv
from tierd.metrics import Metrics
from tierd.namespace.api import NamespaceAPI

from .kdev import KernelSession
from .ops import TierdOps

log = get_logger("fuse")

FSNAME = "tierd"
#: the mount's source as ``mount``/``df`` show it.  Not a plain word: util-linux shows a
#: source that names something in the lister's directory as that path (``$PWD/tierd``)
SOURCE = f"{FSNAME}:"
#: seconds to wait for a stat of an existing mount point (a hung FUSE server never answers)
STAT_TIMEOUT = 5.0
#: seconds to wait for in-flight requests at shutdown
STOP_TIMEOUT = 10.0
#: the kernel's read-ahead window for the mount (KiB).  FUSE mounts start with 128 KiB,
#: which libfuse cannot raise (``max_readahead`` only lowers it), so a sequential reader's
#: requests come as 128-256 KiB reads one or two at a time.  4 MiB lets the kernel send
#: 1 MiB requests (``max_pages``) several at once, which the daemon serves concurrently;
#: measured on the development VM, a page-cache-dropped 2 GiB read went from 0.64x to
#: 0.79x of the raw tier (median of 3; docs/fuse.md, "Performance").
READ_AHEAD_KIB = 4096


class MountError(Exception):
    """The mount point cannot be used; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class MountInfo:
    mountpoint: str
    fstype: str
    source: str
    options: str
    dev: str = ""  # "major:minor" of the mounted file system (its BDI's name in sysfs)


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    out = bytearray()
    raw = field.encode()
    i = 0
    while i < len(raw):
        if raw[i] == 0x5C and i + 3 < len(raw) and raw[i + 1:i + 4].isdigit():
            out.append(int(raw[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode(errors="surrogateescape")


def find_mount(path: str | Path) -> MountInfo | None:
    """The mount whose mount point is exactly ``path`` (the last one if stacked)."""
    target = os.path.abspath(path)
    found: MountInfo | None = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                rfields = right.split()
                if len(fields) < 6 or len(rfields) < 2:
                    continue
                if _unescape(fields[4]) == target:
                    found = MountInfo(target, rfields[0], _unescape(rfields[1]), fields[5],
                                      fields[2])
    except OSError:
        return None
    return found


def _stat_state(path: str) -> int:
    """0 when the file system at ``path`` answers, else the errno.  ``statvfs``: a stat of a
    FUSE mount's root may be answered from the kernel's attribute cache after its server
    died; statfs always asks the server (ENOTCONN from a dead one)."""
    try:
        os.statvfs(path)
    except OSError as e:
        return e.errno or errno.EIO
    return 0


def unmount(path: str | Path, lazy: bool = False) -> None:
    """Unmount a FUSE mount: ``fusermount3 -u`` (works without root), ``umount`` as
    fallback.  Raises :class:`MountError` with the tool's message (e.g. busy)."""
    target = os.path.abspath(path)
    cmds: list[list[str]] = []
    if shutil.which("fusermount3"):
        cmds.append(["fusermount3", "-u", *(["-z"] if lazy else []), target])
    if os.geteuid() == 0 and shutil.which("umount"):
        cmds.append(["umount", *(["-l"] if lazy else []), target])
    if not cmds:
        raise MountError("neither fusermount3 nor umount is installed")
    why = ""
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
        if r.returncode == 0 or find_mount(target) is None:
            return
        why = (r.stderr or r.stdout).strip()
    raise MountError(f"cannot unmount {target}: {why}")


async def prepare_mountpoint(path: Path) -> Path:
    """Make ``path`` a usable, unused directory; clear a stale mount left by a killed
    daemon.  Returns the absolute path."""
    target = Path(os.path.abspath(path))
    info = find_mount(target)
    if info is not None:
        err = await _answer(target)
        if err is None:
            raise MountError(
                f"mount point {target} is already mounted ({info.fstype} from {info.source}) "
                f"and does not answer: unmount it first (tierd umount --lazy {target})"
            ) from None
        if err == errno.ENOTCONN:
            await _clear(target, info)
        else:
            raise MountError(
                f"mount point {target} is busy: {info.fstype} from {info.source} is mounted "
                f"there; unmount it first (tierd umount {target}) or choose another mount"
            )
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MountError(f"cannot create mount point {target}: {e.strerror}") from None
    if not target.is_dir():
        raise MountError(f"mount point {target} is not a directory")
    return target


async def clear_if_stale(path: Path) -> bool:
    """Unmount a FUSE mount at ``path`` whose server is gone (``ENOTCONN``), and nothing
    else: a live mount, one that does not answer, or none at all stays as it is.  True when
    one was cleared.  For a mount point the daemon no longer owns (the one a killed daemon
    of this data directory had attached at run time), so never an error."""
    target = Path(os.path.abspath(path))
    info = find_mount(target)
    if info is None or not info.fstype.startswith("fuse"):
        return False
    if await _answer(target) != errno.ENOTCONN:
        return False
    await _clear(target, info)
    return True


async def _answer(target: Path) -> int | None:
    """The errno a ``statvfs`` of the mount point gets (0: it answered), None when it
    does not answer within :data:`STAT_TIMEOUT`."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(_stat_state, str(target)),
                                      STAT_TIMEOUT)
    except TimeoutError:
        return None


async def _clear(target: Path, info: MountInfo) -> None:
    log.warning("clearing stale mount at %s (%s from %s): its server is gone",
                target, info.fstype, info.source)
    await asyncio.to_thread(unmount, target, True)


def set_read_ahead(mountpoint: Path, kib: int = READ_AHEAD_KIB) -> bool:
    """Set the mount's kernel read-ahead (``/sys/class/bdi/<major:minor>/read_ahead_kb``,
    root only).  The device comes from mountinfo: a stat of the mount point would wait for
    the FUSE loop, which is not serving yet.  False (and a log line) when it cannot be set."""
    info = find_mount(mountpoint)
    if info is None or not info.dev:
        return False
    path = f"/sys/class/bdi/{info.dev}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(f"{kib}\n")
    except OSError as e:
        log.info("kernel read-ahead of the mount stays at its default: cannot write %s (%s)",
                 path, e.strerror)
        return False
    return True


def mount_options(allow_other: bool | None = None) -> set[str]:
    """Kernel mount options: ``allow_other`` so every user of the machine reaches the mount
    when permitted.  (The kernel checks permissions too -- ``default_permissions`` -- because
    the operations ask for POSIX ACLs at INIT: :attr:`OpsBase.enable_acl`.)"""
    opts = {f"fsname={SOURCE}", f"subtype={FSNAME}", "noatime"}
    if allow_other is None:
        allow_other = os.geteuid() == 0 or _user_allow_other()
    if allow_other:
        opts.add("allow_other")
    else:
        log.warning("mounting without allow_other: only this user can use the mount "
                    "(add user_allow_other to /etc/fuse.conf or run as root)")
    return opts


MS_NOSUID, MS_NODEV, MS_NOATIME, MS_POSIXACL = 0x2, 0x4, 0x400, 0x10000


def mount_posixacl(mountpoint: Path, allow_other: bool) -> int | None:
    """Mount a FUSE file system at ``mountpoint`` as libfuse would, plus MS_POSIXACL, and
    return the ``/dev/fuse`` descriptor for the session; None (libfuse mounts then) unless
    running as root or when the kernel refuses.

    Why: FUSE applies the caller's umask to the create mode before the daemon sees it,
    unless the super block was mounted with MS_POSIXACL (then it leaves that to the file
    system: the kernel's ``dont_mask``).  A default ACL must be combined with the *unmasked*
    mode (``posix_acl_create``), which only this mount gives the daemon; libfuse cannot
    pass the flag (pyfuse3 does not ask for FUSE_CAP_DONT_MASK either).  (The kernel's own
    permission checks come from FUSE_POSIX_ACL at INIT, not from this flag.)"""
    if os.geteuid() != 0:
        return None
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None  # libfuse then fails with its own message
    data = (f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}"
            + (",allow_other" if allow_other else ""))
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(SOURCE.encode(), str(mountpoint).encode(), f"fuse.{FSNAME}".encode(),
                    ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOATIME | MS_POSIXACL),
                    data.encode())
    if rc != 0:
        err = ctypes.get_errno()
        os.close(fd)
        log.warning("mounting with MS_POSIXACL failed (%s); libfuse mounts instead, and "
                    "new files under a default ACL get the umask-masked mode",
                    os.strerror(err))
        return None
    return fd


def fusermount_fd(mountpoint: Path, opts: set[str]) -> int:
    """Mount through ``fusermount3`` (no root needed) and return the ``/dev/fuse``
    descriptor it sends back over a socket (``_FUSE_COMMFD``, libfuse's own protocol)."""
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


def kernel_device(mountpoint: Path, opts: set[str]) -> int:
    """Mount for the kernel backend and return the session's ``/dev/fuse`` descriptor
    (blocking: run it in a thread): by itself with MS_POSIXACL as root
    (:func:`mount_posixacl`), else through ``fusermount3``.  Requests wait in the kernel
    until the session answers INIT."""
    fd = mount_posixacl(mountpoint, "allow_other" in opts)
    return fd if fd is not None else fusermount_fd(mountpoint, opts)


def _user_allow_other() -> bool:
    try:
        with open("/etc/fuse.conf") as f:
            return any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        return False


class FuseDoor:
    """The mount of one namespace; start once, stop once (pyfuse3 allows one per process)."""

    def __init__(
        self,
        ns: NamespaceAPI,
        mountpoint: Path,
        *,
        on_unmounted: Callable[[], None] | None = None,
        max_tasks: int = 64,
        metrics: Metrics | None = None,
        backend: str = "pyfuse3",
        passthrough: bool = False,
        passthrough_writes: bool = False,
        poll_us: int = 0,
    ) -> None:
        self.ns = ns
        self.mountpoint = Path(os.path.abspath(mountpoint))
        self.ops = TierdOps(ns)
        self.ops.metrics = metrics  # requests per operation, outstanding requests
        self.invalidator = self.ops.invalidator
        self.on_unmounted = on_unmounted
        self.max_tasks = max_tasks
        self._task: asyncio.Task[None] | None = None
        #: "kernel": the door speaks the FUSE protocol itself (tierd_fuse.kdev), else pyfuse3
        self.backend = backend
        self.passthrough = passthrough
        self.passthrough_writes = passthrough_writes
        self.poll_us = poll_us  # the kernel backend's device polling (kpoll.py)
        self._kernel: KernelSession | None = None
        self._session = False
        self._stopping = False

    async def start(self) -> None:
        self.mountpoint = await prepare_mountpoint(self.mountpoint)
        opts = mount_options()
        mountpoint = self.mountpoint
        # after the INIT reply: the kernel clamps the read-ahead while it processes it
        self.ops.after_init = lambda: set_read_ahead(mountpoint)
        try:
            if self.backend == "kernel":
                fd = await asyncio.to_thread(kernel_device, self.mountpoint, opts)
                self._kernel = KernelSession(self.ops, fd, passthrough=self.passthrough,
                                             passthrough_writes=self.passthrough_writes,
                                             max_tasks=self.max_tasks,
                                             poll_us=self.poll_us)
                self.invalidator.notifier = self._kernel
            else:
                pyfuse3.asyncio.enable()
                await asyncio.to_thread(self._init, opts)
        except RuntimeError as e:
            raise MountError(f"cannot mount {self.mountpoint}: {e} (is /dev/fuse usable "
                             "and fusermount3 installed?)") from None
        self._session = True
        info = find_mount(self.mountpoint)
        self.ops.mount_dev = info.dev if info is not None else ""
        self.ns.subscribe(self.invalidator.on_change)
        self.invalidator.start()
        self._task = asyncio.create_task(self._serve(), name="tierd-fuse")
        log.info("mounted", extra=kv(mountpoint=str(self.mountpoint), backend=self.backend,
                                        options=",".join(sorted(opts))))

    def _init(self, opts: set[str]) -> None:
        """Mount and start the session (blocking: runs in a thread).  As root the door
        mounts by itself with MS_POSIXACL (:func:`mount_posixacl`), so that the kernel
        hands the umask to the daemon; otherwise libfuse (fusermount3) mounts."""
        fd = mount_posixacl(self.mountpoint, "allow_other" in opts)
        if fd is None:
            pyfuse3.init(self.ops, str(self.mountpoint), opts)
            return
        try:
            pyfuse3.init(self.ops, f"/dev/fd/{fd}", opts)  # libfuse takes the fd as is
        except BaseException:
            os.close(fd)
            with contextlib.suppress(MountError):
                unmount(self.mountpoint, lazy=True)
            raise

    async def _serve(self) -> None:
        try:
            if self._kernel is not None:
                await self._kernel.serve()
            else:
                await pyfuse3.main(min_tasks=2, max_tasks=self.max_tasks)
        except Exception:
            log.exception("FUSE session failed")
        if not self._stopping:
            log.warning("the mount at %s went away (unmounted from outside): the FUSE door "
                        "is closed", self.mountpoint)
            await self._close(unmount=False)
            if self.on_unmounted is not None:
                self.on_unmounted()

    async def stop(self) -> None:
        """Unmount while still serving, so the kernel's last requests (the RELEASE of files
        just closed, FORGETs) are answered before the session ends; if the mount is busy
        (a process has a file open or its working directory inside), end the session and
        detach the mount instead -- the namespace then releases what is still open."""
        if self._stopping or not self._session:
            return
        self._stopping = True
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.to_thread(unmount, self.mountpoint)
            except MountError as e:
                log.warning("%s; detaching the mount", e)
            else:  # the kernel ends the session once its pending requests are answered
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT)
        if task is not None and not task.done():
            if self._kernel is not None:
                self._kernel.terminate()
            else:
                pyfuse3.terminate()
            try:
                await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT)
            except TimeoutError:
                log.warning("FUSE requests still running after %.0f s; unmounting anyway",
                            STOP_TIMEOUT)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self._close(unmount=find_mount(self.mountpoint) is not None)
        log.info("unmounted", extra=kv(mountpoint=str(self.mountpoint)))

    async def _close(self, unmount: bool) -> None:
        if not self._session:
            return
        self._session = False
        self.ns.unsubscribe(self.invalidator.on_change)  # a later mount subscribes its own
        await asyncio.to_thread(self.invalidator.stop)
        if self._kernel is not None:
            # the kernel fails what is still pending with ENOTCONN.  On the loop: it drops
            # the passthrough opens' eviction holds, which are the namespace's state; the
            # plain unmount was tried by stop() already, so a busy mount is detached below
            self._kernel.close()
        else:
            await asyncio.to_thread(pyfuse3.close, unmount)
        if unmount and find_mount(self.mountpoint) is not None:
            # still there (busy): detach it
            with contextlib.suppress(MountError):
                await asyncio.to_thread(unmount_lazy, self.mountpoint)

    @property
    def mounted(self) -> bool:
        return self._session


def unmount_lazy(path: Path) -> None:
    unmount(path, lazy=True)
