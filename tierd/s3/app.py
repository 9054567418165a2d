"""The S3 gateway application: addressing, authentication, dispatch and error responses.

One catch-all route.  :func:`locate` finds the bucket and key (path-style, or virtual-host
style under the configured domains), :func:`tierd.s3.operations.lookup` finds the operation
from the method, the sub-resources in the query and the headers (every operation is one
record of :data:`tierd.s3.operations.OPERATIONS`: its handler, IAM action and name), and
:func:`make_s3_app`'s handler wraps every call: request id, authentication, authorization,
the ``<Error>`` document for :class:`S3Error` and :class:`~tierd.errors.FsError` (and for
any ``OSError`` saying the disk is full: 507 InsufficientStorage, logged in one line), and
``InternalError`` (logged with its traceback) for anything else.

``GET /healthz`` answers ``ok`` only when it is unsigned and has no query string; a signed
``GET /healthz`` is ListObjects on a bucket named ``healthz``.

``Expect: 100-continue`` is answered here, not by the framework: "100 Continue" goes out only
after the request is authenticated and authorized (and, for PUT and UploadPart, after the
checks that need no body), so a client that may not write is refused before it sends a byte
of the body and the connection is then closed; other ``Expect`` values are ignored (no bare
417).
"""

from __future__ import annotations

import logging
from urllib.parse import unquote

from aiohttp import web
from aiohttp.http import HttpVersion11

from tierd.acl.authorize import PolicyStore
from tierd.acl.keys import KeyStore
from tierd.errors import NO_SPACE, FsError
from tierd.logs import REQUEST_ID, new_request_id
from tierd.metrics import OPERATION, Metrics, request_middleware, s3_operation
from tierd.namespace.api import NamespaceAPI, split_key
from tierd.s3 import bucket_controls, cors, multipart, objects
from tierd.s3.access import authorize_request
from tierd.s3.auth import Authenticator
from tierd.s3.common import Ctx, S3State
from tierd.s3.errors import S3Error, from_fs_error
from tierd.s3.operations import Handler, lookup
from tierd.s3.xmlio import error_document

log = logging.getLogger("tierd.s3")

#: bytes a connection buffers before it stops reading the socket (aiohttp: 64 KiB).  Large
#: bodies arrive in 1 MiB pieces (tierd.s3.body): a smaller buffer pauses and resumes the
#: socket many times per piece, and each pause is an epoll change and a loop iteration.
READ_BUFSIZE = 1 << 20


def locate(request: web.Request, domains: tuple[str, ...]) -> tuple[str, str, bool]:
    """(bucket, key, virtual_host) of a request."""
    path = unquote(request.rel_url.raw_path or "/", errors="surrogateescape")
    host = request.headers.get("Host", "").lower()
    host = host[: host.find("]") + 1] if host.startswith("[") else host.rsplit(":", 1)[0]
    for d in domains:
        if host.endswith("." + d):
            return host[: -len(d) - 1], path[1:], True
    bucket, _, key = path[1:].partition("/")
    return bucket, key, False


#: request key: "100 Continue" was sent (the client is sending its body)
CONTINUED = "tierd.s3.continued"


def _expects_continue(request: web.Request) -> bool:
    return (request.version == HttpVersion11
            and request.headers.get("Expect", "").strip().lower() == "100-continue")


async def _no_expect_handler(request: web.Request) -> None:
    """aiohttp's default would send "100 Continue" before the handler runs (and answer a
    bare 417 to any other expectation): :func:`send_continue` does it after authorization."""


async def send_continue(ctx: Ctx, handler: Handler) -> None:
    """Tell a client waiting with ``Expect: 100-continue`` to send its body, once nothing
    that can be decided without it refuses the request.  PUT and UploadPart check here what
    they would otherwise find only after the body: write permission on the key (parents
    included), and the part number and the upload (its key, its owner)."""
    request = ctx.request
    if not _expects_continue(request) or request.get(CONTINUED):
        return
    try:
        if handler is objects.put_object:
            segments, marker = split_key(ctx.key)
            if not marker:
                ctx.ns.check_put_allowed(ctx.ident, ctx.bucket, segments)
        elif handler is multipart.upload_part:
            await multipart.part_target(ctx)
    except FsError as e:
        raise await objects.fs_error(ctx, e) from None
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request[CONTINUED] = True


def error_response(ctx: Ctx, e: S3Error) -> web.Response:
    headers = dict(ctx.response_headers)
    headers.update(e.headers)
    if ctx.request.method == "HEAD" or e.status == 304:
        return web.Response(status=e.status, headers=headers)
    fields = dict(e.fields)
    if e.code == "NoSuchKey" and "Key" not in fields and ctx.key:
        fields["Key"] = ctx.key
    if e.code == "NoSuchBucket" and "BucketName" not in fields and ctx.bucket:
        fields["BucketName"] = ctx.bucket
    body = error_document(e.code, e.message, ctx.request.rel_url.path, ctx.request_id, fields)
    resp = web.Response(status=e.status, body=body.encode(), headers=headers,
                        content_type="application/xml")
    if _expects_continue(ctx.request) and not ctx.request.get(CONTINUED):
        resp.force_close()  # the client holds a body back: nothing more can follow on this
    return resp


