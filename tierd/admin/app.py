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
itself.  It asks an :class:`AdminBackend` (the daemon) for what it serves.

**Authentication** (:mod:`tierd.admin.auth`): everything but ``/healthz`` needs the admin
token (``Authorization: Bearer``) or an admin user's SigV4 signature; otherwise 401.

**Limits**: request bodies (JSON documents) up to 1 MiB, request line and each header up to
8 KiB, at most 100 headers, and idle connections (also one trickling its headers) closed
after :data:`IDLE_TIMEOUT` seconds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from tierd.admin.auth import AdminAuth, auth_middleware
from tierd.logs import get_logger

log = get_logger("admin")

#: largest request body (the API's documents are small JSON objects)
MAX_BODY = 1 << 20
#: seconds an idle connection (or one still sending its headers) is kept open
IDLE_TIMEOUT = 60.0
#: aiohttp's parser limits: request line, each header, number of headers
LIMITS = {"max_line_size": 8190, "max_field_size": 8190, "max_headers": 100}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminBackend(Protocol):
    """What the admin API needs from the daemon.  Later issues add methods here."""

    def status(self) -> dict[str, Any]:
        """The ``/v1/status`` document."""
        ...


def json_error(status: int, code: str, message: str) -> web.Response:
    """The admin API's error answer, ``{"error": code, "message": text}`` (every module's)."""
    return web.json_response({"error": code, "message": message}, status=status)


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


def make_admin_app(backend: AdminBackend, auth: AdminAuth) -> web.Application:
    """Build the admin application served on ``admin_listen``, guarded by ``auth``."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def status(request: web.Request) -> web.Response:
        return web.json_response(backend.status())

    app = web.Application(middlewares=[_json_errors, auth_middleware(auth)],
                          client_max_size=MAX_BODY,
                          handler_args={"keepalive_timeout": IDLE_TIMEOUT, **LIMITS})
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/v1/status", status)
    from tierd.admin.mounts import add_mount_routes

    add_mount_routes(app, backend)  # the FUSE mount, attached while running
    from tierd.admin.openapi import add_openapi_route

    add_openapi_route(app)
    from tierd.admin.page import add_status_page

    add_status_page(app, backend, auth)  # GET /: the status page for browsers
    # placement (docs/placement.md): only when the backend has it (the daemon does)
    placement_ops = getattr(backend, "placement_ops", None)
    if placement_ops is not None:
        from tierd.admin.placement import add_placement_routes

        add_placement_routes(app, placement_ops)
        from tierd.admin.jobs import add_job_routes

        add_job_routes(app, placement_ops)
    memory = getattr(backend, "memory_door", None)
    if memory is not None:
        from tierd.admin.pool import add_pool_routes

        add_pool_routes(app, memory)
    directory = getattr(backend, "directory", None)
    if directory is not None:
        from tierd.admin.users import add_user_routes

        add_user_routes(app, directory)
        from tierd.admin.buckets import add_bucket_routes

        add_bucket_routes(app, directory, lambda: getattr(backend, "namespace", None))
    return app
