"""Placeholder S3 application until the gateway proper lands (issue #3).

It answers ``GET /healthz`` with ``200 ok`` and every other request with the S3-style XML
error ``501 NotImplemented``, so S3 clients pointed at tierd fail with a clear S3 error
(boto3 shows "NotImplemented") instead of an HTML page or a connection error.

Note for issue #3: in path-style addressing ``GET /healthz`` is also ListObjects on a bucket
named ``healthz``.  The gateway should keep answering health checks only for unsigned
requests without a query string (or reserve the bucket name) and say so in the docs.
"""

from __future__ import annotations

import uuid
from xml.sax.saxutils import escape

from aiohttp import web


def s3_error_xml(code: str, message: str, resource: str, request_id: str) -> str:
    """The body of an S3 error response (``<Error>`` document)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
        f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId></Error>"
    )


def make_s3_app() -> web.Application:
    """Build the placeholder application served on ``s3_listen``."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def not_implemented(request: web.Request) -> web.Response:
        request_id = uuid.uuid4().hex[:16].upper()
        headers = {"x-amz-request-id": request_id, "Server": "tierd"}
        body = s3_error_xml(
            "NotImplemented",
            "The S3 gateway is not implemented yet in this tierd version.",
            request.path,
            request_id,
        )
        if request.method == "HEAD":
            # HEAD responses carry no body; S3 clients read the status code only.
            return web.Response(status=501, headers=headers, content_type="application/xml")
        return web.Response(status=501, text=body, headers=headers, content_type="application/xml")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/{tail:.*}", not_implemented)
    return app
