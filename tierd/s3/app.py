"""The S3 gateway application: addressing, authentication, dispatch and error responses.

One catch-all route.  :func:`locate` finds the bucket and key (path-style, or virtual-host
style under the configured domains), :func:`route` picks the handler from the method and
the sub-resources in the query, and :func:`make_s3_app`'s handler wraps every call: request
id, authentication, the ``<Error>`` document for :class:`S3Error` and
:class:`~tierd.errors.FsError` (and for any ``OSError`` saying the disk is full: 507
InsufficientStorage, logged in one line), and ``InternalError`` (logged with its
traceback) for anything else.

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
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from aiohttp import web
from aiohttp.http import HttpVersion11

from tierd.acl.authorize import PolicyStore
from tierd.acl.keys import KeyStore
from tierd.errors import NO_SPACE, FsError
from tierd.logs import REQUEST_ID, new_request_id
from tierd.metrics import OPERATION, Metrics, request_middleware, s3_operation
from tierd.namespace import Namespace
from tierd.namespace.names import split_key
from tierd.s3 import (
    acl,
    bucket_controls,
    bucket_policy,
    buckets,
    cors,
    listing,
    multipart,
    objects,
    tagging,
    versioning,
)
from tierd.s3.access import Actions, authorize_request
from tierd.s3.attributes import get_object_attributes
from tierd.s3.auth import Authenticator
from tierd.s3.common import Ctx, S3State
from tierd.s3.errors import S3Error, from_fs_error
from tierd.s3.lifecycle import delete_bucket_lifecycle, get_bucket_lifecycle, put_bucket_lifecycle
from tierd.s3.post_object import post_object
from tierd.s3.xmlio import error_document

log = logging.getLogger("tierd.s3")

Handler = Callable[[Ctx], Awaitable[web.StreamResponse]]

#: bytes a connection buffers before it stops reading the socket (aiohttp: 64 KiB).  Large
#: bodies arrive in 1 MiB pieces (tierd.s3.body): a smaller buffer pauses and resumes the
#: socket many times per piece, and each pause is an epoll change and a loop iteration.
READ_BUFSIZE = 1 << 20

#: sub-resources tierd does not implement: answered 501 NotImplemented, never a wrong success
UNSUPPORTED = frozenset({
    "accelerate", "analytics", "encryption",
    "intelligent-tiering", "inventory", "legal-hold", "logging", "metadataTable",
    "metrics", "notification", "object-lock",
    "renameObject", "replication", "requestPayment", "restore",
    "retention", "select", "session", "torrent", "website",
})


def _not_implemented(what: str) -> S3Error:
    return S3Error("NotImplemented", f"{what} is not implemented by tierd")


def _method_not_allowed(ctx: Ctx) -> S3Error:
    where = "the service" if not ctx.bucket else "a bucket" if not ctx.key else "an object"
    return S3Error("MethodNotAllowed", f"{ctx.request.method} is not allowed on {where}",
                   Method=ctx.request.method,
                   ResourceType="SERVICE" if not ctx.bucket else
                   "BUCKET" if not ctx.key else "OBJECT")


def route(ctx: Ctx) -> Handler:
    """The handler for this request (S3Error when there is none)."""
    method = ctx.request.method
    q = ctx.query
    unsupported = sorted(UNSUPPORTED & q.keys())
    if unsupported and ctx.bucket:
        raise _not_implemented(f"the ?{unsupported[0]} sub-resource")
    if not ctx.bucket:
        if method == "GET":
            return buckets.list_buckets
        raise _method_not_allowed(ctx)
    if "tagging" in q:
        return _tagging_route(ctx)
    if "lifecycle" in q:
        return _lifecycle_route(ctx)
    if not ctx.key:
        if "cors" in q:
            return _cors_route(ctx)
        if "policy" in q:
            return _policy_route(ctx)
        if "publicAccessBlock" in q or "ownershipControls" in q:
            return _controls_route(ctx)
        if "acl" in q:
            if method in ("GET", "PUT"):
                return acl.get_bucket_acl if method == "GET" else acl.put_bucket_acl
            raise _method_not_allowed(ctx)
        if "policyStatus" in q:
            if method == "GET":
                return bucket_policy.get_policy_status
            raise _method_not_allowed(ctx)
        if method == "GET":
            if "location" in q:
                return buckets.get_location
            if "versioning" in q:
                return versioning.get_versioning
            if "versions" in q:
                return versioning.list_object_versions
            if "uploads" in q:
                return multipart.list_uploads
            lt = q.get("list-type")
            if lt == "2":
                return listing.list_objects_v2
            if lt is not None:
                raise S3Error("InvalidArgument", "list-type must be 2",
                              ArgumentName="list-type", ArgumentValue=lt)
            return listing.list_objects_v1
        if method == "HEAD":
            return buckets.head_bucket
        if method == "PUT":
            if "versioning" in q:
                return versioning.put_versioning
            return buckets.create_bucket
        if method == "DELETE":
            return buckets.delete_bucket
        if method == "POST":
            if "delete" in q:
                return objects.delete_objects
            return post_object  # a browser form upload
        raise _method_not_allowed(ctx)
    if "acl" in q:
        if method in ("GET", "PUT"):
            return acl.get_object_acl if method == "GET" else acl.put_object_acl
        raise _method_not_allowed(ctx)
    if method == "GET":
        if "uploadId" in q:
            return multipart.list_parts
        if "attributes" in q:
            return get_object_attributes
        return objects.get_object
    if method == "HEAD":
        return objects.head_object
    if method == "PUT":
        if "uploadId" in q or "partNumber" in q:
            if "x-amz-copy-source" in ctx.headers:
                return multipart.upload_part_copy
            return multipart.upload_part
        if "x-amz-copy-source" in ctx.headers:
            return objects.copy_object
        return objects.put_object
    if method == "POST":
        if "uploads" in q:
            return multipart.create
        if "uploadId" in q:
            return multipart.complete
        raise _not_implemented(f"POST on an object with ?{'&'.join(q.keys()) or ''}")
    if method == "DELETE":
        if "uploadId" in q:
            return multipart.abort
        return objects.delete_object
    raise _method_not_allowed(ctx)


_CONTROLS: dict[tuple[str, str], Handler] = {
    ("publicAccessBlock", "GET"): bucket_controls.get_public_access_block,
    ("publicAccessBlock", "PUT"): bucket_controls.put_public_access_block,
    ("publicAccessBlock", "DELETE"): bucket_controls.delete_public_access_block,
    ("ownershipControls", "GET"): bucket_controls.get_ownership_controls,
    ("ownershipControls", "PUT"): bucket_controls.put_ownership_controls,
    ("ownershipControls", "DELETE"): bucket_controls.delete_ownership_controls,
}


def _controls_route(ctx: Ctx) -> Handler:
    which = "publicAccessBlock" if "publicAccessBlock" in ctx.query else "ownershipControls"
    handler = _CONTROLS.get((which, ctx.request.method))
    if handler is None:
        raise _method_not_allowed(ctx)
    return handler


_LIFECYCLE: dict[str, Handler] = {"GET": get_bucket_lifecycle, "PUT": put_bucket_lifecycle,
                                  "DELETE": delete_bucket_lifecycle}


def _lifecycle_route(ctx: Ctx) -> Handler:
    if ctx.key:
        raise _not_implemented("?lifecycle on an object (it is a bucket sub-resource)")
    handler = _LIFECYCLE.get(ctx.request.method)
    if handler is None:
        raise _method_not_allowed(ctx)
    return handler


def _policy_route(ctx: Ctx) -> Handler:
    method = ctx.request.method
    if method == "GET":
        return bucket_policy.get_policy
    if method == "PUT":
        return bucket_policy.put_policy
    if method == "DELETE":
        return bucket_policy.delete_policy
    raise _method_not_allowed(ctx)


_CORS: dict[str, Handler] = {"GET": cors.get_bucket_cors, "PUT": cors.put_bucket_cors,
                             "DELETE": cors.delete_bucket_cors}


def _cors_route(ctx: Ctx) -> Handler:
    handler = _CORS.get(ctx.request.method)
    if handler is None:
        raise _method_not_allowed(ctx)
    return handler


_TAGGING: dict[tuple[bool, str], Handler] = {
    (False, "GET"): tagging.get_bucket_tagging,
    (False, "PUT"): tagging.put_bucket_tagging,
    (False, "DELETE"): tagging.delete_bucket_tagging,
    (True, "GET"): tagging.get_object_tagging,
    (True, "PUT"): tagging.put_object_tagging,
    (True, "DELETE"): tagging.delete_object_tagging,
}


def _tagging_route(ctx: Ctx) -> Handler:
    handler = _TAGGING.get((bool(ctx.key), ctx.request.method))
    if handler is None:
        raise _method_not_allowed(ctx)
    return handler


def _actions() -> Actions:
    """Every handler's IAM action (tierd.s3.access): the name a bucket policy uses."""
    a = Actions()
    a.add(buckets.list_buckets, "s3:ListAllMyBuckets", False)
    a.add(buckets.create_bucket, "s3:CreateBucket", False)
    a.add(buckets.delete_bucket, "s3:DeleteBucket", False)
    a.add(buckets.head_bucket, "s3:ListBucket", False)
    a.add(buckets.get_location, "s3:GetBucketLocation", False)
    a.add(versioning.get_versioning, "s3:GetBucketVersioning", False)
    a.add(versioning.put_versioning, "s3:PutBucketVersioning", False)
    a.add(listing.list_objects_v1, "s3:ListBucket", False)
    a.add(listing.list_objects_v2, "s3:ListBucket", False)
    a.add(versioning.list_object_versions, "s3:ListBucketVersions", False)
    a.add(multipart.list_uploads, "s3:ListBucketMultipartUploads", False)
    a.add(objects.get_object, "s3:GetObject", True)
    a.add(objects.head_object, "s3:GetObject", True)
    a.add(objects.put_object, "s3:PutObject", True)
    a.add(objects.copy_object, "s3:PutObject", True, copy=True)
    a.add(objects.delete_object, "s3:DeleteObject", True)
    a.add(multipart.create, "s3:PutObject", True)
    a.add(multipart.upload_part, "s3:PutObject", True)
    a.add(multipart.upload_part_copy, "s3:PutObject", True, copy=True)
    a.add(multipart.complete, "s3:PutObject", True)
    a.add(multipart.abort, "s3:AbortMultipartUpload", True)
    a.add(multipart.list_parts, "s3:ListMultipartUploadParts", True)
    a.add(acl.get_bucket_acl, "s3:GetBucketAcl", False)
    a.add(acl.put_bucket_acl, "s3:PutBucketAcl", False)
    a.add(acl.get_object_acl, "s3:GetObjectAcl", True)
    a.add(acl.put_object_acl, "s3:PutObjectAcl", True)
    a.add(cors.get_bucket_cors, "s3:GetBucketCORS", False)
    a.add(cors.put_bucket_cors, "s3:PutBucketCORS", False)
    a.add(cors.delete_bucket_cors, "s3:PutBucketCORS", False)  # AWS's name for it
    a.add(get_object_attributes, "s3:GetObjectAttributes", True)
    a.add(get_bucket_lifecycle, "s3:GetLifecycleConfiguration", False)
    a.add(put_bucket_lifecycle, "s3:PutLifecycleConfiguration", False)
    a.add(delete_bucket_lifecycle, "s3:PutLifecycleConfiguration", False)  # AWS's name
    a.add(tagging.get_object_tagging, "s3:GetObjectTagging", True)
    a.add(tagging.delete_object_tagging, "s3:DeleteObjectTagging", True)
    a.add(tagging.get_bucket_tagging, "s3:GetBucketTagging", False)
    a.add(tagging.put_bucket_tagging, "s3:PutBucketTagging", False)
    a.add(tagging.delete_bucket_tagging, "s3:PutBucketTagging", False)  # AWS's name for it
    # s3:PutObjectTagging is judged by its handler: its condition keys are in the body
    a.own.add(tagging.put_object_tagging)
    a.own.add(post_object)  # judges the form's signer itself, as PutObject on its key
    # these judge for themselves: per key, or the bucket owner's operations
    a.own.update({objects.delete_objects, bucket_policy.get_policy, bucket_policy.put_policy,
                  bucket_policy.delete_policy, bucket_policy.get_policy_status,
                  *_CONTROLS.values()})
    return a


