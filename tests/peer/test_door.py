"""The peer data door over real sockets: signed reads, every refusal, the client's errors."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import time
from pathlib import Path

import aiohttp
import pytest

from tierd.config_parsers import HostPort
from tierd.errors import FsError, Reason
from tierd.meta.store import MetaStore
from tierd.peer import auth, registry
from tierd.peer.client import NotHeld, PeerClient, StaleVersion
from tierd.peer.door import PeerDoor, PeerDoorError, default_url
from tierd.peer.server import MAX_LENGTH, FileSlice

from .conftest import SECRET, Held, running_door


async def _raw(door: PeerDoor, path: str, query: dict[str, str],
               headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A GET at the door as sent, with exactly ``headers``."""
    async with aiohttp.ClientSession() as s, \
            s.get(door.url + path, params=query, headers=headers or {}) as r:
        return r.status, await r.read()


def _signed(path: str, query: dict[str, str], *, secret: str = SECRET, node: str = "n2",
            now: float | None = None) -> dict[str, str]:
    return auth.sign(secret, node, "GET", path, query, now=now)


def _q(version: int, offset: int, length: int) -> dict[str, str]:
    return {"version": str(version), "offset": str(offset), "length": str(length)}


@pytest.mark.parametrize("send", ["bytes", "sendfile"])
async def test_signed_reads_return_the_exact_bytes(meta: MetaStore, tmp_path: Path,
                                                   send: str) -> None:
    rng = random.Random(20)
    data = rng.randbytes(3 << 20)
    held = Held({7: (3, data)}, fd_dir=tmp_path if send == "sendfile" else None)
    fds = len(os.listdir("/proc/self/fd"))
    async with running_door(meta, held) as door:
        assert door.bound is not None and door.bound.port != 0
        assert door.url == f"http://127.0.0.1:{door.bound.port}"
        client = PeerClient("n2", SECRET, meta)
        try:
            for _ in range(150):
                off = rng.randrange(0, len(data) + 100)
                length = rng.choice([0, 1, 4095, 4096, 65537, rng.randrange(0, 1 << 20)])
                assert await client.read("n1", 7, 3, off, length) == data[off:off + length]
            # the largest request the door takes; many at once
            assert await client.read("n1", 7, 3, 0, MAX_LENGTH) == data
            offs = [rng.randrange(0, len(data)) for _ in range(32)]
            got = await asyncio.gather(*(client.read("n1", 7, 3, o, 300_000) for o in offs))
            assert got == [data[o:o + 300_000] for o in offs]
            assert await client.ping("n1") == {"node": "n1",
                                               "time_ns": pytest.approx(time.time_ns(),
                                                                        abs=5e9)}
        finally:
            await client.close()
        assert held.reads == 183
    assert len(os.listdir("/proc/self/fd")) <= fds  # every descriptor sent was closed


async def test_a_file_cut_while_it_is_sent_is_a_short_answer_and_eio(
        meta: MetaStore, tmp_path: Path) -> None:
    """A hot file shorter than the FileSlice its reader promised (cut meanwhile): the
    client sees fewer bytes than the Content-Length and refuses them, never returning a
    short or padded range as if it were the file."""
    path = tmp_path / "hot"
    path.write_bytes(b"x" * 100_000)

    async def lying(ino: int, version: int, offset: int, length: int) -> FileSlice:
        fd = os.open(path, os.O_RDONLY)
        os.truncate(path, 50_000)
        return FileSlice(fd, offset, length)

    door = PeerDoor(node="n1", secret=SECRET, listen=HostPort("127.0.0.1", 0), meta=meta,
                    reader=lying)
    await door.start()
    client = PeerClient("n2", SECRET, meta, retries=0, read_timeout_s=5)
    try:
        t0 = time.monotonic()
        with pytest.raises(FsError) as err:
            await client.read("n1", 7, 3, 0, 100_000)
        assert err.value.errno == errno.EIO and "'n1'" in str(err.value)
        # the door closes the connection at once rather than leave the client waiting
        # for bytes that will never come (until its read timeout)
        assert time.monotonic() - t0 < 3
    finally:
        await client.close()
        await door.stop()


