"""S3 error documents for requests aiohttp's HTTP parser refuses.

A request whose head cannot be parsed -- a header over the size limit, too many headers, a
malformed ``Content-Length``, a request line that is not HTTP -- never reaches the S3
application: aiohttp answers it itself with a plain-text ``400 Bad Request`` (the
framework's, not S3's), which S3 clients cannot parse and which names the framework.
aiohttp has no hook for this (its issue 3287 asks for one), so the S3 listener's runner
(:class:`S3Runner`) makes its connections with :class:`S3RequestHandler`, whose
``handle_error`` answers the parser's errors with an S3 ``<Error>`` document:

* a request line or header over the limits, or too many headers:
  ``400 RequestHeaderSectionTooLarge`` (AWS's code for the same);
* anything else the parser refused: ``400 InvalidRequest`` naming what was wrong, never
  echoing the client's bytes.

The connection is closed afterwards, as aiohttp does: after a parse error the stream is no
longer in step with request boundaries.  Logging stays as :mod:`tierd.s3.limits` makes it
(one ``info`` line per refused request).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    LineTooLong,
)
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse
from aiohttp.web_server import Server

from tierd.logs import new_request_id
from tierd.s3.xmlio import error_document

_TOO_LARGE = "RequestHeaderSectionTooLarge"


def describe(exc: HttpProcessingError) -> tuple[str, str]:
    """(S3 code, message) for a parser error, without the request's own bytes."""
    if isinstance(exc, LineTooLong):
        return _TOO_LARGE, (f"the request line or a header is longer than {exc.args[1]} "
                            "bytes")
    text = str(exc.message)
    if text.startswith("Too many headers"):
        return _TOO_LARGE, "the request has too many headers"
    if isinstance(exc, InvalidHeader):
        name = exc.hdr if len(exc.hdr) <= 64 and exc.hdr.isprintable() else "a header"
        return "InvalidRequest", f"malformed HTTP request: invalid header {name}"
    if isinstance(exc, BadHttpMethod | BadStatusLine):
        return "InvalidRequest", "malformed HTTP request: the request line is not HTTP/1.x"
    if "Content-Length" in text:
        return "InvalidRequest", "malformed HTTP request: invalid Content-Length"
    if "Transfer-Encoding" in text:
        return "InvalidRequest", "malformed HTTP request: invalid Transfer-Encoding"
    return "InvalidRequest", "malformed HTTP request"


class S3RequestHandler(RequestHandler):
    """aiohttp's connection handler with S3 error documents for unparsable requests."""

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> StreamResponse:
        # aiohttp's own answer first: it logs the error (see limits.BadRequestFilter) and
        # refuses when part of a response was sent already
        plain = super().handle_error(request, status, exc, message)
        if not isinstance(exc, HttpProcessingError) or status >= 500:
            return plain
        code, text = describe(exc)
        request_id = new_request_id()
        body = error_document(code, text, "/", request_id, {})
        resp = web.Response(status=status, body=body.encode(), content_type="application/xml",
                            headers={"x-amz-request-id": request_id,
                                     "x-amz-id-2": request_id, "Server": "tierd"})
        resp.force_close()
        return resp


class _S3Server(Server):
    """aiohttp's server (the protocol factory) making :class:`S3RequestHandler`s."""

    def __call__(self) -> RequestHandler:
        return S3RequestHandler(self, loop=self._loop, **self._kwargs)


class S3Runner(web.AppRunner):
    """The S3 listener's ``AppRunner``: like aiohttp's, with :class:`_S3Server`.

    The server aiohttp builds (``Application._make_handler``) gets its class swapped
    instead of being built here, so the arguments it is built with stay aiohttp's (the
    class adds only ``__call__``, no state)."""

    async def _make_server(self) -> Any:
        server = await super()._make_server()
        server.__class__ = _S3Server
        return server
