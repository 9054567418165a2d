"""Shared state of the FUSE operations and the one place namespace errors become FUSE errors.

Every handler is wrapped by :func:`fs_errors`: a :class:`tierd.errors.FsError` (an OSError
with the errno the namespace chose) becomes ``pyfuse3.FUSEError(errno)``; any other OSError
keeps its errno; anything else is a bug, logged with its traceback and answered with EIO so
the calling process gets an error instead of a hung system call.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from tierd.acl import Identity
from tierd.errors import FsError
from tierd.logs import LogBudget, kv
from tierd.metrics import Metrics, errno_status
from tierd.namespace.api import Inode, NamespaceAPI

from .attrs import entry_attributes
from .handles import DirHandle, FileState, KernelCache
from .identity import Callers
from .invalidate import Invalidator
from .ptspace import SpaceWatch

log = logging.getLogger("tierd.fuse")

P = ParamSpec("P")
R = TypeVar("R")


#: refusals whose reason only tierd's rules give (a bucket name S3 would refuse, the root
#: holding only buckets, an ownership rule, a name too long): the program sees a bare errno,
#: so the log says why
EXPLAINED = frozenset({errno.EINVAL, errno.EPERM, errno.ENAMETOOLONG, errno.EOPNOTSUPP})
#: handlers whose subject is an inode the kernel reached through a cached entry: when that
#: inode is gone, its name was replaced or removed through another door (an S3 PUT over a
#: key makes a new inode) before the kernel's entry was invalidated -- the invalidation
#: travels on its own.  ENOENT there would fail an open or stat of a name that exists;
#: ESTALE makes the VFS walk the path again with every entry revalidated (a fresh LOOKUP),
#: as it does for NFS, so the caller sees the new file, or ENOENT if the name is gone too
STALE_OPS = frozenset({"getattr", "setattr", "open", "opendir", "access", "readlink",
                       "getxattr", "setxattr", "listxattr", "removexattr"})


class RefusalLog:
    """One info line per refusal, at most ``burst`` lines per ``window`` seconds (a program
    retrying in a loop must not flood the log); the first line after a suppressed spell
    says how many were left out (``suppressed=N``)."""

    def __init__(self, burst: int = 10, window: float = 10.0) -> None:
        self.budget = LogBudget(burst, window)

    def __call__(self, op: str, e: FsError, args: tuple[object, ...]) -> None:
        suppressed = self.budget.take()
        if suppressed is None:
            return
        fields: dict[str, object] = {
            "op": op, "errno": errno.errorcode.get(e.errno or 0, str(e.errno))}
        name = next((a for a in args if isinstance(a, bytes)), None)
        if name is not None:
            fields["name"] = name.decode(errors="replace")
        if suppressed:
            fields["suppressed"] = suppressed
        log.info("refused: %s", e.message, extra=kv(**fields))


refusals = RefusalLog()


def fs_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Translate exceptions of a handler into the errno the kernel passes to the caller,
    and count and time the request in the operations' :attr:`OpsBase.metrics` (FUSE door,
    operation = the handler's name, status = ``ok`` or the errno's name).  Refusals only
    tierd's rules explain are logged (:data:`EXPLAINED`, :class:`RefusalLog`)."""
    op = fn.__name__

    # One coroutine per request (the handler's own aside): the translation and the
    # metrics in the same frame, not a second coroutine awaited from the first.
    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        metrics: Metrics | None = getattr(args[0], "metrics", None) if args else None
        stats = metrics.requests if metrics is not None else None
        if stats is not None:
            stats.begin("fuse")
        start = time.monotonic()
        err = errno.EINTR  # cancelled: the kernel interrupted the request
        try:
            result = await fn(*args, **kwargs)
            err = 0
            return result
        except pyfuse3.FUSEError as e:
            err = e.errno
            raise
        except OSError as e:
            if isinstance(e, FsError) and e.errno in EXPLAINED:
                refusals(op, e, args)
            err = (errno.ESTALE if e.errno == errno.ENOENT and op in STALE_OPS
                   else e.errno or errno.EIO)
            raise pyfuse3.FUSEError(err) from None
        except Exception:
            log.exception("FUSE %s failed", op)
            err = errno.EIO
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            if stats is not None:
                stats.end("fuse", op, errno_status(err), time.monotonic() - start)

    return wrapper