async def test_unsigned_requests_are_refused_with_401(meta: MetaStore) -> None:
    held = Held({7: (3, b"x" * 100)})
    async with running_door(meta, held) as door:
        path, q = "/v1/data/7", _q(3, 0, 10)
        status, body = await _raw(door, path, q)
        assert status == 401
        assert json.loads(body)["node"] == "n1"
        assert (await _raw(door, "/v1/ping", {}))[0] == 401
        good = _signed(path, q)
        for name, value in [(auth.HDR_AUTH, "AWS4-HMAC-SHA256 " + "0" * 64),
                            (auth.HDR_AUTH, auth.SCHEME + " zz"),
                            (auth.HDR_NODE, "Not A Name"),
                            (auth.HDR_DATE, "yesterday")]:
            assert (await _raw(door, path, q, {**good, name: value}))[0] == 401, name
        for name in good:
            partial = {k: v for k, v in good.items() if k != name}
            assert (await _raw(door, path, q, partial))[0] == 401, name
        assert (await _raw(door, path, q, good))[0] == 200
        assert held.reads == 1  # no refused request reached the reader


async def test_a_wrong_secret_or_tampered_request_is_refused_with_403(meta: MetaStore) -> None:
    held = Held({7: (3, b"x" * 100)})
    async with running_door(meta, held) as door:
        path, q = "/v1/data/7", _q(3, 0, 10)
        status, body = await _raw(door, path, q, _signed(path, q, secret="another-secret-xyz"))
        assert status == 403
        msg = json.loads(body)["error"]
        assert "cluster_secret" in msg and SECRET not in msg
        # signed for another range, another inode, another sender
        assert (await _raw(door, path, _q(3, 0, 99), _signed(path, q)))[0] == 403
        assert (await _raw(door, "/v1/data/8", q, _signed(path, q)))[0] == 403
        forged = {**_signed(path, q), auth.HDR_NODE: "n3"}
        assert (await _raw(door, path, q, forged))[0] == 403
        # the client maps a refusal to EIO naming the node
        client = PeerClient("n2", "another-secret-xyz", meta)
        try:
            with pytest.raises(FsError) as err:
                await client.read("n1", 7, 3, 0, 10)
        finally:
            await client.close()
        assert err.value.errno == errno.EIO and "'n1'" in str(err.value)
        assert "403" in str(err.value)
        assert held.reads == 0


async def test_stale_or_future_dates_are_refused_with_403(meta: MetaStore) -> None:
    held = Held({7: (3, b"x" * 100)})
    async with running_door(meta, held) as door:
        path, q = "/v1/data/7", _q(3, 0, 10)
        now = time.time()
        for skew in (-auth.MAX_SKEW_S - 30, auth.MAX_SKEW_S + 30, -86400):
            status, body = await _raw(door, path, q, _signed(path, q, now=now + skew))
            assert status == 403, skew
            assert "clock" in json.loads(body)["error"]
        # within the window: accepted
        for skew in (-auth.MAX_SKEW_S + 30, auth.MAX_SKEW_S - 30):
            assert (await _raw(door, path, q, _signed(path, q, now=now + skew)))[0] == 200
        assert held.reads == 2


async def test_a_changed_version_is_409_and_the_clients_stale_version(
        meta: MetaStore) -> None:
    held = Held({7: (4, b"new bytes")})
    async with running_door(meta, held) as door:
        path, q = "/v1/data/7", _q(3, 0, 10)
        status, body = await _raw(door, path, q, _signed(path, q))
        assert status == 409 and "version 4" in json.loads(body)["error"]
        client = PeerClient("n2", SECRET, meta)
        try:
            with pytest.raises(StaleVersion) as err:
                await client.read("n1", 7, 3, 0, 10)
            assert err.value.errno == errno.ESTALE
            assert await client.read("n1", 7, 4, 4, 100) == b"bytes"
        finally:
            await client.close()


async def test_an_inode_the_node_does_not_hold_is_404_and_not_held(meta: MetaStore) -> None:
    held = Held({7: (3, b"x")})
    async with running_door(meta, held) as door:
        path, q = "/v1/data/8", _q(3, 0, 10)
        status, body = await _raw(door, path, q, _signed(path, q))
        assert status == 404 and json.loads(body)["node"] == "n1"
        client = PeerClient("n2", SECRET, meta)
        try:
            with pytest.raises(NotHeld) as err:
                await client.read("n1", 8, 3, 0, 10)
        finally:
            await client.close()
        assert err.value.errno == errno.ESTALE and "inode 8" in str(err.value)