ACTIONS = _actions()

#: every handler's S3 API operation name: the ``operation`` label of tierd_requests_total
OPERATIONS: dict[Handler, str] = {
    buckets.list_buckets: "ListBuckets",
    buckets.create_bucket: "CreateBucket",
    buckets.delete_bucket: "DeleteBucket",
    buckets.head_bucket: "HeadBucket",
    buckets.get_location: "GetBucketLocation",
    versioning.get_versioning: "GetBucketVersioning",
    versioning.put_versioning: "PutBucketVersioning",
    listing.list_objects_v1: "ListObjects",
    listing.list_objects_v2: "ListObjectsV2",
    versioning.list_object_versions: "ListObjectVersions",
    multipart.list_uploads: "ListMultipartUploads",
    objects.get_object: "GetObject",
    objects.head_object: "HeadObject",
    objects.put_object: "PutObject",
    objects.copy_object: "CopyObject",
    objects.delete_object: "DeleteObject",
    objects.delete_objects: "DeleteObjects",
    post_object: "PostObject",
    multipart.create: "CreateMultipartUpload",
    multipart.upload_part: "UploadPart",
    multipart.upload_part_copy: "UploadPartCopy",
    multipart.complete: "CompleteMultipartUpload",
    multipart.abort: "AbortMultipartUpload",
    multipart.list_parts: "ListParts",
    acl.get_bucket_acl: "GetBucketAcl",
    acl.put_bucket_acl: "PutBucketAcl",
    acl.get_object_acl: "GetObjectAcl",
    acl.put_object_acl: "PutObjectAcl",
    cors.get_bucket_cors: "GetBucketCors",
    cors.put_bucket_cors: "PutBucketCors",
    cors.delete_bucket_cors: "DeleteBucketCors",
    get_object_attributes: "GetObjectAttributes",
    get_bucket_lifecycle: "GetBucketLifecycleConfiguration",
    put_bucket_lifecycle: "PutBucketLifecycleConfiguration",
    delete_bucket_lifecycle: "DeleteBucketLifecycle",
    bucket_policy.get_policy: "GetBucketPolicy",
    bucket_policy.put_policy: "PutBucketPolicy",
    bucket_policy.delete_policy: "DeleteBucketPolicy",
    bucket_policy.get_policy_status: "GetBucketPolicyStatus",
    bucket_controls.get_public_access_block: "GetPublicAccessBlock",
    bucket_controls.put_public_access_block: "PutPublicAccessBlock",
    bucket_controls.delete_public_access_block: "DeletePublicAccessBlock",
    bucket_controls.get_ownership_controls: "GetBucketOwnershipControls",
    bucket_controls.put_ownership_controls: "PutBucketOwnershipControls",
    bucket_controls.delete_ownership_controls: "DeleteBucketOwnershipControls",
    tagging.get_object_tagging: "GetObjectTagging",
    tagging.put_object_tagging: "PutObjectTagging",
    tagging.delete_object_tagging: "DeleteObjectTagging",
    tagging.get_bucket_tagging: "GetBucketTagging",
    tagging.put_bucket_tagging: "PutBucketTagging",
    tagging.delete_bucket_tagging: "DeleteBucketTagging",
}


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


