"""The peer data door's client: read bytes another node holds.

:class:`PeerClient` finds the home node's door in the registry (:mod:`tierd.peer.registry`),
signs each request (:mod:`tierd.peer.auth`) and maps every failure to an error the
namespace can act on:

* the home is unknown, dead (heartbeat older than the lease), unreachable, or answers
  something unexpected -> ``FsError(EIO, reason=SERVICE_UNAVAILABLE)`` naming the node: the
  bytes exist only on that node's hot tier, so there is nothing else to read them from;
* 409 -> :class:`StaleVersion`, 404 -> :class:`NotHeld` (both :class:`PeerMiss`, errno
  ESTALE): the home no longer has that version (it was overwritten, or persisted and
  evicted); the caller re-reads the inode and reads the new place (cold, or a newer version).

A connection refused or cut before an answer is retried a few times with a short backoff,
looking the URL up again each time (a restarted node may listen elsewhere); a GET reads
nothing twice, so a retry is always safe.  The registry entry is kept for
:data:`URL_TTL_S` between lookups, so a run of reads costs no metadata round trip each.
"""

from __future__ import annotations

import asyncio
import errno
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from yarl import URL

from tierd.errors import FsError, Reason
from tierd.meta.store import MetaStore
from tierd.peer import auth, registry
from tierd.peer.registry import NodeInfo

#: how long (seconds) a looked-up registry entry is used before it is read again
URL_TTL_S = 1.0


def _down(message: str) -> FsError:
    """A "the peer cannot answer" error: EIO, and the S3 door answers 503 (as for a cold
    store that does not answer)."""
    return FsError(errno.EIO, message, Reason.SERVICE_UNAVAILABLE)


class PeerMiss(FsError):
    """The home node does not hold the version asked for (any more)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ESTALE, message)


class StaleVersion(PeerMiss):
    """409: the home's inode is at another version now: re-read the metadata."""


class NotHeld(PeerMiss):
    """404: the home does not hold that version (persisted and evicted, or never its own)."""


async def _body(resp: aiohttp.ClientResponse, home: str, path: str, limit: int) -> bytes:
    """The whole body of ``resp``, at most ``limit`` bytes (more, or fewer than its
    Content-Length, is ``FsError(EIO)``: a peer never answers that)."""
    size = resp.content_length
    if size is not None:
        if size > limit:
            raise _down(f"node {home!r} answered {path} with {size} bytes, "
                        f"over the {limit} asked for")
        body = await resp.read()
        if len(body) != size:
            raise _down(f"node {home!r} cut its answer to {path} short "
                        f"({len(body)} of {size} bytes)")
        return body
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        buf += chunk
        if len(buf) > limit:
            raise _down(f"node {home!r} answered {path} with more than the "
                        f"{limit} bytes asked for")
    return bytes(buf)


def _message(body: bytes) -> str:
    """The error message of a peer's JSON error document (or the start of the body)."""
    try:
        doc: Any = json.loads(body)
        return str(doc.get("error", ""))[:300]
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


