"""Who may call the admin API: the admin token or an admin user's SigV4 signature.

* **Token**: ``Authorization: Bearer <token>``.  The token is generated at first start into
  ``<data_dir>/admin-token`` (mode 0600: whoever can read it is the daemon's operator) or
  taken from ``TIERD_ADMIN_TOKEN`` when the daemon starts with it set (deployments that
  hand secrets in through the environment); ``tierctl`` reads the same file.
* **SigV4**: a request signed like an S3 request (service ``s3``, the daemon's region) with an
  access key of a user whose admin flag is set.  The verifier is the S3 door's own
  (:class:`tierd.s3.auth.Authenticator`): one implementation of SigV4, not two.  A signed
  payload hash is checked against the body here, since the admin API reads bodies whole.

* **Read-only token**: ``<data_dir>/read-token`` (mode 0600, generated at first start by
  :func:`bootstrap_read_token`), as ``Authorization: Bearer`` or as the status page's
  HttpOnly cookie :data:`READ_COOKIE`.  It may GET :data:`READ_PATHS` (the status page,
  the documents it shows, ``/metrics``) and nothing else: a monitor or a browser tab
  holding it can look, never change anything, and never sees users or keys.

``GET /healthz`` and the status page's login (``POST /login``, :mod:`tierd.admin.page`)
need nothing.  Everything else without valid credentials gets ``401 {"error":
"unauthorized"}`` (``GET /`` answers its login form instead); a valid signature of a
non-admin user, or the read-only token outside :data:`READ_PATHS`, gets ``403 {"error":
"forbidden"}``.  Every request that changes something is logged with
the identity that made it (never the token or a secret).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from tierd.acl.secrets import holds, write_private
from tierd.logs import get_logger, kv
from tierd.s3.auth import STREAMING, UNSIGNED_PAYLOAD, Authenticator
from tierd.s3.errors import S3Error

log = get_logger("admin")

TOKEN_FILE = "admin-token"
ENV_TOKEN = "TIERD_ADMIN_TOKEN"
#: where the identity of an authenticated request is kept on the request
IDENTITY = "tierd.admin.identity"
#: (method, path) answered without credentials: health checks and the status page's login
OPEN_ROUTES = frozenset({("GET", "/healthz"), ("HEAD", "/healthz"), ("POST", "/login")})
READ_TOKEN_FILE = "read-token"
#: the status page's session cookie: the read-only token, HttpOnly, SameSite=Strict
READ_COOKIE = "tierd_read"
#: what the read-only token may GET (the status page and what it fetches, ``/metrics``)
READ_PATHS = frozenset({"/", "/v1/status", "/v1/tiers", "/v1/jobs", "/v1/ckpt", "/v1/pool",
                        "/metrics"})
#: the identities of the read-only token (header, cookie)
READ_IDENTITIES = frozenset({"read-token", "read-cookie"})
_MIN_TOKEN = 16

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokenError(ValueError):
    """An unusable ``TIERD_ADMIN_TOKEN`` (the daemon refuses to start with the message)."""


def _usable(token: str) -> bool:
    """Whether ``token`` can be a token: long enough, and sent whole in a header."""
    return len(token) >= _MIN_TOKEN and token.isprintable() and " " not in token


def bootstrap_admin_token(data_dir: Path, env: Mapping[str, str] | None = None) -> str:
    """The admin token: ``TIERD_ADMIN_TOKEN`` if set, else the one in ``admin-token``, else a
    new random one; the file is (re)written with mode 0600 when it does not hold it."""
    env = os.environ if env is None else env
    path = data_dir / TOKEN_FILE
    token = env.get(ENV_TOKEN, "").strip()
    if token:
        if not _usable(token):
            raise TokenError(f"{ENV_TOKEN} must be at least {_MIN_TOKEN} printable characters "
                             "without spaces")
        source = "environment"
    else:
        try:
            token = path.read_text().strip()
            source = "existing"
        except FileNotFoundError:
            token = ""
        if len(token) < _MIN_TOKEN:
            token = secrets.token_urlsafe(32)
            source = "generated"
    if not holds(path, (token + "\n").encode()):  # (start-up on a full disk writes nothing)
        write_private(path, (token + "\n").encode())
    log.info("admin API token", extra=kv(file=str(path), source=source))
    return token


def bootstrap_read_token(data_dir: Path) -> str:
    """The read-only token of ``read-token`` (mode 0600), generated when missing or short.

    A file only, no environment variable: it opens nothing but the status documents, so
    whoever runs the daemon hands a copy to a monitor or a colleague's browser."""
    path = data_dir / READ_TOKEN_FILE
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if not _usable(token):
        token = secrets.token_urlsafe(32)
    if not holds(path, (token + "\n").encode()):  # as the admin token's: a chmod, no write
        write_private(path, (token + "\n").encode())
    log.info("admin API read-only token", extra=kv(file=str(path)))
    return token


