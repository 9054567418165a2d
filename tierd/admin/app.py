"""The admin API's aiohttp application.

Endpoints:

* ``GET /healthz`` -- ``200 ok`` while the daemon serves (for load balancers and systemd
  watchdogs: no JSON parsing needed);
* ``GET /v1/status`` -- JSON: version, uptime, data dir, pid, namespace counts, metadata
  engine figures and the listen addresses;
* ``GET``/``POST``/``DELETE /v1/mounts`` -- the daemon's FUSE mount, attached and removed
  while it runs (:mod:`~tierd.admin.mounts`);
* ``GET /v1/openapi.json`` -- the document of every endpoint (:mod:`tierd.admin.openapi`);
* the others in their modules: placement and ``/v1/tiers`` (:mod:`~tierd.admin.placement`),
  jobs (:mod:`~tierd.admin.jobs`), buckets and policies (:mod:`~tierd.admin.buckets`),
  users and keys (:mod:`~tierd.admin.users`), pool and checkpoints
  (:mod:`~tierd.admin.pool`); docs/admin-api.md describes them all.

Every error is JSON ``{"error": code, "message": text}`` with the matching status, so
``tierctl`` and scripts never have to parse HTML error pages.

The admin door follows the layering rule of the design: it never touches metadata or tiers
itself.  It asks an :class:`~tierd.admin.backend.AdminBackend` (the daemon) for what it
serves; that Protocol declares everything the routes may call.  Each module's endpoints are
module-level handlers on its ``routes`` (:class:`aiohttp.web.RouteTableDef`), which find the
daemon and the shared state (jobs, policy stores, tokens) under :class:`aiohttp.web.AppKey` keys
set here.

**Authentication** (:mod:`tierd.admin.auth`): everything but ``/healthz`` needs the admin
token (``Authorization: Bearer``) or an admin user's SigV4 signature; otherwise 401.

**Limits**: request bodies (JSON documents) up to 1 MiB, request line and each header up to
8 KiB, at most 100 headers, and idle connections (also one trickling its headers) closed
after :data:`IDLE_TIMEOUT` seconds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from tierd.admin import buckets, jobs, mounts, openapi, page, placement, pool, users
from tierd.admin.auth import AdminAuth, auth_middleware
from tierd.admin.backend import AUTH, BACKEND, AdminBackend, json_error
from tierd.logs import get_logger

log = get_logger("admin")

#: largest request body (the API's documents are small JSON objects)
MAX_BODY = 1 << 20
#: seconds an idle connection (or one still sending its headers) is kept open
IDLE_TIMEOUT = 60.0
#: aiohttp's parser limits: request line, each header, number of headers
LIMITS = {"max_line_size": 8190, "max_field_size": 8190, "max_headers": 100}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
}


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn aiohttp's HTML/text error responses and unexpected exceptions into JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _CODES.get(exc.status, "error")
        if exc.status == 404:
            message = f"no such endpoint: {request.method} {request.path}"
        elif exc.status == 405:
            message = f"method {request.method} not allowed on {request.path}"
        else:
            message = exc.reason
        return json_error(exc.status, code, message)
    except RecursionError:  # json.loads of a body nested thousands deep
        return json_error(400, "bad_request", "the body is nested too deeply")
    except Exception:
        log.exception("admin request failed: %s %s", request.method, request.path)
        return json_error(500, "internal", "internal error; see the tierd log")


routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


@routes.get("/v1/status")
async def status(request: web.Request) -> web.Response:
    return web.json_response(request.app[BACKEND].status())


def make_admin_app(backend: AdminBackend, auth: AdminAuth) -> web.Application:
    """Build the admin application served on ``admin_listen``, guarded by ``auth``: every
    module's routes (module-level handlers on its ``routes`` table), with the daemon and
    the shared state under their :class:`aiohttp.web.AppKey` keys."""
    app = web.Application(middlewares=[_json_errors, auth_middleware(auth)],
                          client_max_size=MAX_BODY,
                          handler_args={"keepalive_timeout": IDLE_TIMEOUT, **LIMITS})
    app[BACKEND] = backend
    app[AUTH] = auth
    app[jobs.JOBS] = manager = jobs.JobManager(backend.placement_ops)
    app[buckets.POLICY_STORES] = buckets.PolicyStores()
    app.on_startup.append(page.load_read_token)
    app.on_startup.append(openapi.prepare)  # after every route is added
    app.on_shutdown.append(manager.shutdown)
    app.add_routes(routes)
    for module in (mounts, openapi, page, placement, jobs, pool, users, buckets):
        app.add_routes(module.routes)
    return app