async def test_oversize_and_bad_parameters_are_400(meta: MetaStore) -> None:
    held = Held({7: (3, b"x" * 100)})
    async with running_door(meta, held) as door:
        bad: list[tuple[str, dict[str, str]]] = [
            ("/v1/data/7", _q(3, 0, MAX_LENGTH + 1)),
            ("/v1/data/7", {"version": "3", "offset": "0"}),
            ("/v1/data/7", {**_q(3, 0, 1), "offset": "-1"}),
            ("/v1/data/7", {**_q(3, 0, 1), "version": "abc"}),
            ("/v1/data/7", {**_q(3, 0, 1), "length": str(1 << 64)}),
            ("/v1/data/7", {**_q(3, 0, 1), "offset": "١٢"}),  # non-ASCII digits
            ("/v1/data/x7", _q(3, 0, 1)),
        ]
        for path, q in bad:
            status, body = await _raw(door, path, q, _signed(path, q))
            assert status == 400, (path, q)
            assert json.loads(body)["error"]
        assert held.reads == 0
        # signed but at no route: the router's 404
        assert (await _raw(door, "/v1/nothing", {}, _signed("/v1/nothing", {})))[0] == 404


async def test_a_stopped_peer_is_eio_naming_the_node(meta: MetaStore) -> None:
    held = Held({7: (3, b"x" * 100)})
    client = PeerClient("n2", SECRET, meta, backoff_s=0.01)
    try:
        async with running_door(meta, held) as door:
            assert await client.read("n1", 7, 3, 0, 4) == b"xxxx"  # (a kept-alive connection)
            url = door.url
        with pytest.raises(FsError) as err:
            await client.read("n1", 7, 3, 0, 4)
        assert err.value.errno == errno.EIO and err.value.reason == Reason.SERVICE_UNAVAILABLE
        assert "'n1'" in str(err.value) and url in str(err.value)
        # a node that never registered, and one whose heartbeat is past the lease
        with pytest.raises(FsError) as err:
            await client.read("n9", 7, 3, 0, 4)
        assert err.value.errno == errno.EIO and "'n9'" in str(err.value)
        old = time.time_ns() - int(60e9)
        await asyncio.to_thread(registry.register, meta, "n4",
                                              "http://127.0.0.1:1", now_ns=old)
        with pytest.raises(FsError) as err:
            await client.read("n4", 7, 3, 0, 4)
        assert err.value.errno == errno.EIO and "'n4'" in str(err.value)
        assert "down" in str(err.value)
    finally:
        await client.close()


async def test_a_restarted_peer_on_another_port_is_found_again(meta: MetaStore) -> None:
    """The client keeps a node's URL for a second; a refused connection makes it look the
    URL up again, so a node restarted elsewhere is read without an error."""
    held = Held({7: (3, b"abcdef")})
    client = PeerClient("n2", SECRET, meta, backoff_s=0.01)
    try:
        async with running_door(meta, held) as first:
            assert await client.read("n1", 7, 3, 1, 2) == b"bc"
            old = first.url
        async with running_door(meta, held) as second:
            assert second.url != old
            assert await client.read("n1", 7, 3, 2, 3) == b"cde"
    finally:
        await client.close()


def test_default_url_of_a_wildcard_is_the_host_name() -> None:
    import socket

    assert default_url(HostPort("0.0.0.0", 9100)) == f"http://{socket.gethostname()}:9100"
    assert default_url(HostPort("::1", 9100)) == "http://[::1]:9100"
    assert default_url(HostPort("10.1.2.3", 1)) == "http://10.1.2.3:1"


async def test_a_port_in_use_is_a_startup_error_naming_the_setting(meta: MetaStore) -> None:
    async with running_door(meta, Held()) as first:
        assert first.bound is not None
        second = PeerDoor(node="n2", secret=SECRET, listen=first.bound, meta=meta,
                          reader=Held().read)
        with pytest.raises(PeerDoorError) as err:
            await second.start()
        assert "address already in use" in str(err.value) and "peer_listen" in str(err.value)
        assert registry.lookup(meta, "n2") is None  # never registered: nothing answers there


async def test_a_store_that_cannot_register_stops_the_door(tmp_path: Path) -> None:
    """Listening comes first, registering second: a failed registration closes the port
    again, so no node is ever told of a door that is not there."""
    meta = MetaStore.open_lmdb(tmp_path / "gone")
    meta.close()
    door = PeerDoor(node="n1", secret=SECRET, listen=HostPort("127.0.0.1", 0), meta=meta,
                    reader=Held().read)
    with pytest.raises(PeerDoorError) as err:
        await door.start()
    assert "'n1'" in str(err.value) and "registry" in str(err.value)
    assert door.bound is not None
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", door.bound.port)