def make_s3_app(ns: Namespace, keys: KeyStore, *, region: str = "us-east-1",
                domains: tuple[str, ...] = (), max_skew: float = 900.0,
                policies: PolicyStore | None = None,
                metrics: Metrics | None = None,
                allow_sigv2: str = "presigned") -> web.Application:
    """The S3 gateway over ``ns``, authenticating with the access keys in ``keys`` and
    authorizing with the bucket policies in ``policies`` (by default those of the key
    store's metadata); requests are counted and timed in ``metrics`` when given.
    ``allow_sigv2`` is the setting ``s3_allow_sigv2`` (:mod:`tierd.s3.sigv2`)."""
    state = S3State(ns=ns, keys=keys,
                    auth=Authenticator(keys, region, max_skew, sigv2=allow_sigv2),
                    policies=policies or PolicyStore(keys.meta),
                    region=region, domains=tuple(d.lower().strip(".") for d in domains))

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
                handler = route(ctx)
            except S3Error:
                if ctx.anonymous:  # nothing a policy could grant: never more than 403
                    raise S3Error("AccessDenied", "anonymous requests get only what a bucket "
                                  "policy grants; sign the request") from None
                raise
            request[OPERATION] = OPERATIONS.get(handler, handler.__name__)
            authorize_request(ctx, handler, ACTIONS)
            bucket_controls.prepare_acl(ctx, ACTIONS.table.get(handler, (None, False))[0],
                                        form=handler is post_object)
            await send_continue(ctx, handler)
            return await handler(ctx)
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
