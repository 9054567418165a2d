"""``GET /metrics`` on the admin listener, and the admin door's own request accounting.

The exposition sits behind the admin API's authentication like everything but
``/healthz``: the figures name buckets' tenants and show the daemon's load, which is the
operator's business.  Prometheus sends the token with ``authorization: credentials_file:``
(docs/observability.md has the scrape configuration).

:func:`instrument_admin` puts :func:`tierd.metrics.request_middleware` in front of every other
middleware, so a request refused by authentication is counted (as ``4xx``) and its log
line carries the request id, which the response echoes in ``X-Request-Id``.
"""

from __future__ import annotations

from aiohttp import web

from tierd.metrics import CONTENT_TYPE, Metrics, admin_operation, request_middleware

#: response header carrying an admin request's id (the S3 door uses x-amz-request-id)
REQUEST_ID_HEADER = "X-Request-Id"


#: the registry ``GET /metrics`` renders
METRICS: web.AppKey[Metrics] = web.AppKey("tierd.admin.metrics")


async def scrape(request: web.Request) -> web.Response:
    """``GET /metrics``: the Prometheus exposition of the daemon's registry."""
    body = await request.app[METRICS].render()
    # CONTENT_TYPE carries its own charset parameter: set the header whole
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def instrument_admin(app: web.Application, metrics: Metrics) -> None:
    """Serve ``GET /metrics`` and count every admin request (before the app is frozen)."""
    app[METRICS] = metrics
    app.router.add_get("/metrics", scrape)
    app.middlewares.insert(0, request_middleware(metrics, "admin", admin_operation,
                                                 header=REQUEST_ID_HEADER))
