"""The peer data door's HTTP server: other nodes read the bytes this node holds.

Routes (every request signed: :mod:`tierd.peer.auth`):

* ``GET /v1/data/{ino}?version=V&offset=O&length=L`` -> 200 with the bytes
  ``[O, O+L)`` of version ``V`` of inode ``ino`` as this node holds them (fewer at the end
  of the file); 404 when this node does not hold that version; 409 when the inode is no
  longer at version ``V`` here (:class:`VersionGone`: the caller re-reads the metadata);
  400 for a bad parameter or a length over ``max_length``.
* ``GET /v1/part/{upload}/{n}?etag=E&size=S`` -> 200 with the ``S`` bytes of part ``n`` of
  multipart upload ``upload`` as this node holds it (streamed by ``sendfile``, never whole
  in memory); 404 when this node's current record of that part is not this ETag and size,
  or the upload ended (:mod:`tierd.namespace.mpu_remote`: another node completes it).
* ``GET /v1/ping`` -> ``{"node": ..., "time_ns": ...}``: a signed liveness check.

401: the request is not signed (or not in this door's form); 403: the signature or its date
is wrong.  Errors are small JSON documents ``{"error": ..., "node": ...}`` whose messages
never hold the secret or a signature.

What the bytes are is the daemon's business: it hands a :data:`LocalReader` that answers
from its hot tier only when its committed inode is at the asked version and it is the
inode's home.  The door adds authentication, bounds and the HTTP mapping, nothing else.
A reader that answers with a :class:`FileSlice` (an open descriptor of the hot file) has the
bytes sent by ``sendfile(2)``, without copies through Python buffers.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from tierd.errors import FsError
from tierd.logs import LogBudget, get_logger
from tierd.meta.uploads import MAX_PART_NUMBER, UPLOAD_ID
from tierd.peer import auth

log = get_logger("peer")



@dataclass(frozen=True)
class FileSlice:
    """An answer of a :data:`LocalReader` that the door sends with ``sendfile(2)``: the
    ``length`` bytes at ``offset`` of the open file ``fd``, no copy through Python.  The
    door owns ``fd`` and closes it once sent (a reader hands a descriptor of its own: a
    fresh ``os.open`` or an ``os.dup``).  ``length`` is already cut to the file's end; a
    file shorter than that when it is sent shows as a short answer, which the client
    refuses (EIO), never as other bytes."""

    fd: int
    offset: int
    length: int


#: ``(ino, version, offset, length) -> bytes`` (fewer than ``length`` at the end of the
#: file) or a :class:`FileSlice`; None when this node does not hold that version, or
#: :class:`VersionGone`
LocalReader = Callable[[int, int, int, int],
                       Awaitable[bytes | memoryview | FileSlice | None]]

#: the largest ``length`` one request may ask for (bytes)
MAX_LENGTH = 16 << 20
_MAX_INT = (1 << 63) - 1

#: ``(upload id, part number, etag, size) -> FileSlice`` of that part held here, or None
PartReader = Callable[[str, int, str, int], Awaitable[FileSlice | None]]
_ETAG = re.compile(r"[0-9a-f]{32}")

_NODE: web.AppKey[str] = web.AppKey("tierd.peer.node", str)


class VersionGone(Exception):
    """Raised by a :data:`LocalReader`: the inode is not (or no longer) at the version
    asked for on this node; the door answers 409 and the caller re-reads the metadata."""


def _error(request: web.Request, status: int, message: str) -> web.Response:
    body = json.dumps({"error": message, "node": request.app[_NODE]})
    return web.Response(status=status, text=body, content_type="application/json")


def _int_param(request: web.Request, name: str, value: str | None) -> int:
    if value is None:
        raise ValueError(f"{name} is missing")
    if not value.isascii() or not value.isdigit() or len(value) > 19 or int(value) > _MAX_INT:
        raise ValueError(f"{name} must be a whole number from 0 to 2**63-1, not {value[:40]!r}")
    return int(value)


async def _send_file(request: web.Request, part: FileSlice,
                     limit: int) -> web.StreamResponse:
    """Send ``part`` with the event loop's ``sendfile`` (asyncio falls back to reads and
    writes where the transport cannot), and close its descriptor."""
    with open(part.fd, "rb", buffering=0, closefd=True) as f:
        count = max(0, min(part.length, limit))
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = count
        await resp.prepare(request)  # (a StreamResponse sends its headers here)
        transport = request.transport
        if count:
            if transport is None:
                raise ConnectionResetError("the peer closed the connection")
            sent = await asyncio.get_running_loop().sendfile(transport, f, part.offset, count)
            if sent != count:  # the file was cut meanwhile: the answer cannot be finished
                log.warning("peer read: the file sent ended after %d of %d bytes; "
                            "connection closed", sent, count)
                transport.close()  # (the client sees a cut answer, never a short one)
                return resp
        await resp.write_eof()
        return resp


def make_app(node: str, secret: str, reader: LocalReader, *,
             max_length: int = MAX_LENGTH, max_skew_s: float = auth.MAX_SKEW_S,
             clock: Callable[[], float] = time.time,
             part_reader: PartReader | None = None) -> web.Application:
    """The door's application for node ``node``; ``clock`` is the clock the signatures'
    dates are judged by (tests move it); ``part_reader`` serves multipart parts (without
    it the part route answers 404)."""

    refusals = LogBudget(10, 60.0)

    @web.middleware
    async def signed(request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        try:
            auth.verify(secret, request.method, request.path,
                                 request.query.items(), request.headers,
                                 now=clock(), max_skew_s=max_skew_s)
        except auth.AuthError as e:
            left_out = refusals.take()  # a misconfigured node retries all the time
            if left_out is not None:
                log.warning("peer request %s %s from %s refused (%d): %s%s", request.method,
                            request.path, request.remote, e.status, e.message,
                            f" ({left_out} more refusals not logged)" if left_out else "")
            return _error(request, e.status, e.message)
        return await handler(request)

    async def data(request: web.Request) -> web.StreamResponse:
        try:
            ino = _int_param(request, "ino", request.match_info["ino"])
            version = _int_param(request, "version", request.query.get("version"))
            offset = _int_param(request, "offset", request.query.get("offset"))
            length = _int_param(request, "length", request.query.get("length"))
        except ValueError as e:
            return _error(request, 400, str(e))
        if length > max_length:
            return _error(request, 400, f"length {length} is over the {max_length} bytes one "
                                        "peer request may read")
        try:
            got = await reader(ino, version, offset, length)
        except VersionGone as e:
            return _error(request, 409, f"inode {ino} is not at version {version} on node "
                                        f"{node}: {e}")
        except FsError as e:
            log.warning("peer read of inode %d v%d for node %s failed: %s", ino, version,
                        request.headers[auth.HDR_NODE], e)
            return _error(request, 503, f"node {node} could not read inode {ino}: {e}")
        if got is None:
            return _error(request, 404, f"node {node} does not hold version {version} of "
                                        f"inode {ino}")
        if isinstance(got, FileSlice):
            return await _send_file(request, got, length)
        if len(got) > length:
            got = memoryview(got)[:length]
        return web.Response(body=got, content_type="application/octet-stream")

    async def part(request: web.Request) -> web.StreamResponse:
        upload_id = request.match_info["upload"]
        etag = request.query.get("etag", "")
        try:
            number = _int_param(request, "part number", request.match_info["number"])
            if not 1 <= number <= MAX_PART_NUMBER:
                raise ValueError(f"part number must be 1 to {MAX_PART_NUMBER}, not {number}")
            size = _int_param(request, "size", request.query.get("size"))
        except ValueError as e:
            return _error(request, 400, str(e))
        if not UPLOAD_ID.fullmatch(upload_id) or not _ETAG.fullmatch(etag):
            return _error(request, 400, "the upload id or the part's etag is malformed")
        try:
            got = None if part_reader is None else await part_reader(upload_id, number,
                                                                     etag, size)
        except (FsError, OSError) as e:
            log.warning("peer read of part %d of upload %r for node %s failed: %s", number,
                        upload_id, request.headers[auth.HDR_NODE], e)
            return _error(request, 503, f"node {node} could not read part {number} of "
                                        f"upload {upload_id!r}: {e}")
        if got is None:
            return _error(request, 404, f"node {node} does not hold part {number} with "
                                        f"ETag {etag} of upload {upload_id!r}")
        return await _send_file(request, got, got.length)

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"node": node, "time_ns": time.time_ns()})

    app = web.Application(middlewares=[signed])
    app[_NODE] = node
    app.router.add_get("/v1/data/{ino}", data)
    app.router.add_get("/v1/part/{upload}/{number}", part)
    app.router.add_get("/v1/ping", ping)
    return app
