"""The peer door's multipart part route over real sockets: a signed GET streams one part
held on the node's disk (``sendfile``) to a client that hands it on chunk by chunk; every
refusal maps to the error Complete acts on (tierd.namespace.mpu_remote)."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from tierd.config_parsers import HostPort
from tierd.errors import FsError, Reason
from tierd.meta.store import MetaStore
from tierd.peer import auth, registry
from tierd.peer.client import NotHeld, PeerClient
from tierd.peer.door import PeerDoor
from tierd.peer.server import FileSlice, PartReader

from .conftest import SECRET, Held

UPLOAD = "Up-load_id-0123456789"


class Parts:
    """Parts held in files of one directory: (upload, number) -> (etag, path)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.held: dict[tuple[str, int], tuple[str, Path]] = {}
        self.asked = 0

    def put(self, upload: str, number: int, data: bytes) -> str:
        path = self.root / f"{upload}.{number}"
        path.write_bytes(data)
        etag = hashlib.md5(data).hexdigest()
        self.held[(upload, number)] = (etag, path)
        return etag

    async def read(self, upload: str, number: int, etag: str,
                   size: int) -> FileSlice | None:
        self.asked += 1
        got = self.held.get((upload, number))
        if got is None or got[0] != etag or got[1].stat().st_size != size:
            return None
        return FileSlice(os.open(got[1], os.O_RDONLY), 0, size)


@asynccontextmanager
async def door_with(meta: MetaStore, parts: PartReader | None) -> AsyncIterator[PeerDoor]:
    door = PeerDoor(node="n1", secret=SECRET, listen=HostPort("127.0.0.1", 0), meta=meta,
                    reader=Held().read, part_reader=parts)
    await door.start()
    try:
        yield door
    finally:
        await door.stop()


async def _stream(client: PeerClient, etag: str, size: int,
                  number: int = 1, home: str = "n1") -> tuple[bytes, int]:
    """(the bytes, how many chunks the sink got)."""
    out: list[bytes] = []

    async def sink(b: bytes) -> None:
        out.append(b)

    got = await client.stream_part(home, UPLOAD, number, etag, size, sink)
    data = b"".join(out)
    assert got == len(data)
    return data, len(out)


async def test_a_part_streams_in_chunks_with_its_exact_bytes(meta: MetaStore,
                                                            tmp_path: Path) -> None:
    parts = Parts(tmp_path)
    big = os.urandom((5 << 20) + 12345)
    etag = parts.put(UPLOAD, 1, big)
    empty = parts.put(UPLOAD, 2, b"")
    client = PeerClient("n2", SECRET, meta)
    try:
        async with door_with(meta, parts.read):
            data, chunks = await _stream(client, etag, len(big))
            assert data == big and chunks > 1  # handed on as it arrives, not whole
            assert await _stream(client, empty, 0, 2) == (b"", 0)
            # another etag or size than the record's: the node does not hold that part
            for e, n in (("0" * 32, len(big)), (etag, len(big) - 1)):
                with pytest.raises(NotHeld) as err:
                    await _stream(client, e, n)
                assert err.value.errno == errno.ESTALE and "'n1'" in str(err.value)
    finally:
        await client.close()


async def test_the_part_route_is_signed_and_checks_its_parameters(meta: MetaStore,
                                                                  tmp_path: Path) -> None:
    parts = Parts(tmp_path)
    etag = parts.put(UPLOAD, 1, b"abc")
    path, q = f"/v1/part/{UPLOAD}/1", {"etag": etag, "size": "3"}
    async with door_with(meta, parts.read) as door, aiohttp.ClientSession() as s:
        async with s.get(door.url + path, params=q) as r:
            assert r.status == 401
        bad = auth.sign("another-secret-of-16+", "n2", "GET", path, q)
        async with s.get(door.url + path, params=q, headers=bad) as r:
            assert r.status == 403
        assert parts.asked == 0
        for p, query in ((path, {"etag": "XYZ", "size": "3"}),
                         (path, {"etag": etag, "size": "-1"}),
                         (f"/v1/part/{UPLOAD}/x", q), ("/v1/part/a.b/1", q),
                         (f"/v1/part/{UPLOAD}/0", q), (f"/v1/part/{UPLOAD}/10001", q),
                         (f"/v1/part/{UPLOAD}/{2**40}", q)):
            async with s.get(door.url + p, params=query,
                             headers=auth.sign(SECRET, "n2", "GET", p, query)) as r:
                assert r.status == 400, (p, query)
        async with s.get(door.url + path, params=q,
                         headers=auth.sign(SECRET, "n2", "GET", path, q)) as r:
            assert r.status == 200 and await r.read() == b"abc"
    async with door_with(meta, None) as door, aiohttp.ClientSession() as s, \
            s.get(door.url + path, params=q,
                  headers=auth.sign(SECRET, "n2", "GET", path, q)) as r:
        assert r.status == 404  # a door without multipart parts holds none


async def test_a_node_down_or_a_part_cut_short_is_eio_naming_the_node(
        meta: MetaStore, tmp_path: Path) -> None:
    parts = Parts(tmp_path)
    data = os.urandom(1 << 20)
    etag = parts.put(UPLOAD, 1, data)
    client = PeerClient("n2", SECRET, meta, backoff_s=0.01)

    async def cut(upload: str, number: int, e: str, size: int) -> FileSlice | None:
        got = await parts.read(upload, number, e, size)
        if got is not None:
            os.truncate(parts.held[(upload, number)][1], size // 2)  # cut while sent
        return got

    try:
        async with door_with(meta, cut):
            with pytest.raises(FsError) as err:
                await _stream(client, etag, len(data))
            assert err.value.errno == errno.EIO and "'n1'" in str(err.value)
        with pytest.raises(FsError) as err:  # the door stopped: unreachable
            await _stream(client, etag, len(data))
        assert err.value.errno == errno.EIO and err.value.reason == Reason.SERVICE_UNAVAILABLE
        assert "'n1'" in str(err.value) and "once the node is back" in str(err.value)
        # a node whose heartbeat is past its lease is not even asked
        await asyncio.to_thread(registry.register, meta, "n4", "http://127.0.0.1:1",
                                now_ns=time.time_ns() - int(60e9))
        with pytest.raises(FsError) as err:
            await _stream(client, etag, len(data), home="n4")
        assert err.value.errno == errno.EIO and "'n4'" in str(err.value)
        assert "down" in str(err.value) and "part 1 of upload" in str(err.value)
    finally:
        await client.close()
