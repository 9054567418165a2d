"""The pool's unix socket: peer credentials in, descriptors out.

Every connection is one client process; its identity is what the kernel says
(``SO_PEERCRED``), never what it claims.  Requests on a connection are answered in order
(a client waits for each reply); different connections run concurrently.  When a
connection ends, its non-persistent regions are freed (:meth:`MemPool.connection_closed`)
and each registered ``on_close`` hook runs, which is how a client killed mid-save leaves no
staged checkpoint behind.

Handlers are registered per ``op`` by the services that own them (the pool's own ops here,
checkpoints in :mod:`tierd.checkpoint.service`): the socket decides nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierd.acl.identity import Identity, read_groups
from tierd.errors import FsError
from tierd.logs import get_logger, kv
from tierd.mempool.pool import MemPool, PoolError
from tierd.mempool.wire import HEADER, WireError, decode, encode, frame_length

log = get_logger("mempool")

_CRED = struct.Struct("3i")


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of one connection."""

    conn: int
    pid: int
    ident: Identity

    @property
    def tenant(self) -> int:
        return self.ident.uid


class Reply(dict[str, Any]):
    """A handler's result; ``fds`` are sent with it (and closed by the server after)."""

    def __init__(self, fds: list[int] | None = None, /, **fields: Any) -> None:
        super().__init__(fields)
        self.fds = fds or []


Handler = Callable[[Peer, dict[str, Any]], Awaitable[Reply]]


def _listening(path: Path) -> bool:
    """Whether a live server accepts connections on the unix socket ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


class PoolServer:
    def __init__(self, path: Path, pool: MemPool) -> None:
        self.path = path
        self.pool = pool
        self.handlers: dict[str, Handler] = {}
        self.on_close: list[Callable[[Peer], None]] = []
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._next_conn = 1
        for name, fn in (("alloc", self._alloc), ("open", self._open), ("free", self._free),
                         ("list", self._list), ("stats", self._stats)):
            self.route(name, fn)

    def route(self, op: str, handler: Handler) -> None:
        self.handlers[op] = handler

    # -- life cycle --------------------------------------------------------------------
    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                # a socket left by a killed daemon goes; a live one is another daemon's
                # (the shared /run/tierd/pool.sock is outside any data directory's lock)
                if await asyncio.to_thread(_listening, self.path):
                    raise OSError(errno.EADDRINUSE, f"another tierd serves the pool on "
                                  f"{self.path}; give this one another pool_socket")
                os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(str(self.path))
            # every local user may connect: who they are comes from SO_PEERCRED
            os.chmod(self.path, 0o666)
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._accepting = asyncio.create_task(self._accept_loop(), name="pool-accept")

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        for t in list(self._conns):
            t.cancel()
        for t in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            conn.setblocking(False)
            cid = self._next_conn
            self._next_conn += 1
            t = asyncio.create_task(self._serve(conn, cid), name=f"pool-conn-{cid}")
            self._conns.add(t)
            t.add_done_callback(self._conns.discard)

    # -- one connection ----------------------------------------------------------------
    async def _serve(self, conn: socket.socket, cid: int) -> None:
        pid, uid, gid = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     _CRED.size))
        peer = Peer(cid, pid, Identity(uid, gid, read_groups(pid)))
        loop = asyncio.get_running_loop()
        buf = bytearray()
        try:
            while True:
                while len(buf) < HEADER.size:
                    if not await self._fill(loop, conn, buf):
                        return
                need = HEADER.size + frame_length(bytes(buf[:HEADER.size]))
                while len(buf) < need:
                    if not await self._fill(loop, conn, buf):
                        return
                msg = decode(bytes(buf[HEADER.size:need]))
                del buf[:need]
                reply = await self._dispatch(peer, msg)
                await self._send(loop, conn, reply)
        except (WireError, ConnectionError) as e:
            log.info("pool connection dropped", extra=kv(conn=cid, pid=pid, why=str(e)))
        finally:
            conn.close()
            freed = self.pool.connection_closed(cid)
            for hook in self.on_close:
                hook(peer)
            if freed:
                log.info("freed regions of a closed connection",
                         extra=kv(conn=cid, pid=pid, regions=freed))

    @staticmethod
    async def _fill(loop: asyncio.AbstractEventLoop, conn: socket.socket,
                    buf: bytearray) -> bool:
        data = await loop.sock_recv(conn, 1 << 16)
        if not data:
            return False
        buf += data
        return True

    async def _dispatch(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        op = msg.get("op")
        handler = self.handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            return Reply(ok=False, errno=errno.ENOSYS, error=f"unknown pool operation {op!r}")
        try:
            reply = await handler(peer, msg)
        except (PoolError, FsError) as e:
            return Reply(ok=False, errno=e.errno, error=e.strerror or str(e))
        except (KeyError, TypeError, ValueError) as e:
            return Reply(ok=False, errno=errno.EINVAL, error=f"bad {op} request: {e}")
        reply.setdefault("ok", True)
        return reply

    @staticmethod
    async def _send(loop: asyncio.AbstractEventLoop, conn: socket.socket,
                    reply: Reply) -> None:
        data = encode(dict(reply))
        try:
            while True:
                try:
                    sent = socket.send_fds(conn, [data], reply.fds) if reply.fds else 0
                    break
                except BlockingIOError:
                    ready = loop.create_future()
                    loop.add_writer(conn.fileno(), ready.set_result, None)
                    try:
                        await ready
                    finally:
                        loop.remove_writer(conn.fileno())
            if sent < len(data):
                await loop.sock_sendall(conn, data[sent:])
        finally:
            for fd in reply.fds:
                os.close(fd)

    # -- the pool's own operations -----------------------------------------------------
    async def _alloc(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        size = int(msg["size"])
        r = await self.pool.alloc_backed(
            peer.tenant, size, name=str(msg.get("name", ""))[:200],
            persistent=bool(msg.get("persistent", False)), conn=peer.conn)
        return Reply([os.dup(r.fd)], region=r.describe())

    async def _open(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        r = self.pool.get(int(msg["region"]), peer.tenant)
        return Reply([os.dup(r.fd)], region=r.describe())

    async def _free(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        r = self.pool.get(int(msg["region"]), peer.tenant)
        if r.conn == 0 and not peer.ident.is_root:
            raise PoolError(errno.EBUSY, f"pool region {r.id} holds a checkpoint; delete "
                            "the checkpoint instead")
        self.pool.free(r.id)
        return Reply(freed=r.id)

    async def _list(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        mine = [r.describe() for r in self.pool.regions.values()
                if r.tenant == peer.tenant or peer.ident.is_root]
        return Reply(regions=mine)

    async def _stats(self, peer: Peer, msg: dict[str, Any]) -> Reply:
        return Reply(**self.pool.stats())