def make_s3_app(ns: NamespaceAPI, keys: KeyStore, *, region: str = "us-east-1",
                domains: tuple[str, ...] = (), max_skew: float = 900.0,
                policies: PolicyStore | None = None,
                metrics: Metrics | None = None,
                allow_sigv2: str = "presigned",
                complete_keepalive: float = 10.0) -> web.Application:
    """The S3 gateway over ``ns``, authenticating with the access keys in ``keys`` and
    authorizing with the bucket policies in ``policies`` (by default those of the key
    store's metadata); requests are counted and timed in ``metrics`` when given.
    ``allow_sigv2`` is the setting ``s3_allow_sigv2`` (:mod:`tierd.s3.sigv2`)."""
    state = S3State(ns=ns, keys=keys,
                    auth=Authenticator(keys, region, max_skew, sigv2=allow_sigv2),
                    policies=policies or PolicyStore(keys.meta),
                    region=region, domains=tuple(d.lower().strip(".") for d in domains),
                    complete_keepalive=complete_keepalive)

    async def handle(request: web.Request) -> web.StreamResponse:
        # the id the request middleware gave it (the logs carry the same one)
        request_id = request.get(REQUEST_ID) or new_request_id()
        if (request.method in ("GET", "HEAD") and request.rel_url.raw_path == "/healthz"
                and not request.rel_url.raw_query_string
                and not Authenticator.is_signed(request)):
            bucket, _, _ = locate(request, state.domains)
            if bucket == "healthz":
                request[OPERATION] = "Healthz"
                return web.Response(text="ok\n", headers={"x-amz-request-id": request_id})
        ctx = Ctx(request, state, request_id)
        ctx.response_headers.update({"x-amz-request-id": request_id,
                                     "x-amz-id-2": request_id, "Server": "tierd"})
        try:
            ctx.bucket, ctx.key, vhost = locate(request, state.domains)
            cors.add_headers(ctx)  # before anything can fail: errors carry them too
            if request.method == "OPTIONS":  # a browser's preflight: never signed
                request[OPERATION] = "PreflightRequest"
                return cors.preflight(ctx)
            ctx.auth = state.auth.authenticate(request, ctx.bucket if vhost else "")
            try:
                op = lookup(ctx)
            except S3Error:
                if ctx.anonymous:  # nothing a policy could grant: never more than 403
                    raise S3Error("AccessDenied", "anonymous requests get only what a bucket "
                                  "policy grants; sign the request") from None
                raise
            request[OPERATION] = op.name
            await authorize_request(ctx, op.action, op.on_object, op.copy)
            bucket_controls.prepare_acl(ctx, op.action, form=op.name == "PostObject")
            await send_continue(ctx, op.handler)
            return await op.handler(ctx)
        except S3Error as e:
            if e.status >= 500 and e.code != "NotImplemented":
                log.warning("%s %s: %s", request.method, request.rel_url.path, e)
            return _after_error(ctx, e)
        except FsError as e:
            err = from_fs_error(e, bucket=ctx.bucket, key=ctx.key)
            if err.status >= 500:  # 507 out of space, 503: one line, no traceback
                log.warning("%s %s: %s", request.method, request.rel_url.path, e)
            return _after_error(ctx, err)
        except (ConnectionError, OSError) as e:
            if isinstance(e, ConnectionError) and ctx.stream is not None:
                # the client went away mid-body: nothing to answer, nothing to log loudly
                log.debug("%s %s: client disconnected: %s", request.method,
                          request.rel_url.path, e)
                if request.transport is not None:
                    request.transport.close()
                return ctx.stream
            if isinstance(e, ConnectionError) or ctx.started:
                raise
            if e.errno in NO_SPACE:  # out of space is an answer (507), not a failure
                log.warning("%s %s: %s", request.method, request.rel_url.path, e)
                return _after_error(ctx, from_fs_error(e, bucket=ctx.bucket, key=ctx.key))
            log.exception("%s %s failed", request.method, request.rel_url.path)
            return _after_error(ctx, S3Error("InternalError", f"{type(e).__name__}: {e}"))
        except Exception as e:
            if ctx.started:
                raise
            log.exception("%s %s failed", request.method, request.rel_url.path)
            return _after_error(ctx, S3Error("InternalError", f"{type(e).__name__}: {e}"))

    def _after_error(ctx: Ctx, e: S3Error) -> web.StreamResponse:
        if ctx.started:
            raise ConnectionResetError(f"failed after the response started: {e}")
        return error_response(ctx, e)

    app = web.Application(client_max_size=1 << 20, handler_args={"read_bufsize": READ_BUFSIZE},
                          middlewares=[request_middleware(metrics, "s3", s3_operation)])
    app.router.add_route("*", "/{tail:.*}", handle, expect_handler=_no_expect_handler)
    return app
