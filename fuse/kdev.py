"""The ``/dev/fuse`` loop of the kernel backend: requests in, :class:`TierdOps` calls, replies out.

Why not libfuse: libfuse 3.14 and pyfuse3 3.5 cannot ask the kernel for passthrough,
``FOPEN_NOFLUSH`` or ``max_stack_depth``, and every request crosses libfuse's receive
loop, pyfuse3's copy into ``bytes`` and its asyncio glue (docs/fuse.md, "Performance").
Here the device descriptor is non-blocking in the daemon's own event loop
(``loop.add_reader``); each request is read into a preallocated buffer (``os.readv``),
parsed with the layouts of :mod:`tierd_fuse.kproto` and run as a task that calls the very
same operation methods as the pyfuse3 backend (:mod:`tierd_fuse.ops`, :mod:`tierd_fuse.files`:
every rule stays there and in the namespace); the reply is one ``os.writev``.

The operations take pyfuse3's argument types; this module passes duck-typed stand-ins
(``KContext`` for ``RequestContext``, ``KSetattrFields`` for ``SetattrFields``,
``DirToken`` for ``ReaddirToken``) and packs their pyfuse3 return values
(``EntryAttributes``, ``FileInfo``, ``StatvfsData``) into the kernel's structs; the
stand-ins and the attribute packing live in :mod:`tierd_fuse.kstructs`.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pyfuse3

from . import kproto as K
from .kpass import Passthrough
from .kpoll import DevicePoll
from .kstructs import DirToken, KContext, KSetattrFields, attr_out, entry_out

if TYPE_CHECKING:
    from .ops import TierdOps

log = logging.getLogger("tierd.fuse")

#: the largest WRITE payload the daemon accepts (max_pages 256 x 4 KiB)
MAX_WRITE = 1 << 20
#: one request buffer: a WRITE's headers plus its payload, rounded up
BUF_SIZE = MAX_WRITE + 4096
#: requests in flight before the daemon stops reading the device (as pyfuse3's max_tasks)
MAX_TASKS = 64
#: kernel background requests (read-ahead, async direct I/O) allowed at once
MAX_BACKGROUND = 64
#: the protocol features asked for at INIT, when the kernel offers them (see docs/fuse.md)
WANT = (K.ASYNC_READ | K.ATOMIC_O_TRUNC | K.BIG_WRITES | K.DONT_MASK | K.AUTO_INVAL_DATA
        | K.DO_READDIRPLUS | K.ASYNC_DIO | K.PARALLEL_DIROPS | K.POSIX_ACL | K.MAX_PAGES
        | K.INIT_EXT | K.HANDLE_KILLPRIV_V2)

Buffer = bytes | bytearray | memoryview


@dataclass(slots=True)
class Request:
    opcode: int
    unique: int
    nodeid: int
    ctx: KContext
    body: memoryview | bytearray


Handler = Callable[[Request], Awaitable[Sequence[Buffer] | None]]


class _Resume:
    """Awaitable that carries on a coroutine whose first step already ran outside a task
    (:meth:`KernelSession._dispatch`): it hands the future that step waits for to the
    task, then passes every result or exception (a cancellation too) on to the coroutine,
    as ``await`` of the fresh coroutine would have."""

    __slots__ = ("coro", "waiting")

    def __init__(self, coro: Coroutine[Any, Any, None], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting

    def __await__(self) -> Generator[Any, Any, None]:
        coro, waiting = self.coro, self.waiting
        self.waiting = None
        while True:
            try:
                sent = yield waiting
            except BaseException as e:  # handed to the coroutine as is
                try:
                    waiting = coro.throw(e)
                except StopIteration:
                    return
            else:
                try:
                    waiting = coro.send(sent)
                except StopIteration:
                    return


async def _resumed(rest: _Resume) -> None:
    await rest


class KernelSession:
    """One mount's conversation with the kernel over a ``/dev/fuse`` descriptor."""

    def __init__(self, ops: TierdOps, fd: int, *, passthrough: bool = False,
                 passthrough_writes: bool = False, max_tasks: int = MAX_TASKS,
                 poll_us: int = 0) -> None:
        self.ops = ops
        self.fd = fd
        self.max_tasks = max_tasks
        self.want_passthrough = passthrough
        self.passthrough_writes = passthrough_writes
        #: the device read again for ``poll_us`` before the loop sleeps (kpoll.py); None: off
        self.poll = DevicePoll(poll_us) if poll_us > 0 else None
        self.pt: Passthrough | None = None
        self.minor = 0
        self.flags = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._free: list[bytearray] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading = False
        self._done: asyncio.Future[None] | None = None
        self._handlers: dict[int, Handler] = self._table()
        ops.readdir_reply = DirToken.add  # readdir fills this backend's tokens
        ops.readdir_gives_attrs = True  # DO_READDIRPLUS; a plain READDIR undoes it below

    # -- the loop ------------------------------------------------------------------------------
    async def serve(self) -> None:
        """Serve until the mount goes away (the device answers ENODEV) or :meth:`terminate`;
        then wait for the requests still running."""
        self._loop = asyncio.get_running_loop()
        self._done = self._loop.create_future()
        os.set_blocking(self.fd, False)
        self._resume()
        try:
            await self._done
        finally:
            self._pause()
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def terminate(self) -> None:
        """Stop reading requests (the kernel's pending ones get ENOTCONN at close)."""
        self._finish()

    def close(self) -> None:
        if self.pt is not None:
            self.pt.close_all()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _finish(self) -> None:
        self._pause()
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _resume(self) -> None:
        if not self._reading and self._loop is not None and self.fd >= 0 and (
                self._done is not None and not self._done.done()):
            self._loop.add_reader(self.fd, self._readable)
            self._reading = True

    def _pause(self) -> None:
        if self._reading and self._loop is not None:
            self._loop.remove_reader(self.fd)
            self._reading = False

    def _readable(self) -> None:
        """Read every request the device has now (it returns one per read), and with
        ``fuse_poll_us`` those that come within a window after (:mod:`tierd_fuse.kpoll`)."""
        poll = self.poll
        deadline = 0
        if poll is not None:
            poll.woke()
        while len(self._tasks) < self.max_tasks:
            buf = self._free.pop() if self._free else bytearray(BUF_SIZE)
            try:
                n = os.readv(self.fd, [buf])
            except (BlockingIOError, InterruptedError):
                self._free.append(buf)
                if poll is None:
                    return
                if self._tasks:  # a request waits for a result that comes through the loop
                    poll.busy()
                    return
                poll.empty()
                if not deadline:
                    deadline = poll.deadline()
                    if not deadline:
                        return
                elif poll.expired(deadline):
                    return
                continue
            except OSError as e:
                self._free.append(buf)
                if e.errno == errno.ENOENT:  # the request was interrupted meanwhile
                    continue
                if e.errno != errno.ENODEV:
                    log.warning("reading /dev/fuse failed: %s; the FUSE session ends", e)
                self._finish()  # ENODEV: unmounted
                return
            if poll is not None:
                poll.found()
            self._dispatch(buf, n)
        self._pause()  # resumed when a task finishes

    def _dispatch(self, buf: bytearray, n: int) -> None:
        _, opcode, unique, nodeid, uid, gid, pid, extlen, _ = K.IN_HEADER.unpack_from(buf)
        end = n - extlen * 8
        body: memoryview | bytearray
        keep = opcode == K.WRITE
        if keep:  # the payload is written from this buffer: no copy
            body = memoryview(buf)[K.IN_HEADER.size:end]
        else:  # one copy of the small body, and the buffer is free again
            body = buf[K.IN_HEADER.size:end]
            self._free.append(buf)
        req = Request(opcode, unique, nodeid, KContext(uid, gid, pid), body)
        if opcode == K.INIT:
            self._init(req)
            return
        handler = self._handlers.get(opcode)
        if handler is None:
            self.reply_error(unique, errno.ENOSYS)
            return
        # The handler's first step runs here, at once: most requests (lookup, getattr,
        # create, a close with nothing to flush) never wait, and are answered before the
        # loop polls again, with no task made for them.  Only one that waits becomes a task,
        # which goes on from where it stopped (:class:`_Resume`), in the same context (a
        # copy per request, as a task of its own would have had).
        coro = self._run(handler, req)
        ctx = contextvars.copy_context()
        try:
            waiting = ctx.run(coro.send, None)
        except StopIteration:
            if keep:
                self._free.append(buf)
            return
        loop = self._loop or asyncio.get_running_loop()
        task = loop.create_task(_resumed(_Resume(coro, waiting)), context=ctx)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, buf if keep else None))

    def _task_done(self, task: asyncio.Task[None], buf: bytearray | None) -> None:
        self._tasks.discard(task)
        if buf is not None:
            self._free.append(buf)
        if len(self._tasks) < self.max_tasks:
            self._resume()

    async def _run(self, handler: Handler, req: Request) -> None:
        try:
            parts = await handler(req)
        except pyfuse3.FUSEError as e:
            self.reply_error(req.unique, e.errno)
            return
        except OSError as e:
            self.reply_error(req.unique, e.errno or errno.EIO)
            return
        except Exception:
            log.exception("FUSE request %d failed", req.opcode)
            self.reply_error(req.unique, errno.EIO)
            return
        finally:
            if isinstance(req.body, memoryview):
                req.body.release()
        if parts is not None:
            self.reply(req.unique, parts)

    # -- replies and notifications -----------------------------------------------------------
    def _write(self, parts: Sequence[Buffer]) -> None:
        try:
            os.writev(self.fd, parts)
        except OSError as e:
            # ENOENT: the request was interrupted (the kernel no longer waits for it)
            if e.errno not in (errno.ENOENT, errno.ENODEV, errno.EBADF):
                log.warning("FUSE reply failed: %s", e)

    def reply(self, unique: int, parts: Sequence[Buffer]) -> None:
        size = K.OUT_HEADER.size + sum(len(p) for p in parts)
        self._write([K.OUT_HEADER.pack(size, 0, unique), *parts])

    def reply_error(self, unique: int, err: int) -> None:
        self._write([K.OUT_HEADER.pack(K.OUT_HEADER.size, -err, unique)])

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        """FUSE_NOTIFY_INVAL_ENTRY (called by the invalidation thread: it may block)."""
        body = K.NOTIFY_INVAL_ENTRY_OUT.pack(parent, len(name), 0)
        size = K.OUT_HEADER.size + len(body) + len(name) + 1
        os.writev(self.fd, [K.OUT_HEADER.pack(size, K.NOTIFY_INVAL_ENTRY, 0), body, name,
                            b"\0"])

    def invalidate_inode(self, ino: int, off: int = 0) -> None:
        """FUSE_NOTIFY_INVAL_INODE of attributes and all cached pages (``off`` -1: of the
        attributes only, which never blocks: :meth:`invalidate_attrs`)."""
        body = K.NOTIFY_INVAL_INODE_OUT.pack(ino, off, 0)
        size = K.OUT_HEADER.size + len(body)
        os.writev(self.fd, [K.OUT_HEADER.pack(size, K.NOTIFY_INVAL_INODE, 0), body])

    def invalidate_attrs(self, ino: int) -> None:
        """FUSE_NOTIFY_INVAL_INODE with offset -1: the kernel drops the inode's cached
        attributes and ACLs, no pages (safe on the loop: no page lock is taken)."""
        self.invalidate_inode(ino, -1)

    # -- INIT ------------------------------------------------------------------------------------
    def _init(self, req: Request) -> None:
        major, minor, max_readahead, flags, flags2 = K.INIT_IN.unpack_from(req.body)
        if major > K.MAJOR:  # the kernel asks again with our major
            self.reply(req.unique, [K.INIT_OUT.pack(K.MAJOR, K.MINOR, *([0] * 10))])
            return
        if major < K.MAJOR or minor < K.MIN_MINOR:
            log.error("kernel FUSE protocol %d.%d is too old (need %d.%d)", major, minor,
                      K.MAJOR, K.MIN_MINOR)
            self.reply_error(req.unique, errno.EPROTO)
            self._finish()
            return
        offered = flags | ((flags2 << 32) if flags & K.INIT_EXT else 0)
        want = WANT | (K.PASSTHROUGH if self.want_passthrough else 0)
        self.flags = got = offered & want
        self.minor = min(minor, K.MINOR)
        if self.want_passthrough and not got & K.PASSTHROUGH:
            log.warning("the kernel does not offer FUSE passthrough: reads and writes go "
                        "through the daemon")
        stack = K.MAX_STACK_DEPTH if got & K.PASSTHROUGH else 0
        self.reply(req.unique, [K.INIT_OUT.pack(
            K.MAJOR, self.minor, max_readahead, got & 0xFFFFFFFF, MAX_BACKGROUND,
            MAX_BACKGROUND * 3 // 4, MAX_WRITE, 1, MAX_WRITE // 4096, 0, got >> 32, stack)])
        if got & K.PASSTHROUGH:
            self.pt = Passthrough(self.ops, self.fd, writes=self.passthrough_writes)
        self.ops.init()

    # -- requests --------------------------------------------------------------------------------
    def _table(self) -> dict[int, Handler]:
        return {
            K.LOOKUP: self._lookup, K.FORGET: self._forget, K.BATCH_FORGET: self._batch_forget,
            K.GETATTR: self._getattr, K.SETATTR: self._setattr, K.READLINK: self._readlink,
            K.SYMLINK: self._symlink, K.MKNOD: self._mknod, K.MKDIR: self._mkdir,
            K.UNLINK: self._unlink, K.RMDIR: self._rmdir, K.RENAME: self._rename,
            K.RENAME2: self._rename2, K.LINK: self._link, K.OPEN: self._open,
            K.READ: self._read, K.WRITE: self._write_req, K.STATFS: self._statfs,
            K.RELEASE: self._release, K.FSYNC: self._fsync, K.SETXATTR: self._setxattr,
            K.GETXATTR: self._getxattr, K.LISTXATTR: self._listxattr,
            K.REMOVEXATTR: self._removexattr, K.FLUSH: self._flush, K.OPENDIR: self._opendir,
            K.READDIR: self._readdir, K.READDIRPLUS: self._readdir,
            K.RELEASEDIR: self._releasedir, K.FSYNCDIR: self._fsync, K.ACCESS: self._access,
            K.CREATE: self._create, K.INTERRUPT: self._interrupt, K.DESTROY: self._destroy,
        }

    @staticmethod
    def _ctx(req: Request) -> pyfuse3.RequestContext:
        return cast(pyfuse3.RequestContext, req.ctx)

    @staticmethod
    def _names(body: memoryview | bytearray, skip: int = 0) -> list[bytes]:
        """NUL-terminated names after ``skip`` bytes of fixed fields."""
        return bytes(body[skip:]).split(b"\0")

    async def _lookup(self, req: Request) -> Sequence[Buffer]:
        name = self._names(req.body)[0]
        return [entry_out(await self.ops.lookup(req.nodeid, name, self._ctx(req)))]

    async def _forget(self, req: Request) -> None:
        (n,) = K.FORGET_IN.unpack_from(req.body)
        await self.ops.forget([(req.nodeid, n)])

    async def _batch_forget(self, req: Request) -> None:
        (count, _) = K.BATCH_FORGET_IN.unpack_from(req.body)
        off = K.BATCH_FORGET_IN.size
        await self.ops.forget([K.FORGET_ONE.unpack_from(req.body, off + i * K.FORGET_ONE.size)
                               for i in range(count)])

    async def _getattr(self, req: Request) -> Sequence[Buffer]:
        return [attr_out(await self.ops.getattr(req.nodeid, self._ctx(req)))]

    async def _setattr(self, req: Request) -> Sequence[Buffer]:
        (valid, _, fh, size, _, atime, mtime, _, atimens, mtimens, _, mode, _, uid, gid,
         _) = K.SETATTR_IN.unpack_from(req.body)
        a = pyfuse3.EntryAttributes()
        f = KSetattrFields()
        if valid & K.FATTR_MODE:
            a.st_mode, f.update_mode = mode, True
        if valid & K.FATTR_UID:
            a.st_uid, f.update_uid = uid, True
        if valid & K.FATTR_GID:
            a.st_gid, f.update_gid = gid, True
        if valid & K.FATTR_SIZE:
            a.st_size, f.update_size = size, True
        if valid & (K.FATTR_ATIME | K.FATTR_ATIME_NOW):
            # the namespace's UTIME_NOW (-1): "now", with write permission enough
            a.st_atime_ns = -1 if valid & K.FATTR_ATIME_NOW else atime * 10**9 + atimens
            f.update_atime = True
        if valid & (K.FATTR_MTIME | K.FATTR_MTIME_NOW):
            a.st_mtime_ns = -1 if valid & K.FATTR_MTIME_NOW else mtime * 10**9 + mtimens
            f.update_mtime = True
        handle = fh if valid & K.FATTR_FH else None
        new = await self.ops.setattr(req.nodeid, a, cast(pyfuse3.SetattrFields, f), handle,
                                     self._ctx(req))
        return [attr_out(new)]

    async def _readlink(self, req: Request) -> Sequence[Buffer]:
        return [await self.ops.readlink(req.nodeid, self._ctx(req))]

    async def _symlink(self, req: Request) -> Sequence[Buffer]:
        name, target = self._names(req.body)[:2]
        return [entry_out(await self.ops.symlink(req.nodeid, name, target, self._ctx(req)))]

    async def _mknod(self, req: Request) -> Sequence[Buffer]:
        mode, rdev, umask, _ = K.MKNOD_IN.unpack_from(req.body)
        req.ctx.umask = umask
        name = self._names(req.body, K.MKNOD_IN.size)[0]
        return [entry_out(await self.ops.mknod(req.nodeid, name, mode, rdev, self._ctx(req)))]

    async def _mkdir(self, req: Request) -> Sequence[Buffer]:
        mode, umask = K.MKDIR_IN.unpack_from(req.body)
        req.ctx.umask = umask
        name = self._names(req.body, K.MKDIR_IN.size)[0]
        # the kernel sends the mode without S_IFDIR, as mkdir(2) got it
        return [entry_out(await self.ops.mkdir(req.nodeid, name, mode, self._ctx(req)))]

    async def _unlink(self, req: Request) -> Sequence[Buffer]:
        await self.ops.unlink(req.nodeid, self._names(req.body)[0], self._ctx(req))
        return []

    async def _rmdir(self, req: Request) -> Sequence[Buffer]:
        await self.ops.rmdir(req.nodeid, self._names(req.body)[0], self._ctx(req))
        return []

    async def _rename(self, req: Request) -> Sequence[Buffer]:
        (newdir,) = K.RENAME_IN.unpack_from(req.body)
        old, new = self._names(req.body, K.RENAME_IN.size)[:2]
        await self.ops.rename(req.nodeid, old, newdir, new, 0, self._ctx(req))
        return []

    async def _rename2(self, req: Request) -> Sequence[Buffer]:
        newdir, flags, _ = K.RENAME2_IN.unpack_from(req.body)
        old, new = self._names(req.body, K.RENAME2_IN.size)[:2]
        await self.ops.rename(req.nodeid, old, newdir, new, flags, self._ctx(req))
        return []

    async def _link(self, req: Request) -> Sequence[Buffer]:
        (old,) = K.LINK_IN.unpack_from(req.body)
        name = self._names(req.body, K.LINK_IN.size)[0]
        return [entry_out(await self.ops.link(old, req.nodeid, name, self._ctx(req)))]

    # -- files -------------------------------------------------------------------------------------
    def _open_out(self, ino: int, info: pyfuse3.FileInfo, flags: int) -> bytes:
        oflags = (K.FOPEN_KEEP_CACHE if info.keep_cache else 0) | (
            K.FOPEN_DIRECT_IO if info.direct_io else 0)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            oflags |= K.FOPEN_NOFLUSH  # nothing to make durable at close(2)
        backing = 0
        if self.pt is not None:
            backing = self.pt.opened(ino, int(info.fh), flags)
            if backing:
                oflags = (oflags | K.FOPEN_PASSTHROUGH) & ~(K.FOPEN_DIRECT_IO
                                                            | K.FOPEN_KEEP_CACHE)
        return K.OPEN_OUT.pack(info.fh, oflags, backing)

    async def _open(self, req: Request) -> Sequence[Buffer]:
        flags, _ = K.OPEN_IN.unpack_from(req.body)
        if self.pt is not None:
            await self.pt.may_open(req.nodeid, flags)
        try:
            info = await self.ops.open(req.nodeid, flags, self._ctx(req))
        except BaseException:
            if self.pt is not None:
                self.pt.open_failed(req.nodeid, flags)
            raise
        return [await self._opened(req.nodeid, info, flags)]

    async def _opened(self, ino: int, info: pyfuse3.FileInfo, flags: int) -> bytes:
        """The OPEN reply of a handle the namespace opened; if it cannot be made, the
        handle is released again (the kernel never learns of it)."""
        try:
            if self.pt is not None:
                await self.pt.prepare(ino, int(info.fh), flags)
            return self._open_out(ino, info, flags)
        except BaseException:
            if self.pt is not None:
                self.pt.released(ino, int(info.fh))
            await self.ops.release(info.fh)
            raise

    async def _create(self, req: Request) -> Sequence[Buffer]:
        flags, mode, umask, _ = K.CREATE_IN.unpack_from(req.body)
        req.ctx.umask = umask
        name = self._names(req.body, K.CREATE_IN.size)[0]
        info, attrs = await self.ops.create(req.nodeid, name, mode, flags, self._ctx(req))
        if self.pt is not None:  # an existing file opened: the rules of an OPEN
            try:
                await self.pt.may_open(attrs.st_ino, flags)
            except pyfuse3.FUSEError:
                await self.ops.release(info.fh)
                raise
        return [entry_out(attrs), await self._opened(attrs.st_ino, info, flags)]

    async def _read(self, req: Request) -> Sequence[Buffer]:
        fh, off, size, *_ = K.READ_IN.unpack_from(req.body)
        return [await self.ops.read(fh, off, size)]

    async def _write_req(self, req: Request) -> Sequence[Buffer]:
        fh, off, size, write_flags, *_ = K.WRITE_IN.unpack_from(req.body)
        data = req.body[K.WRITE_IN.size:K.WRITE_IN.size + size]
        n = await self.ops.write(fh, off, cast(bytes, data),
                                 kill_privs=bool(write_flags & K.WRITE_KILL_SUIDGID))
        return [K.WRITE_OUT.pack(n, 0)]

    async def _flush(self, req: Request) -> Sequence[Buffer]:
        (fh, *_) = K.FLUSH_IN.unpack_from(req.body)
        await self.ops.flush(fh)
        return []

    async def _fsync(self, req: Request) -> Sequence[Buffer]:
        """FSYNC and FSYNCDIR (the same body)."""
        fh, fsync_flags, _ = K.FSYNC_IN.unpack_from(req.body)
        sync = self.ops.fsync if req.opcode == K.FSYNC else self.ops.fsyncdir
        await sync(fh, bool(fsync_flags & K.FSYNC_FDATASYNC))
        return []

    async def _release(self, req: Request) -> Sequence[Buffer]:
        (fh, *_) = K.RELEASE_IN.unpack_from(req.body)
        try:
            await self.ops.release(fh)
        finally:
            if self.pt is not None:
                self.pt.released(req.nodeid, fh)
        return []

    async def _statfs(self, req: Request) -> Sequence[Buffer]:
        s = await self.ops.statfs(self._ctx(req))
        return [K.STATFS_OUT.pack(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree,
                                  s.f_bsize, s.f_namemax, s.f_frsize, 0)]

    async def _access(self, req: Request) -> Sequence[Buffer]:
        mask, _ = K.ACCESS_IN.unpack_from(req.body)
        await self.ops.access(req.nodeid, mask, self._ctx(req))
        return []

    # -- extended attributes -----------------------------------------------------------------------
    async def _setxattr(self, req: Request) -> Sequence[Buffer]:
        size, flags = K.SETXATTR_IN.unpack_from(req.body)
        rest = bytes(req.body[K.SETXATTR_IN.size:])
        name, _, value = rest.partition(b"\0")
        await self.ops.setxattr(req.nodeid, name, value[:size], self._ctx(req), flags)
        return []

    @staticmethod
    def _sized(value: bytes, size: int) -> Sequence[Buffer]:
        """getxattr/listxattr: size 0 asks for the length only; a short buffer is ERANGE."""
        if size == 0:
            return [K.GETXATTR_OUT.pack(len(value), 0)]
        if len(value) > size:
            raise pyfuse3.FUSEError(errno.ERANGE)
        return [value]

    async def _getxattr(self, req: Request) -> Sequence[Buffer]:
        size, _ = K.GETXATTR_IN.unpack_from(req.body)
        name = self._names(req.body, K.GETXATTR_IN.size)[0]
        return self._sized(await self.ops.getxattr(req.nodeid, name, self._ctx(req)), size)

    async def _listxattr(self, req: Request) -> Sequence[Buffer]:
        size, _ = K.GETXATTR_IN.unpack_from(req.body)
        names = await self.ops.listxattr(req.nodeid, self._ctx(req))
        return self._sized(b"".join(n + b"\0" for n in names), size)

    async def _removexattr(self, req: Request) -> Sequence[Buffer]:
        await self.ops.removexattr(req.nodeid, self._names(req.body)[0], self._ctx(req))
        return []

    # -- directories -------------------------------------------------------------------------------
    async def _opendir(self, req: Request) -> Sequence[Buffer]:
        fh = await self.ops.opendir(req.nodeid, self._ctx(req))
        return [K.OPEN_OUT.pack(fh, 0, 0)]

    async def _readdir(self, req: Request) -> Sequence[Buffer]:
        """READDIR and READDIRPLUS (the same body; the latter's entries carry attributes)."""
        plus = req.opcode == K.READDIRPLUS
        fh, off, size, *_ = K.READ_IN.unpack_from(req.body)
        token = DirToken(size, plus)
        await self.ops.readdir(fh, off, cast(pyfuse3.ReaddirToken, token))
        if not plus:  # a plain READDIR links nothing: undo the lookups readdir counted
            for ino in token.inos:  # (and gave no attributes)
                self.ops.kcache.forget(ino, 1)
                self.ops.kcache.attrs.pop(ino, None)
        return [token.buf]

    async def _releasedir(self, req: Request) -> Sequence[Buffer]:
        (fh, *_) = K.RELEASE_IN.unpack_from(req.body)
        await self.ops.releasedir(fh)
        return []

    # -- session -----------------------------------------------------------------------------------
    async def _interrupt(self, req: Request) -> Sequence[Buffer]:
        # As with pyfuse3, requests run to completion: ENOSYS tells the kernel to stop
        # sending interrupts (it then waits for the reply, which comes)
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def _destroy(self, req: Request) -> Sequence[Buffer]:
        asyncio.get_running_loop().call_soon(self._finish)
        return []
