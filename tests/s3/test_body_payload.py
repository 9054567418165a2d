"""Body.payload(): the zero-copy decoding a part upload consumes.  The bytes arrive in pieces
of every size (so framing lines and trailers straddle socket reads), the consumer hashes,
and verify() gives the verdict afterwards, as the namespace's writer drives it."""

from __future__ import annotations

import asyncio
import base64
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