class OpsBase(pyfuse3.Operations):
    """State every operation uses: the namespace, callers, handles, kernel cache state."""

    supports_dot_lookup = True
    #: FUSE_POSIX_ACL: the kernel also checks every access with the mode bits and POSIX ACLs
    #: the daemon reports (``default_permissions``, which it implies), so opens the daemon is
    #: never asked about -- FIFOs, unix sockets -- and walks through cached entries get the
    #: same answer as everything else; the daemon keeps checking what reaches it
    enable_acl = True
    #: how :meth:`readdir` adds an entry to its reply: pyfuse3's, or the kernel backend's
    #: (``tierd_fuse.kstructs.DirToken.add``, set on the instance it serves)
    readdir_reply: Callable[[Any, bytes, pyfuse3.EntryAttributes, int], bool] = staticmethod(
        pyfuse3.readdir_reply)
    #: listings hand the kernel each entry's attributes (readdirplus): the kernel backend
    #: always asks for it; libfuse may answer a plain READDIR, which pyfuse3 does not tell
    readdir_gives_attrs = False

    def __init__(
        self,
        ns: NamespaceAPI,
        *,
        entry_timeout: float = 300.0,
        attr_timeout: float = 300.0,
        # missing names are not cached: the lazy import of objects put straight into cold
        # adds names no notification reports, which a cached negative entry would hide
        # (the object calls do report the directories they create; docs/fuse.md)
        negative_timeout: float = 0.0,
    ) -> None:
        super().__init__()
        self.ns = ns
        self.entry_timeout = entry_timeout
        self.attr_timeout = attr_timeout
        self.negative_timeout = negative_timeout
        self.callers = Callers()
        self.invalidator = Invalidator(on_inode=self._content_changed)
        #: inodes known to have no security.capability attribute (asked before each write)
        self.no_caps: set[int] = set()
        self.kcache = KernelCache()
        self.files: dict[int, FileState] = {}
        #: ino -> handles the kernel writes through itself (write passthrough, kpass.py):
        #: the daemon learns their sizes at getattr, setattr, flush, fsync and release
        self.pt_writers: dict[int, set[int]] = {}
        #: a writable CREATE of a new file commits the kernel's write intention with it
        #: (write passthrough on, kpass.py; its OPEN reply then waits for no flush)
        self.pt_creates = False
        #: ino -> the hot file's (size, mtime, ctime) when set-id bits were last seen on an
        #: inode passthrough writers hold: a change since is a write the kernel made, which
        #: clears them as Linux would (files.py ``pt_killpriv``)
        self.pt_privs: dict[int, tuple[int, int, int]] = {}
        #: releases of passthrough writers waiting for a mapping to go (files.py)
        self._later: set[asyncio.Future[None]] = set()
        #: the hot tier's headroom kept while passthrough writers are open (ptspace.py)
        self.space = SpaceWatch(ns)
        self.dirs: dict[int, DirHandle] = {}
        self._next_dir_fh = 1
        #: called on the loop after the INIT reply (see :meth:`init`)
        self.after_init: Callable[[], object] | None = None
        #: the daemon's metrics: every :func:`fs_errors` handler is counted there when set
        self.metrics: Metrics | None = None
        #: "major:minor" of this mount once mounted (tells killpriv from chmod: killpriv.py)
        self.mount_dev = ""

    def ident(self, ctx: pyfuse3.RequestContext) -> Identity:
        return self.callers.identity(ctx.uid, ctx.gid, ctx.pid)

    @staticmethod
    def umask(ctx: pyfuse3.RequestContext) -> int:
        """The caller's umask (create, mknod, mkdir).  The namespace applies it unless the
        parent has a default ACL; on a mount without MS_POSIXACL the kernel has already
        applied it (applying it twice changes nothing)."""
        return int(ctx.umask)

    def _content_changed(self, ino: int) -> None:
        self.kcache.drop(ino)
        self.no_caps.discard(ino)

    # -- entries handed to the kernel ------------------------------------------------------------
    #
    # The kernel checks search permission on every directory of a path itself (enable_acl:
    # default_permissions), with the attributes and ACLs it caches -- which the daemon
    # invalidates when another door changes them -- so every entry may be cached for the
    # full timeout, in any directory.

    def entry(self, inode: Inode) -> pyfuse3.EntryAttributes:
        """Reply to a request that makes the kernel link a name: it counts one lookup."""
        self.kcache.looked_up(inode.ino)
        self.kcache.gave_attrs(inode.ino, inode.version)
        return entry_attributes(inode, self.entry_timeout, self.attr_timeout)

    def init(self) -> None:
        """Called while the kernel's INIT request is answered; :attr:`after_init` runs
        right after the reply, once the kernel has applied the negotiated settings (it
        resets the mount's read-ahead then)."""
        log.debug("FUSE session initialised")
        if self.after_init is not None:
            asyncio.get_running_loop().call_soon(self.after_init)
