"""The pool's unix socket (tierd/mempool/server.py) served in this process on a real socket,
with real clients in threads: the SDK's :class:`PoolClient` and raw sockets speaking the
wire format.  Identity comes from SO_PEERCRED; descriptors come back as SCM_RIGHTS.

tests/checkpoint/test_pool.py drives the pool through a whole daemon (a second tenant, a
killed owner, tierctl); these check the socket itself: framing, pipelining, errors, clean-up
hooks and the socket file's life cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import mmap
import os
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tierd_client.pool import PoolClient, PoolFull, PoolRequestError

from tierd.mempool.extents import ALIGN
from tierd.mempool.pool import MemPool
from tierd.mempool.server import Peer, PoolServer, Reply
from tierd.mempool.wire import encode, recv_message

MiB = 1 << 20


@contextlib.asynccontextmanager
async def serving(path: Path, capacity: int = 16 * MiB) -> AsyncIterator[PoolServer]:
    server = PoolServer(path, MemPool(capacity))
    await server.start()
    try:
        yield server
    finally:
        await server.close()
        server.pool.close()


def raw(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    s.settimeout(30)
    return s


def call(s: socket.socket, **msg: Any) -> tuple[dict[str, Any], list[int]]:
    s.sendall(encode(msg))
    return recv_message(s)


async def until(cond: Any, what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_regions_through_the_sdk_are_shared_between_connections(tmp_path: Path) -> None:
    sock = tmp_path / "pool.sock"
    async with serving(sock) as server:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o666  # who: SO_PEERCRED, not modes

        def client() -> None:
            with PoolClient(sock) as a, PoolClient(sock) as b:
                m = a.alloc(3 * MiB, name="weights")
                m.mm[:4] = b"\x01\x02\x03\x04"
                other = b.open(m.id)  # same uid, another connection: same tenant
                assert other.mm[:4] == b"\x01\x02\x03\x04" and other.size == 3 * MiB
                (listed,) = b.regions()
                assert listed["name"] == "weights" and listed["tenant"] == os.geteuid()
                assert b.stats()["used"] == 2 * ALIGN
                with pytest.raises(PoolFull):
                    b.alloc(64 * MiB)
                b.free(m.id)
                with pytest.raises(PoolRequestError) as e:
                    a.open(m.id)
                assert e.value.errno == errno.ENOENT
                m.close()
                other.close()

        await asyncio.to_thread(client)
        assert server.pool.regions == {} and server.pool.used == 0


async def test_a_closed_connection_frees_its_regions_and_runs_the_hooks(tmp_path: Path) -> None:
    sock = tmp_path / "pool.sock"
    async with serving(sock) as server:
        closed: list[Peer] = []
        server.on_close.append(closed.append)

        def client() -> tuple[int, int]:
            s = raw(sock)
            try:
                r1, fds1 = call(s, op="alloc", size=MiB)
                r2, fds2 = call(s, op="alloc", size=MiB, persistent=True)
                for fd in fds1 + fds2:
                    os.close(fd)
                return int(r1["region"]["id"]), int(r2["region"]["id"])
            finally:
                s.close()

        transient, kept = await asyncio.to_thread(client)
        await until(lambda: closed, "the close hook")
        assert set(server.pool.regions) == {kept}, transient
        (peer,) = closed
        assert peer.pid == os.getpid() and peer.tenant == os.geteuid()
        assert peer.ident.uid == os.geteuid() and peer.ident.gid == os.getegid()


async def test_requests_are_answered_in_order_and_errors_keep_the_connection(
        tmp_path: Path) -> None:
    sock = tmp_path / "pool.sock"
    async with serving(sock) as server:

        async def echo(peer: Peer, msg: dict[str, Any]) -> Reply:
            await asyncio.sleep(float(msg["delay"]))
            return Reply(n=msg["n"])

        server.route("echo", echo)

        def client() -> None:
            s = raw(sock)
            try:
                # three requests in one send, the first the slowest: replies keep the order
                s.sendall(b"".join(encode({"op": "echo", "n": i, "delay": d})
                                   for i, d in enumerate((0.2, 0.0, 0.05))))
                assert [recv_message(s)[0]["n"] for _ in range(3)] == [0, 1, 2]
                for msg, code in (({"op": "nope"}, errno.ENOSYS), ({"size": 1}, errno.ENOSYS),
                                  ({"op": "alloc"}, errno.EINVAL),
                                  ({"op": "alloc", "size": "big"}, errno.EINVAL),
                                  ({"op": "alloc", "size": 0}, errno.EINVAL),
                                  ({"op": "open", "region": 999}, errno.ENOENT),
                                  ({"op": "echo", "n": 1}, errno.EINVAL)):
                    reply, fds = call(s, **msg)
                    assert reply["ok"] is False and reply["errno"] == code, (msg, reply)
                    assert reply["error"] and fds == []
                assert call(s, op="echo", n=7, delay=0)[0] == {"ok": True, "n": 7}
            finally:
                s.close()

        await asyncio.to_thread(client)


async def test_a_malformed_message_drops_only_that_connection(tmp_path: Path) -> None:
    sock = tmp_path / "pool.sock"
    async with serving(sock) as server:

        def client() -> None:
            good, bad = raw(sock), raw(sock)
            try:
                _, fds = call(bad, op="alloc", size=MiB)
                for fd in fds:
                    os.close(fd)
                body = b"{not json"
                bad.sendall(len(body).to_bytes(4, "big") + body)
                assert bad.recv(1) == b""  # the server hung up
                assert call(good, op="stats")[0]["ok"] is True
            finally:
                good.close()
                bad.close()

        await asyncio.to_thread(client)
        await until(lambda: not server.pool.regions, "the dropped connection's region")


async def test_a_region_of_the_daemon_is_not_freed_by_its_tenant_through_the_socket(
        tmp_path: Path) -> None:
    """Checkpoint regions belong to the daemon (conn 0): a non-root tenant must delete the
    checkpoint, not free its region; root (an operator) may."""
    sock = tmp_path / "pool.sock"
    async with serving(sock) as server:
        r = server.pool.alloc(os.geteuid(), MiB)
        fds: list[int] = []

        def client() -> dict[str, Any]:
            s = raw(sock)
            try:
                _, got = call(s, op="open", region=r.id)
                fds.extend(got)
                mm = mmap.mmap(got[0], MiB)
                mm.close()
                return call(s, op="free", region=r.id)[0]
            finally:
                s.close()

        reply = await asyncio.to_thread(client)
        for fd in fds:
            os.close(fd)
        if os.geteuid() == 0:
            assert reply["ok"] is True and r.id not in server.pool.regions
        else:
            assert reply["errno"] == errno.EBUSY and r.id in server.pool.regions


async def test_the_socket_file_life_cycle(tmp_path: Path) -> None:
    sock = tmp_path / "pool.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # left by a killed daemon: nobody accepts on it
    stale.close()
    async with serving(sock):
        with pytest.raises(OSError) as e:  # a live one is another daemon's
            async with serving(sock):
                pass
        assert e.value.errno == errno.EADDRINUSE
        assert await asyncio.to_thread(lambda: call(raw(sock), op="stats")[0]["ok"])
    assert not sock.exists()  # close removes it