class PeerClient:
    """Reads of other nodes' hot bytes, for node ``node`` of the cluster sharing ``meta``.
    One HTTP session (a pool of kept-alive connections) for every peer; :meth:`close` it."""

    def __init__(self, node: str, secret: str, meta: MetaStore, *,
                 lease_s: float = registry.LEASE_S, connect_timeout_s: float = 3.0,
                 read_timeout_s: float = 30.0, retries: int = 3,
                 backoff_s: float = 0.05) -> None:
        self.node = node
        self._secret = secret
        self.meta = meta
        self.lease_s = lease_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s,
                                              sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._known: dict[str, tuple[float, NodeInfo]] = {}

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on first use: it must be made on the running loop
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, auto_decompress=False,
                connector=aiohttp.TCPConnector(limit=64, limit_per_host=16))
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _where(self, home: str, fresh: bool,
                     holds: str = "the unpersisted bytes") -> NodeInfo:
        """``home``'s registry entry, alive, or ``FsError(EIO)`` saying it ``holds`` what
        was asked for."""
        now = time.monotonic()
        known = self._known.get(home)
        if fresh or known is None or now - known[0] > URL_TTL_S:
            info = await asyncio.to_thread(registry.lookup, self.meta, home)
            if info is None:
                raise _down(f"node {home!r} holds {holds} but is "
                            "not in the cluster's node registry")
            known = (now, info)
            self._known[home] = known
        info = known[1]
        if not registry.alive(info, lease_s=self.lease_s):
            self._known.pop(home, None)
            raise _down(f"node {home!r} holds {holds} but is down "
                        f"(last heartbeat {registry.age_s(info):.0f} s ago)")
        return info

    async def _get(self, home: str, path: str, query: dict[str, str],
                   limit: int) -> tuple[int, bytes]:
        """Status and body of a signed GET of ``path`` at ``home``'s door (a body over
        ``limit`` bytes is an error), retrying connection failures."""
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            info = await self._where(home, fresh=attempt > 0)
            url = URL(info.url + path)  # (a URL with a path prefix signs the whole path)
            headers = auth.sign(self._secret, self.node, "GET", url.path, query)
            try:
                async with self._http().get(url, params=query,
                                            headers=headers) as resp:
                    return resp.status, await _body(resp, home, path,
                                                    limit if resp.status == 200 else 65536)
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                if isinstance(e, aiohttp.ServerTimeoutError):
                    raise _down(f"node {home!r} at {info.url} did not answer "
                                f"in time: {e}") from e
                last = e
                if attempt < self.retries:
                    await asyncio.sleep(self.backoff_s * (2 ** attempt))
        raise _down(f"node {home!r}: its peer door at {info.url} is unreachable "
                    f"({last}); the bytes it has not persisted are nowhere else")

    async def read(self, home: str, ino: int, version: int, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` of version ``version`` of ``ino`` from node
        ``home``'s hot tier (fewer at the end of the file).  ``length`` must not exceed the
        door's per-request limit (:data:`tierd.peer.server.MAX_LENGTH`); callers split
        larger reads."""
        path = f"/v1/data/{ino}"
        query = {"version": str(version), "offset": str(offset), "length": str(length)}
        status, body = await self._get(home, path, query, length)
        if status == 200:
            return body
        why = _message(body)
        if status == 409:
            raise StaleVersion(f"node {home!r} no longer has version {version} of inode "
                               f"{ino}: {why}")
        if status == 404:
            raise NotHeld(f"node {home!r} does not hold version {version} of inode {ino}: "
                          f"{why}")
        raise _down(f"node {home!r} refused to read inode {ino} "
                    f"(HTTP {status}): {why}")

    async def stream_part(self, home: str, upload_id: str, number: int, etag: str,
                          size: int, sink: Callable[[bytes], Awaitable[None]]) -> int:
        """Hand part ``number`` of multipart upload ``upload_id`` (the one with this
        ``etag`` and ``size``), as node ``home`` holds it, to ``sink`` chunk by chunk;
        returns how many bytes.  :class:`NotHeld` when ``home`` holds no such part (it
        was uploaded again, or the upload ended); ``FsError(EIO)`` naming ``home`` when it
        cannot answer.  A connection failure before the first byte is retried as
        :meth:`read`'s; after it, bytes already handed over cannot be taken back: EIO."""
        path = f"/v1/part/{upload_id}/{number}"
        query = {"etag": etag, "size": str(size)}
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            info = await self._where(home, fresh=attempt > 0,
                                     holds=f"part {number} of upload {upload_id!r}")
            url = URL(info.url + path)
            headers = auth.sign(self._secret, self.node, "GET", url.path, query)
            got = 0
            try:
                async with self._http().get(url, params=query, headers=headers) as resp:
                    if resp.status != 200:
                        status = resp.status
                        why = _message(await _body(resp, home, path, 65536))
                        break
                    async for chunk in resp.content.iter_chunked(1 << 20):
                        got += len(chunk)
                        if got > size:
                            raise _down(f"node {home!r} sent more than the {size} bytes "
                                        f"of part {number} of upload {upload_id!r}")
                        await sink(chunk)
                    return got
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                if got or isinstance(e, aiohttp.ServerTimeoutError):
                    raise _down(f"node {home!r} at {info.url} stopped sending part "
                                f"{number} of upload {upload_id!r} after {got} bytes: "
                                f"{e}") from e
                last = e
                if attempt < self.retries:
                    await asyncio.sleep(self.backoff_s * (2 ** attempt))
        else:
            raise _down(f"node {home!r}: its peer door at {info.url} is unreachable "
                        f"({last}); part {number} of upload {upload_id!r} is on its hot "
                        "tier alone: complete the upload again once the node is back")
        if status == 404:
            raise NotHeld(f"node {home!r} does not hold part {number} of upload "
                          f"{upload_id!r} with ETag {etag}: {why}")
        raise _down(f"node {home!r} refused to send part {number} of upload {upload_id!r} "
                    f"(HTTP {status}): {why}")

    async def ping(self, home: str) -> dict[str, Any]:
        """``home``'s signed ping answer (``node``, ``time_ns``), or ``FsError(EIO)``."""
        status, body = await self._get(home, "/v1/ping", {}, 4096)
        if status != 200:
            raise _down(f"node {home!r} refused a ping (HTTP {status}): "
                        f"{_message(body)}")
        doc: dict[str, Any] = json.loads(body)
        return doc
