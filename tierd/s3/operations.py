"""Every S3 operation the gateway serves, declared once: how a request is recognised, the
IAM action it is authorized as, the handler that serves it and the name it is counted under.

The router (:func:`lookup`) reads nothing but :data:`OPERATIONS`, so the operation list, the
bucket-policy action of each handler (:func:`tierd.s3.access.authorize_request`), the
``operation`` label of ``tierd_requests_total`` and the page ``docs/s3-compatibility.md``
(checked by ``tests/docs/test_s3_compatibility.py``) cannot drift apart.

A request is recognised in three steps, as S3 does:

1. its **level**: the service (no bucket), a bucket (no key) or an object;
2. a **sub-resource** in the query that names a configuration (``?tagging``, ``?acl``,
   ``?cors``...) claims the request: the first present, in :data:`OPERATIONS` order, among
   those with records at that level.  Its records are then chosen by method alone, and a
   method it has no record for is 405 MethodNotAllowed, never another operation;
3. otherwise the first record of that level and method whose query parameters and header
   conditions hold (so the more specific records come first: CopyObject before PutObject).

Sub-resources tierd does not implement (:data:`UNSUPPORTED`) are answered 501
NotImplemented before any of that, never with a wrong success.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container, Mapping
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

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
from tierd.s3.attributes import get_object_attributes
from tierd.s3.common import Ctx
from tierd.s3.errors import S3Error
from tierd.s3.lifecycle import delete_bucket_lifecycle, get_bucket_lifecycle, put_bucket_lifecycle
from tierd.s3.post_object import post_object

Handler = Callable[[Ctx], Awaitable[web.StreamResponse]]
Level = Literal["service", "bucket", "object"]

#: the header that makes a PUT a copy (CopyObject, UploadPartCopy)
COPY_SOURCE = "x-amz-copy-source"

#: sub-resources tierd does not implement: answered 501 NotImplemented, never a wrong success
UNSUPPORTED = frozenset({
    "accelerate", "analytics", "encryption",
    "intelligent-tiering", "inventory", "legal-hold", "logging", "metadataTable",
    "metrics", "notification", "object-lock",
    "renameObject", "replication", "requestPayment", "restore",
    "retention", "select", "session", "torrent", "website",
})
#: bucket sub-resources an object request naming them is refused for (501), not served as
#: a plain object request
BUCKET_ONLY = frozenset({"lifecycle"})


@dataclass(frozen=True)
class Operation:
    """One S3 API operation: how a request is recognised as it, and how it is served."""

    #: the S3 API name: the ``operation`` label of tierd_requests_total, and the row of
    #: docs/s3-compatibility.md
    name: str
    method: str
    level: Level
    handler: Handler
    #: the IAM action a bucket policy names it by; None: the handler judges for itself
    #: (per key, from its body, or an owner-only operation)
    action: str | None = None
    #: the query sub-resource that claims the request (step 2 of :func:`lookup`)
    sub: str | None = None
    #: query parameters of which one must be present (``name`` or ``name=value``)
    query: tuple[str, ...] = ()
    #: query parameters none of which may be present
    without: tuple[str, ...] = ()
    #: a header that must be present (:data:`COPY_SOURCE` for the copies)
    header: str | None = None

    @property
    def on_object(self) -> bool:
        """Whether it acts on the object ``ctx.key`` (the policy's resource is the key)."""
        return self.level == "object"

    @property
    def copy(self) -> bool:
        """Whether it reads a source object too (judged as s3:GetObject on the source)."""
        return self.header == COPY_SOURCE

    def matches(self, query: Mapping[str, str], headers: Container[str]) -> bool:
        """Whether the request's query and headers select this record (step 3)."""
        if self.query:
            for wanted in self.query:
                name, sep, value = wanted.partition("=")
                if (query.get(name) == value) if sep else name in query:
                    break
            else:
                return False
        for name in self.without:
            if name in query:
                return False
        return self.header is None or self.header in headers


_S: Level = "service"
_B: Level = "bucket"
_O: Level = "object"

#: every operation; order matters only where two records could match one request
OPERATIONS: tuple[Operation, ...] = (
    Operation("ListBuckets", "GET", _S, buckets.list_buckets, "s3:ListAllMyBuckets"),
    # sub-resources that claim a request, in the order they are looked for
    Operation("GetBucketTagging", "GET", _B, tagging.get_bucket_tagging,
              "s3:GetBucketTagging", sub="tagging"),
    Operation("PutBucketTagging", "PUT", _B, tagging.put_bucket_tagging,
              "s3:PutBucketTagging", sub="tagging"),
    Operation("DeleteBucketTagging", "DELETE", _B, tagging.delete_bucket_tagging,
              "s3:PutBucketTagging", sub="tagging"),  # AWS's name for it
    Operation("GetObjectTagging", "GET", _O, tagging.get_object_tagging,
              "s3:GetObjectTagging", sub="tagging"),
    # s3:PutObjectTagging is judged by its handler: its condition keys are in the body
    Operation("PutObjectTagging", "PUT", _O, tagging.put_object_tagging, sub="tagging"),
    Operation("DeleteObjectTagging", "DELETE", _O, tagging.delete_object_tagging,
              "s3:DeleteObjectTagging", sub="tagging"),
    Operation("GetBucketLifecycleConfiguration", "GET", _B, get_bucket_lifecycle,
              "s3:GetLifecycleConfiguration", sub="lifecycle"),
    Operation("PutBucketLifecycleConfiguration", "PUT", _B, put_bucket_lifecycle,
              "s3:PutLifecycleConfiguration", sub="lifecycle"),
    Operation("DeleteBucketLifecycle", "DELETE", _B, delete_bucket_lifecycle,
              "s3:PutLifecycleConfiguration", sub="lifecycle"),  # AWS's name
    Operation("GetBucketCors", "GET", _B, cors.get_bucket_cors, "s3:GetBucketCORS", sub="cors"),
    Operation("PutBucketCors", "PUT", _B, cors.put_bucket_cors, "s3:PutBucketCORS", sub="cors"),
    Operation("DeleteBucketCors", "DELETE", _B, cors.delete_bucket_cors,
              "s3:PutBucketCORS", sub="cors"),  # AWS's name for it
    # the bucket owner's operations: their handlers judge
    Operation("GetBucketPolicy", "GET", _B, bucket_policy.get_policy, sub="policy"),
    Operation("PutBucketPolicy", "PUT", _B, bucket_policy.put_policy, sub="policy"),
    Operation("DeleteBucketPolicy", "DELETE", _B, bucket_policy.delete_policy, sub="policy"),
    Operation("GetPublicAccessBlock", "GET", _B, bucket_controls.get_public_access_block,
              sub="publicAccessBlock"),
    Operation("PutPublicAccessBlock", "PUT", _B, bucket_controls.put_public_access_block,
              sub="publicAccessBlock"),
    Operation("DeletePublicAccessBlock", "DELETE", _B,
              bucket_controls.delete_public_access_block, sub="publicAccessBlock"),
    Operation("GetBucketOwnershipControls", "GET", _B, bucket_controls.get_ownership_controls,
              sub="ownershipControls"),
    Operation("PutBucketOwnershipControls", "PUT", _B, bucket_controls.put_ownership_controls,
              sub="ownershipControls"),
    Operation("DeleteBucketOwnershipControls", "DELETE", _B,
              bucket_controls.delete_ownership_controls, sub="ownershipControls"),
    Operation("GetBucketAcl", "GET", _B, acl.get_bucket_acl, "s3:GetBucketAcl", sub="acl"),
    Operation("PutBucketAcl", "PUT", _B, acl.put_bucket_acl, "s3:PutBucketAcl", sub="acl"),
    Operation("GetObjectAcl", "GET", _O, acl.get_object_acl, "s3:GetObjectAcl", sub="acl"),
    Operation("PutObjectAcl", "PUT", _O, acl.put_object_acl, "s3:PutObjectAcl", sub="acl"),
    Operation("GetBucketPolicyStatus", "GET", _B, bucket_policy.get_policy_status,
              sub="policyStatus"),
    # a bucket
    Operation("GetBucketLocation", "GET", _B, buckets.get_location, "s3:GetBucketLocation",
              query=("location",)),
    Operation("GetBucketVersioning", "GET", _B, versioning.get_versioning,
              "s3:GetBucketVersioning", query=("versioning",)),
    Operation("ListObjectVersions", "GET", _B, versioning.list_object_versions,
              "s3:ListBucketVersions", query=("versions",)),
    Operation("ListMultipartUploads", "GET", _B, multipart.list_uploads,
              "s3:ListBucketMultipartUploads", query=("uploads",)),
    Operation("ListObjectsV2", "GET", _B, listing.list_objects_v2, "s3:ListBucket",
              query=("list-type=2",)),
    Operation("ListObjects", "GET", _B, listing.list_objects_v1, "s3:ListBucket",
              without=("list-type",)),  # another list-type is InvalidArgument (_unmatched)
    Operation("HeadBucket", "HEAD", _B, buckets.head_bucket, "s3:ListBucket"),
    Operation("PutBucketVersioning", "PUT", _B, versioning.put_versioning,
              "s3:PutBucketVersioning", query=("versioning",)),
    Operation("CreateBucket", "PUT", _B, buckets.create_bucket, "s3:CreateBucket"),
    Operation("DeleteBucket", "DELETE", _B, buckets.delete_bucket, "s3:DeleteBucket"),
    # judges each key itself
    Operation("DeleteObjects", "POST", _B, objects.delete_objects, query=("delete",)),
    # a browser form upload: judges the form's signer itself, as PutObject on its key
    Operation("PostObject", "POST", _B, post_object),
    # an object
    Operation("ListParts", "GET", _O, multipart.list_parts, "s3:ListMultipartUploadParts",
              query=("uploadId",)),
    Operation("GetObjectAttributes", "GET", _O, get_object_attributes,
              "s3:GetObjectAttributes", query=("attributes",)),
    Operation("GetObject", "GET", _O, objects.get_object, "s3:GetObject"),
    Operation("HeadObject", "HEAD", _O, objects.head_object, "s3:GetObject"),
    Operation("UploadPartCopy", "PUT", _O, multipart.upload_part_copy, "s3:PutObject",
              query=("uploadId", "partNumber"), header=COPY_SOURCE),
    Operation("UploadPart", "PUT", _O, multipart.upload_part, "s3:PutObject",
              query=("uploadId", "partNumber")),
    Operation("CopyObject", "PUT", _O, objects.copy_object, "s3:PutObject", header=COPY_SOURCE),
    Operation("PutObject", "PUT", _O, objects.put_object, "s3:PutObject"),
    Operation("CreateMultipartUpload", "POST", _O, multipart.create, "s3:PutObject",
              query=("uploads",)),
    Operation("CompleteMultipartUpload", "POST", _O, multipart.complete, "s3:PutObject",
              query=("uploadId",)),
    Operation("AbortMultipartUpload", "DELETE", _O, multipart.abort, "s3:AbortMultipartUpload",
              query=("uploadId",)),
    Operation("DeleteObject", "DELETE", _O, objects.delete_object, "s3:DeleteObject"),
)

#: the sub-resources that claim a request, in the order they are looked for
_CLAIMS: tuple[str, ...] = tuple(dict.fromkeys(op.sub for op in OPERATIONS if op.sub))


def _index(key: Callable[[Operation], tuple[str | None, str] | None]
           ) -> dict[tuple[str | None, str], tuple[Operation, ...]]:
    """The records grouped by ``key`` (None: left out), each group in declaration order."""
    groups: dict[tuple[str | None, str], list[Operation]] = {}
    for op in OPERATIONS:
        k = key(op)
        if k is not None:
            groups.setdefault(k, []).append(op)
    return {k: tuple(ops) for k, ops in groups.items()}


#: (sub-resource, level) -> the records it claims; (level, method) -> the records step 3
#: tries: made once, so finding an operation on every request is a few dict lookups, not
#: a walk over every record
_CLAIMED = _index(lambda op: (op.sub, op.level) if op.sub else None)
_BY_METHOD = _index(lambda op: None if op.sub else (op.level, op.method))


def _not_implemented(what: str) -> S3Error:
    return S3Error("NotImplemented", f"{what} is not implemented by tierd")


def _method_not_allowed(method: str, level: Level) -> S3Error:
    where = {"service": "the service", "bucket": "a bucket", "object": "an object"}[level]
    return S3Error("MethodNotAllowed", f"{method} is not allowed on {where}",
                   Method=method, ResourceType=level.upper())


def lookup(ctx: Ctx) -> Operation:
    """The operation this request is (S3Error when there is none: 501 for what tierd does
    not implement, 405 for a method the resource does not have)."""
    level: Level = "service" if not ctx.bucket else "bucket" if not ctx.key else "object"
    return find(ctx.request.method, level, ctx.query, ctx.headers)


def find(method: str, level: Level, query: Mapping[str, str],
         headers: Container[str]) -> Operation:
    """The operation of a ``method`` request at ``level`` with this query and these headers
    (header names as ``headers`` compares them: the request's are case-insensitive)."""
    if query and level != "service" and not UNSUPPORTED.isdisjoint(query):
        unsupported = sorted(UNSUPPORTED & query.keys())
        raise _not_implemented(f"the ?{unsupported[0]} sub-resource")
    for sub in _CLAIMS if query else ():
        if sub not in query:
            continue
        claimed = _CLAIMED.get((sub, level))
        if not claimed:
            if level == "object" and sub in BUCKET_ONLY:
                raise _not_implemented(f"?{sub} on an object (it is a bucket sub-resource)")
            continue  # not a sub-resource at this level: an ordinary query parameter
        for op in claimed:
            if op.method == method:
                return op
        raise _method_not_allowed(method, level)
    for op in _BY_METHOD.get((level, method), ()):
        if op.matches(query, headers):
            return op
    raise _unmatched(method, level, query)


def _unmatched(method: str, level: Level, query: Mapping[str, str]) -> S3Error:
    """The error for a request no record matched."""
    if level == "object" and method == "POST":
        return _not_implemented(f"POST on an object with ?{'&'.join(query.keys()) or ''}")
    if level == "bucket" and method == "GET" and "list-type" in query:
        return S3Error("InvalidArgument", "list-type must be 2",
                       ArgumentName="list-type", ArgumentValue=query["list-type"])
    return _method_not_allowed(method, level)