def _deny(status: int, message: str) -> web.Response:
    code = "unauthorized" if status == 401 else "forbidden"
    headers = {"WWW-Authenticate": 'Bearer realm="tierd-admin"'} if status == 401 else None
    return web.json_response({"error": code, "message": message}, status=status,
                             headers=headers)


class AdminAuth:
    """The admin API's check (see the module docstring)."""

    def __init__(self, token: str, sigv4: Authenticator | None,
                 read_token: str | None = None) -> None:
        self._token = token.encode()
        self.sigv4 = sigv4
        # until the daemon loads read-token (tierd.admin.page), a random one: the status
        # page's login with the admin token still gets a session cookie
        self.read_token = read_token or secrets.token_urlsafe(32)

    @property
    def read_token(self) -> str:
        return self._read.decode()

    @read_token.setter
    def read_token(self, token: str) -> None:
        self._read = token.encode()

    def token_kind(self, value: str) -> str | None:
        """``admin``, ``read`` or None for a presented token (compared in constant time)."""
        got = value.strip().encode(errors="surrogateescape")
        if hmac.compare_digest(got, self._token):
            return "admin"
        if hmac.compare_digest(got, self._read):
            return "read"
        return None

    async def identify(self, request: web.Request) -> str | web.Response:
        """The caller's identity for the log (``token`` or ``user:NAME key:ID``), or the
        401/403 response to send instead."""
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer":
            kind = self.token_kind(value)
            if kind is not None:
                return "token" if kind == "admin" else "read-token"
            return _deny(401, "the admin token is wrong")
        if self.sigv4 is not None and Authenticator.is_signed(request):
            return await self._signed(request, self.sigv4)
        cookie = request.cookies.get(READ_COOKIE)
        if cookie is not None and hmac.compare_digest(
                cookie.encode(errors="surrogateescape"), self._read):
            return "read-cookie"
        return _deny(401, "the admin API needs 'Authorization: Bearer <token>' (the token "
                     f"is in the daemon's data directory, file {TOKEN_FILE}) or a SigV4 "
                     "signature of an admin user")

    async def _signed(self, request: web.Request, sigv4: Authenticator) -> str | web.Response:
        try:
            auth = sigv4.authenticate(request)
        except S3Error as e:
            return _deny(401, f"{e.code}: {e.message}")
        if auth is None:  # an anonymous request (when the verifier has such a path)
            return _deny(401, "the request is not signed")
        who = f"user:{auth.key.user or '-'} key:{auth.key.access_key}"
        if not auth.key.admin:
            return _deny(403, f"{who} is not an admin user")
        if auth.payload in STREAMING:
            return _deny(401, "streaming (aws-chunked) bodies are not accepted here")
        if auth.payload != UNSIGNED_PAYLOAD:
            body = await request.read()  # bounded by the app's client_max_size
            if not hmac.compare_digest(hashlib.sha256(body).hexdigest().encode(),
                                       auth.payload.lower().encode(errors="surrogateescape")):
                return _deny(401, "x-amz-content-sha256 does not match the body")
        return who


def auth_middleware(auth: AdminAuth) -> Middleware:
    """Authenticate every request but the open paths; log every change with its identity."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (request.method, request.path) in OPEN_ROUTES:
            return await handler(request)
        who = await auth.identify(request)
        if isinstance(who, web.Response) and request.path == "/" and request.method in (
                "GET", "HEAD"):
            return await handler(request)  # the status page answers with its login form
        if isinstance(who, str) and who in READ_IDENTITIES and not (
                request.method in ("GET", "HEAD") and request.path in READ_PATHS):
            who = _deny(403, "the read-only token may only read the status page, "
                        f"{', '.join(sorted(READ_PATHS - {'/'}))}")
        if isinstance(who, web.Response):
            log.info("admin request refused", extra=kv(
                method=request.method, path=request.path, status=who.status,
                remote=request.remote))
            return who
        request[IDENTITY] = who
        resp = await handler(request)
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            log.info("admin change", extra=kv(identity=who, method=request.method,
                                               path=request.path, status=resp.status))
        return resp

    return check


def identity(request: web.Request) -> str:
    """The authenticated caller of ``request`` (``-`` outside the middleware)."""
    return str(request.get(IDENTITY, "-"))
