"""Body.payload(): the zero-copy decoding a part upload consumes.  The bytes arrive in pieces
of every size (so framing lines and trailers straddle socket reads), the consumer hashes,
and verify() gives the verdict afterwards, as the namespace's writer drives it."""

from __future__ import annotations

import asyncio
import base64
import gc
import hashlib
import zlib
from typing import Any

import pytest
from aiohttp import streams
from multidict import CIMultiDict, CIMultiDictProxy

from tierd.acl import Identity
from tierd.meta import AccessKey
from tierd.s3.auth import STREAMING_UNSIGNED_TRAILER, UNSIGNED_PAYLOAD, Auth
from tierd.s3.body import Body
from tierd.s3.errors import S3Error

from .test_unit import FakeRequest, _Proto


def _auth(payload: str) -> Auth:
    return Auth(AccessKey("K", "S", 0, 0), Identity.ROOT, b"k", "20260101T000000Z",
                "20260101/us-east-1/s3/aws4_request", "0" * 64, payload, False)


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def trailer_body(data: bytes, chunk: int, checksum: str) -> bytes:
    out = b""
    for i in range(0, len(data), chunk):
        piece = data[i:i + chunk]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + f"0\r\nx-amz-checksum-crc32:{checksum}\r\n\r\n".encode()


def consume(raw: bytes, headers: dict[str, str], payload: str, feed: int) -> tuple[bytes, Any]:
    """Feed ``raw`` to an aiohttp StreamReader in ``feed``-byte pieces while the payload is
    consumed, hash it as the namespace would, then verify; (bytes, body)."""
    async def run() -> tuple[bytes, Any]:
        reader = streams.StreamReader(_Proto(), 1 << 16,  # type: ignore[arg-type]
                                      loop=asyncio.get_running_loop())
        req = FakeRequest("PUT", "/b/k?partNumber=1&uploadId=u",
                          CIMultiDictProxy(CIMultiDict(headers)), reader)
        body = Body(req, _auth(payload), checksum_algorithm="crc32")  # type: ignore[arg-type]
        p = body.payload()

        async def feeder() -> None:
            for i in range(0, len(raw), feed):
                reader.feed_data(raw[i:i + feed])
                await asyncio.sleep(0)
            reader.feed_eof()

        task = asyncio.ensure_future(feeder())
        got = bytearray()
        async for piece in p.chunks:
            for h in p.hashers:
                h.update(piece)
            got += piece
        await task
        assert p.verify is not None
        p.verify()
        assert p.size == len(got)
        return bytes(got), body
    return asyncio.run(run())


@pytest.mark.parametrize("feed", [1, 7, 4096, 1 << 20])
def test_trailer_checksum_over_any_piece_size(feed: int) -> None:
    data = bytes(range(256)) * 300
    raw = trailer_body(data, 8192, crc32_b64(data))
    headers = {"Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": str(len(data)),
               "X-Amz-Trailer": "x-amz-checksum-crc32", "Content-Length": str(len(raw))}
    got, body = consume(raw, headers, STREAMING_UNSIGNED_TRAILER, feed)
    assert got == data
    assert body.checksums == {"crc32": crc32_b64(data)}


def test_bad_trailer_checksum_is_bad_digest_at_verify() -> None:
    data = b"x" * 70000
    raw = trailer_body(data, 65536, crc32_b64(b"something else"))
    headers = {"Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": str(len(data)),
               "X-Amz-Trailer": "x-amz-checksum-crc32"}
    with pytest.raises(S3Error) as e:
        consume(raw, headers, STREAMING_UNSIGNED_TRAILER, 1000)
    assert e.value.code == "BadDigest"


def test_longer_than_announced_fails_while_streaming() -> None:
    data = b"y" * 5000
    raw = trailer_body(data, 1000, crc32_b64(data))
    headers = {"Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": "4000",
               "X-Amz-Trailer": "x-amz-checksum-crc32"}
    with pytest.raises(S3Error) as e:
        consume(raw, headers, STREAMING_UNSIGNED_TRAILER, 512)
    assert e.value.code == "IncompleteBody"


def test_plain_body_pieces_are_the_received_bytes() -> None:
    data = hashlib.sha256(b"seed").digest() * 4000
    headers = {"Content-Length": str(len(data)), "x-amz-checksum-crc32": crc32_b64(data)}
    got, body = consume(data, headers, UNSIGNED_PAYLOAD, 10000)
    assert got == data and body.checksums == {"crc32": crc32_b64(data)}
    bad = {**headers, "x-amz-checksum-crc32": crc32_b64(b"no")}
    with pytest.raises(S3Error) as e:
        consume(data, bad, UNSIGNED_PAYLOAD, 10000)
    assert e.value.code == "BadDigest"


def _left_early(close: bool) -> tuple[list[dict[str, Any]], int]:
    """A large plain body whose consumer takes one piece and gives up (the hot tier was
    full), then either closes the iterator as the namespace does or drops it; what the
    loop's exception handler saw, and how many reader tasks are left."""
    from tierd.namespace.staging import close_source
    from tierd.s3.objects import _with_checksums

    async def run() -> tuple[list[dict[str, Any]], int]:
        loop = asyncio.get_running_loop()
        seen: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        reader = streams.StreamReader(_Proto(), 1 << 16,  # type: ignore[arg-type]
                                      loop=loop)
        size = 64 << 20
        headers = {"Content-Length": str(size), "x-amz-checksum-crc32": crc32_b64(b"")}
        req = FakeRequest("PUT", "/b/k", CIMultiDictProxy(CIMultiDict(headers)), reader)
        body = Body(req, _auth(UNSIGNED_PAYLOAD), checksum_algorithm="crc32")  # type: ignore[arg-type]
        reader.feed_data(b"z" * (3 << 20))  # more arrives later (the client still sends)
        chunks = aiter(_with_checksums(body, {}))
        assert len(await anext(chunks)) > 0
        await asyncio.sleep(0.05)  # the reader task is now waiting for the socket
        if close:  # the reader stops at once, before any collection
            await close_source(chunks)
            assert asyncio.all_tasks() == {asyncio.current_task()}
        del chunks, body, req, reader  # as when the request's connection goes away
        for _ in range(5):
            gc.collect()
            await asyncio.sleep(0.02)
        return seen, len(asyncio.all_tasks() - {asyncio.current_task()})
    return asyncio.run(run())


@pytest.mark.parametrize("close", [True, False])
def test_a_body_left_early_stops_its_reader_without_errors(close: bool) -> None:
    """Left to the garbage collector, the reader task was destroyed while pending and the
    generators' aclose() failed ("already running", "cannot reuse already awaited
    coroutine"), logged as tracebacks by the daemon.  Closed by the consumer, or collected,
    the chain now unwinds in order."""
    seen, readers = _left_early(close)
    assert [c.get("message") for c in seen] == []
    assert readers == 0
