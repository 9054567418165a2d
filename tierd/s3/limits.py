"""Connection and request limits of the S3 door.

What each limit protects against, and what the client sees:

* **Request line and headers** (aiohttp's parser): a request line (method, URL, version) up to
  :data:`MAX_LINE` bytes -- a presigned URL of a 1,024-byte key fully percent-encoded fits --,
  each header up to :data:`MAX_FIELD` bytes and at most :data:`MAX_HEADERS` headers.  Past
  them (and for any request head aiohttp cannot parse) the answer is an S3 error document,
  ``400 RequestHeaderSectionTooLarge`` or ``400 InvalidRequest``, and the connection is
  closed (:mod:`tierd.s3.badhttp`, through :data:`RUNNER_CLASS`).  aiohttp logs such
  requests as errors with a traceback; :class:`BadRequestFilter` turns them into one
  ``info`` line (a client must not be able to flood the log with tracebacks, nor get its
  bytes echoed into it).
* **Idle connections** (:data:`IDLE_TIMEOUT`): a connection with no request in progress is
  closed after this long; that includes a client still trickling its headers (aiohttp's
  keep-alive timer runs until a whole request head has arrived), so slow-header attacks
  hold a connection for at most this long.
* **Stalled bodies** (:data:`BODY_TIMEOUT`): while a handler waits for body bytes that do
  not come, :func:`body_watchdog` ends the wait with ``400 RequestTimeout`` (AWS's answer
  when "your socket connection to the server was not read from or written to within the
  timeout period").  A body the handler is not reading (it is writing to disk) never times
  out: only the client's silence counts.
* XML bodies, DeleteObjects key counts and listing ``max-keys`` are limited where they are
  parsed (:mod:`tierd.s3.xmlio`, :mod:`tierd.s3.objects`, :func:`tierd.s3.common.max_keys`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware

from tierd.s3.errors import S3Error

MAX_LINE = 16 << 10
MAX_FIELD = 8190  # aiohttp's default, as AWS limits request headers to 8 KiB
MAX_HEADERS = 100
IDLE_TIMEOUT = 60.0
BODY_TIMEOUT = 60.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


#: the settings :func:`apply` leaves on the app for ``web.AppRunner(app, **...)``
RUNNER_ARGS = web.AppKey("tierd.runner_args", dict)
#: the runner class to serve the app with (:class:`tierd.s3.badhttp.S3Runner`)
RUNNER_CLASS: web.AppKey[type[web.AppRunner]] = web.AppKey("tierd.runner_class")


def handler_args(idle_timeout: float = IDLE_TIMEOUT) -> dict[str, Any]:
    """aiohttp ``RequestHandler`` settings for the S3 listener."""
    return {"keepalive_timeout": idle_timeout, "max_line_size": MAX_LINE,
            "max_field_size": MAX_FIELD, "max_headers": MAX_HEADERS}


def apply(app: web.Application, idle_timeout: float = IDLE_TIMEOUT,
          body_timeout: float = BODY_TIMEOUT) -> None:
    """Put the limits on an S3 app before it is served: the body watchdog as its outermost
    middleware, the parser limits and idle timeout in ``app[RUNNER_ARGS]`` and the runner
    class answering parse errors in S3's XML in ``app[RUNNER_CLASS]``, and
    :class:`BadRequestFilter` on aiohttp's server log."""
    from tierd.s3.badhttp import S3Runner

    app.middlewares.insert(0, body_watchdog(body_timeout))
    app[RUNNER_ARGS] = handler_args(idle_timeout)
    runner: type[web.AppRunner] = S3Runner
    app[RUNNER_CLASS] = runner
    BadRequestFilter.install()


class BadRequestFilter(logging.Filter):
    """Malformed requests (aiohttp's parser refused them) as one ``info`` line without the
    request's bytes or a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            what = str(exc.message).split(":", 1)[0].strip()
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args = "bad HTTP request from %s: %s (%s)", (
                remote, type(exc).__name__, what)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True

    @classmethod
    def install(cls) -> None:
        server = logging.getLogger("aiohttp.server")
        if not any(isinstance(f, cls) for f in server.filters):
            server.addFilter(cls())


class _Watched:
    __slots__ = ("fired", "request", "seen", "since")

    def __init__(self, request: web.Request, now: float) -> None:
        self.request = request
        self.seen = -1
        self.since = now
        self.fired = False


def body_watchdog(timeout: float = BODY_TIMEOUT) -> Middleware:
    """A middleware that ends body reads stalled for ``timeout`` seconds (see the module
    docstring).  One sweep task for all requests, a few times per ``timeout``, only while
    requests are in flight: no timer per read on the data path."""
    watched: dict[int, _Watched] = {}
    sweeper: list[asyncio.Task[None]] = []
    period = max(timeout / 4, 0.05)

    def sweep_once(now: float) -> None:
        for rid, w in list(watched.items()):
            content = w.request.content
            if content.is_eof():
                watched.pop(rid, None)
                continue
            total = content.total_bytes
            # a reader waits for bytes the client has not sent (aiohttp keeps the pending
            # read's future in ``_waiter``; no public accessor)
            waiting = getattr(content, "_waiter", None) is not None
            if total != w.seen or not waiting:
                w.seen, w.since = total, now
            elif now - w.since >= timeout:
                watched.pop(rid, None)
                w.fired = True
                content.set_exception(S3Error(
                    "RequestTimeout", f"no body bytes arrived for {timeout:g} seconds"))

    async def sweep() -> None:
        try:
            while watched:
                await asyncio.sleep(period)
                sweep_once(time.monotonic())
        finally:
            sweeper.clear()

    @contextlib.asynccontextmanager
    async def watching(request: web.Request) -> AsyncIterator[_Watched]:
        rid = id(request)
        w = watched[rid] = _Watched(request, time.monotonic())
        if not sweeper:
            sweeper.append(asyncio.get_running_loop().create_task(sweep()))
        try:
            yield w
        finally:
            watched.pop(rid, None)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.content.is_eof():  # no body (GET, HEAD, DELETE...)
            return await handler(request)
        async with watching(request) as w:
            resp = await handler(request)
            if w.fired:
                # the rest of the body is not worth waiting for: no lingering read of it
                # (it would meet the timeout error again), and the connection closes after
                # the answer instead of parsing late body bytes as a request
                request.content.feed_eof()
                resp.force_close()
            return resp

    return middleware
