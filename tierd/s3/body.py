"""Request bodies, decoded and verified while they stream.

A :class:`Body` is the async iterable the namespace's ``put_object``/``upload_part`` consume.
It undoes ``aws-chunked`` framing (signed chunks, unsigned chunks with trailers), and checks,
as the bytes pass:

* every chunk signature of ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`` (and the trailer
  signature) -> SignatureDoesNotMatch;
* a hex ``x-amz-content-sha256`` -> XAmzContentSHA256Mismatch;
* ``Content-MD5`` -> BadDigest (InvalidDigest when malformed);
* an ``x-amz-checksum-*`` header or trailer (CRC32, CRC32C, CRC64NVME, SHA1, SHA256) -> BadDigest;
* the declared length -> IncompleteBody.

A failure raises :class:`S3Error` from the iterator: the namespace then discards its staging
file, so the previous object stays intact.  Nothing is buffered beyond one read from the
socket, and nothing is copied: pieces are the ``bytes`` aiohttp received (plain bodies) or
``memoryview`` slices of them (aws-chunked data; only the framing lines are copied).
Iterated, the body hashes ~1 MiB per thread hop (hashlib and zlib release the GIL), so the
event loop only receives; :meth:`Body.payload` instead hands the digests to a consumer that
hashes in the same thread job as it writes (multipart parts: one hop per batch, not three).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import re
from collections.abc import AsyncIterator

from aiohttp import web

from tierd.namespace.api import Payload
from tierd.s3 import checksums
from tierd.s3.auth import (
    EMPTY_SHA256,
    STREAMING,
    STREAMING_SIGNED,
    STREAMING_SIGNED_TRAILER,
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    Auth,
    sign,
)
from tierd.s3.checksums import Hasher
from tierd.s3.errors import S3Error
from tierd.tiers.fileio import INLINE_BYTES

PIECE = 1 << 20  # largest read handed on at once
PREFETCH = 16  # pieces (at most one socket read each, <= 256 KiB) received ahead
INLINE_CRC = 4 * INLINE_BYTES  # a CRC alone (~6 GB/s) is worth a thread hop only past this
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_MAX_LINE = 4096


Buffer = bytes | memoryview


def _update(hashers: list[Hasher], pieces: list[Buffer]) -> None:
    for p in pieces:
        for h in hashers:
            h.update(p)


async def _hash(hashers: list[Hasher], pieces: list[Buffer], size: int) -> None:
    """Feed pieces to digests: on the loop when small, else in a thread (hashlib and zlib
    release the GIL for large buffers)."""
    if not hashers or not size:
        return
    crc_only = len(hashers) == 1 and isinstance(hashers[0], checksums.Crc)
    if size <= INLINE_BYTES or (crc_only and size <= INLINE_CRC):
        _update(hashers, pieces)
    else:
        await asyncio.to_thread(_update, hashers, pieces)


class Body:
    """The decoded, verified payload of one request (iterate it exactly once)."""

    def __init__(self, request: web.Request, auth: Auth | None, *,
                 max_size: int | None = None,
                 checksum_algorithm: str | None = None,
                 checksum_headers: bool = True) -> None:
        """``checksum_headers`` False: the request's ``x-amz-checksum-*`` headers describe
        something else than this body (CompleteMultipartUpload: the whole object) and are
        left to the handler."""
        self.request = request
        self.auth = auth  # None: an anonymous request (tierd.s3.access)
        self.max_size = max_size
        h = request.headers
        payload = auth.payload if auth is not None else h.get("X-Amz-Content-SHA256",
                                                              UNSIGNED_PAYLOAD)
        if auth is None and payload in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER):
            raise S3Error("AccessDenied", "a signed aws-chunked body needs a signed request")
        self.declared = payload  # x-amz-content-sha256 (UNSIGNED-PAYLOAD when absent)
        encodings = [e.strip().lower() for e in h.get("Content-Encoding", "").split(",")]
        self.chunked = payload in STREAMING or "aws-chunked" in encodings
        if not self.chunked and payload != UNSIGNED_PAYLOAD and not _HEX64.match(payload):
            raise S3Error("InvalidArgument", "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, "
                          "STREAMING-... or the hex SHA-256 of the payload",
                          ArgumentName="x-amz-content-sha256", ArgumentValue=payload)
        self.signed_chunks = payload in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER)
        self.trailer_expected = payload in (STREAMING_SIGNED_TRAILER,
                                            STREAMING_UNSIGNED_TRAILER)
        self.length: int | None
        if self.chunked:
            raw = h.get("X-Amz-Decoded-Content-Length")
            if raw is None:
                raise S3Error("MissingContentLength", "aws-chunked bodies need the "
                              "x-amz-decoded-content-length header")
            self.length = _int(raw, "x-amz-decoded-content-length")
        else:
            self.length = request.content_length
            if self.length is None and request.method == "PUT" and (
                    "chunked" not in h.get("Transfer-Encoding", "").lower()):
                raise S3Error("MissingContentLength")
        if max_size is not None and self.length is not None and self.length > max_size:
            raise S3Error("EntityTooLarge", f"the body is {self.length} bytes; the limit for "
                          f"this request is {max_size}", ProposedSize=str(self.length),
                          MaxSizeAllowed=str(max_size))

        # what to verify
        self._sha256 = hashlib.sha256() if _HEX64.match(payload) else None
        self._md5 = None
        self._md5_expected = b""
        if "Content-MD5" in h:
            try:
                self._md5_expected = base64.b64decode(h["Content-MD5"], validate=True)
            except (binascii.Error, ValueError):
                self._md5_expected = b""
            if len(self._md5_expected) != 16:
                raise S3Error("InvalidDigest")
            self._md5 = hashlib.md5()
        given = [(a, h[checksums.META_PREFIX + a]) for a in checksums.ALGORITHMS
                 if checksum_headers and checksums.META_PREFIX + a in h]
        if len(given) > 1:
            raise S3Error("InvalidRequest", "Expecting a single x-amz-checksum- header. "
                          "Multiple checksum Types are not allowed.")
        self.algorithm: str | None = None
        self._expected: bytes | None = None
        self._trailer_name = ""
        #: the client sent a checksum (header or trailer) that this body is verified against
        self.client_checksum = bool(given) or bool(h.get("X-Amz-Trailer", "").strip())
        if given:
            self.algorithm = given[0][0]
            self._expected = checksums.decode(self.algorithm, given[0][1])
        trailer = h.get("X-Amz-Trailer", "").strip().lower()
        if trailer:
            if not self.trailer_expected:
                raise S3Error("InvalidRequest", "x-amz-trailer needs a STREAMING-...-TRAILER "
                              "x-amz-content-sha256")
            alg = trailer.removeprefix(checksums.META_PREFIX)
            if not trailer.startswith(checksums.META_PREFIX) or alg not in checksums.ALGORITHMS:
                raise S3Error("InvalidRequest", f"unsupported trailer {trailer!r}")
            if self.algorithm is not None and self.algorithm != alg:
                raise S3Error("InvalidRequest", "Expecting a single x-amz-checksum- header")
            self.algorithm = alg
            self._trailer_name = trailer
        elif self.trailer_expected:
            raise S3Error("InvalidRequest", "STREAMING-...-TRAILER bodies need the "
                          "x-amz-trailer header")
        if checksum_algorithm is not None and self.algorithm is None:
            self.algorithm = checksum_algorithm  # computed only (multipart uploads)
        if checksum_algorithm is not None and self.algorithm != checksum_algorithm:
            raise S3Error("InvalidRequest", f"Checksum Type mismatch occurred, expected "
                          f"checksum Type: {checksum_algorithm}, actual checksum Type: "
                          f"{self.algorithm}")
        self._checksum = checksums.new_hasher(self.algorithm) if self.algorithm else None
        self.size = 0
        #: algorithm -> base64 value of the verified (or computed) checksum, after iteration
        self.checksums: dict[str, str] = {}
        self._consumed = False
        # the socket's current piece and how much of it the decoder used
        self._buf = b""
        self._view = memoryview(b"")
        self._pos = 0
        self._final: bytes | None = None  # the checksum the body must match, once known

    # -- iteration ---------------------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[bytes]:
        """The payload, verified as it streams (the last piece is followed by the final
        checks)."""
        pieces = self._pieces()
        if not self.chunked and self.length is not None and self.length <= PIECE:
            return self._hashed(pieces)  # one piece: nothing to overlap, no reader task
        return _prefetch(self._hashed(pieces))

    def payload(self) -> Payload:
        """The payload for a consumer that hashes while it writes (multipart parts): the
        whole-payload digests go along as ``hashers`` to be updated in the consumer's own
        thread job, and ``verify`` (the final checks; it fills :attr:`checksums`) must run
        after every byte was hashed.  Nothing is copied: pieces are views of socket reads."""
        self._start()
        return Payload(self._pieces(), self.length, self._digests(), self.verify)

    def verify(self) -> None:
        """The checks of a fully consumed :meth:`payload` (raises :class:`S3Error`)."""
        self._finish(self._final)

    def _start(self) -> None:
        if self._consumed:
            raise RuntimeError("a request body can be read only once")
        self._consumed = True

    def _digests(self) -> list[Hasher]:
        out: list[Hasher] = [x for x in (self._sha256, self._md5, self._checksum)
                             if x is not None]
        return out

    async def read_all(self, limit: int) -> bytes:
        """The whole (small) body, for XML documents; MalformedXML/EntityTooLarge past
        ``limit``."""
        if self.length is not None and self.length > limit:
            raise S3Error("EntityTooLarge", f"the request body may be at most {limit} bytes")
        out = bytearray()
        async for piece in self:
            out += piece
            if len(out) > limit:
                raise S3Error("EntityTooLarge", f"the request body may be at most {limit} "
                              "bytes")
        return bytes(out)

    async def _hashed(self, pieces: AsyncIterator[Buffer]) -> AsyncIterator[bytes]:
        """Pieces hashed here, ~``PIECE`` bytes per thread hop, then the final checks.
        Consumers of an iterated body get ``bytes`` (a view of aws-chunked data is copied
        once, as it was joined before)."""
        self._start()
        digests = self._digests()
        batch: list[Buffer] = []
        size = 0
        async for piece in pieces:
            batch.append(piece)
            size += len(piece)
            if size >= PIECE:
                await _hash(digests, batch, size)
                for p in batch:
                    yield p if isinstance(p, bytes) else bytes(p)
                batch, size = [], 0
        await _hash(digests, batch, size)
        for p in batch:
            yield p if isinstance(p, bytes) else bytes(p)
        self._finish(self._final)

    # -- decoding ----------------------------------------------------------------------
    async def _fill(self) -> bool:
        """Make the next piece the socket gave the current buffer (as aiohttp holds it: no
        copy); False at the end of the body."""
        content = self.request.content
        try:
            while True:
                data, end_of_http_chunk = await content.readchunk()
                if data:
                    break
                # (b"", True) ends an HTTP chunk -- and is all aiohttp's shared empty
                # payload answers after its first call
                if not end_of_http_chunk or content.at_eof():
                    return False
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            raise S3Error("IncompleteBody", f"the connection closed before the body was "
                          f"complete ({e})") from None
        self._buf = data
        self._view = memoryview(data)
        self._pos = 0
        return True

    def _count(self, n: int) -> None:
        self.size += n
        if self.max_size is not None and self.size > self.max_size:
            raise S3Error("EntityTooLarge", f"the body exceeds {self.max_size} bytes")
        if self.length is not None and self.size > self.length:
            raise S3Error("IncompleteBody", f"the body is longer than the {self.length} "
                          "bytes announced")

    def _pieces(self) -> AsyncIterator[Buffer]:
        return self._chunked() if self.chunked else self._plain()

    async def _plain(self) -> AsyncIterator[Buffer]:
        while await self._fill():
            self._pos = len(self._buf)
            self._count(len(self._buf))
            yield self._buf
        self._final = self._expected

    async def _chunked(self) -> AsyncIterator[Buffer]:
        """Undo aws-chunked framing: the data of each chunk is yielded as views of the
        socket's pieces; only header lines are copied."""
        prev_sig = self.auth.signature if self.auth is not None else ""
        while True:
            line = await self._line()
            head, _, ext = line.partition(b";")
            try:
                size = int(head.strip(), 16)
            except ValueError:
                raise S3Error("InvalidRequest", f"malformed aws-chunked chunk header "
                              f"{line[:80]!r}") from None
            if size < 0:
                raise S3Error("InvalidRequest", "negative aws-chunked chunk size")
            chunk_sig = ""
            if self.signed_chunks:
                k, _, v = ext.decode("latin-1").partition("=")
                if k.strip() != "chunk-signature" or not v:
                    raise S3Error("SignatureDoesNotMatch", "an aws-chunked chunk has no "
                                  "chunk-signature")
                chunk_sig = v.strip().lower()
            chunk_hash = hashlib.sha256() if self.signed_chunks else None
            remaining = size
            while remaining:
                if self._pos == len(self._buf) and not await self._fill():
                    raise S3Error("IncompleteBody", "the body ended inside an aws-chunked "
                                  "chunk")
                take = min(remaining, len(self._buf) - self._pos)
                if take == len(self._buf):
                    piece: Buffer = self._buf
                else:
                    piece = self._view[self._pos:self._pos + take]
                self._pos += take
                remaining -= take
                self._count(take)
                if chunk_hash is not None:
                    await _hash([chunk_hash], [piece], take)
                yield piece
            if chunk_hash is not None:
                assert self.auth is not None  # signed chunks are refused without a signature
                sts = "\n".join(("AWS4-HMAC-SHA256-PAYLOAD", self.auth.amz_date,
                                 self.auth.scope, prev_sig, EMPTY_SHA256,
                                 chunk_hash.hexdigest()))
                if not hmac.compare_digest(sign(self.auth.signing_key, sts).encode(),
                                           chunk_sig.encode("latin-1")):  # str: ASCII only
                    raise S3Error("SignatureDoesNotMatch", "the signature of an aws-chunked "
                                  "chunk does not match", StringToSign=sts)
                prev_sig = chunk_sig
            if size == 0:
                break
            if (await self._line()).strip():
                raise S3Error("InvalidRequest", "an aws-chunked chunk is longer than its "
                              "declared size")
        if self.trailer_expected:
            self._final = await self._trailer(prev_sig)
        else:
            if (await self._line(eof_ok=True)).strip():
                raise S3Error("InvalidRequest", "data after the final aws-chunked chunk")
            self._final = self._expected

    async def _line(self, eof_ok: bool = False) -> bytes:
        """The next CRLF-terminated line of the framing, without its line end; at the end
        of the body b"" if ``eof_ok``, else IncompleteBody."""
        parts: list[bytes] = []
        total = 0
        while True:
            if self._pos == len(self._buf) and not await self._fill():
                if eof_ok and not parts:
                    return b""
                raise S3Error("IncompleteBody", "the aws-chunked body ended early")
            i = self._buf.find(b"\n", self._pos)
            end = len(self._buf) if i < 0 else i + 1
            parts.append(self._buf[self._pos:end])
            total += end - self._pos
            self._pos = end
            if total > _MAX_LINE:
                raise S3Error("InvalidRequest", "an aws-chunked header or trailer line is "
                              "too long")
            if i >= 0:
                return b"".join(parts).rstrip(b"\r\n")

    async def _trailer(self, prev_sig: str) -> bytes | None:
        fields: list[tuple[str, str]] = []
        signature = ""
        while True:
            line = await self._line(eof_ok=True)
            if not line:
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise S3Error("InvalidRequest", f"malformed trailer line {line[:80]!r}")
            name, value = name.strip().lower(), value.strip()
            if name == "x-amz-trailer-signature":
                signature = value.lower()
            else:
                fields.append((name, value))
        if self.auth is not None and self.declared == STREAMING_SIGNED_TRAILER:
            canonical = "".join(f"{n}:{v}\n" for n, v in fields)
            sts = "\n".join(("AWS4-HMAC-SHA256-TRAILER", self.auth.amz_date, self.auth.scope,
                             prev_sig, hashlib.sha256(canonical.encode()).hexdigest()))
            if not hmac.compare_digest(sign(self.auth.signing_key, sts).encode(),
                                       signature.encode("latin-1")):
                raise S3Error("SignatureDoesNotMatch", "the trailer signature does not match",
                              StringToSign=sts)
        values = dict(fields)
        if self._trailer_name not in values:
            raise S3Error("InvalidRequest", f"the trailer {self._trailer_name} announced in "
                          "x-amz-trailer was not sent")
        assert self.algorithm is not None
        return checksums.decode(self.algorithm, values[self._trailer_name])

    def _finish(self, expected: bytes | None) -> None:
        if self.length is not None and self.size != self.length:
            raise S3Error("IncompleteBody", f"received {self.size} bytes of the "
                          f"{self.length} announced")
        if self._sha256 is not None and self._sha256.hexdigest() != self.declared:
            raise S3Error("XAmzContentSHA256Mismatch",
                          ClientComputedContentSHA256=self.declared,
                          S3ComputedContentSHA256=self._sha256.hexdigest())
        if self._md5 is not None and self._md5.digest() != self._md5_expected:
            raise S3Error("BadDigest", "The Content-MD5 you specified did not match what we "
                          "received.",
                          ExpectedDigest=base64.b64encode(self._md5_expected).decode(),
                          CalculatedDigest=base64.b64encode(self._md5.digest()).decode())
        if self._checksum is not None and self.algorithm is not None:
            got = self._checksum.digest()
            if expected is not None and got != expected:
                raise S3Error("BadDigest", f"The {self.algorithm.upper()} you specified did "
                              "not match the calculated checksum.")
            self.checksums[self.algorithm] = checksums.encode(got)


#: reader tasks of bodies being received (the loop keeps only weak references to tasks)
_READERS: set[asyncio.Future[None]] = set()


async def _prefetch(source: AsyncIterator[bytes], depth: int = PREFETCH) -> AsyncIterator[bytes]:
    """Run ``source`` (socket reads, decoding, verification) in its own task, ``depth``
    pieces ahead of the consumer, so receiving the next piece overlaps with the consumer
    writing and hashing this one (the two cores work at once).  Errors arrive in order."""
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(depth)

    async def produce() -> None:
        try:
            async for piece in source:
                await queue.put(piece)
            await queue.put(None)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # handed to the consumer, raised there
            await queue.put(e)

    task = asyncio.ensure_future(produce())
    _READERS.add(task)  # held until done: never collected while pending
    task.add_done_callback(_READERS.discard)
    try:
        while True:
            item = await queue.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _int(raw: str, name: str) -> int:
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise S3Error("InvalidArgument", f"{name} must be a non-negative integer",
                      ArgumentName=name, ArgumentValue=raw)
    return n
