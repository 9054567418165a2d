"""Bucket policies at the S3 door: which action a request is, what its condition keys are,
and the identity each handler hands to the namespace.

The decision itself is :func:`tierd.acl.authorize.authorize`'s; this module only translates
the HTTP request into its inputs (the IAM action name, the bucket and key, the requester,
``aws:SourceIp`` and the other condition keys) and runs it once per request, before the
handler touches the namespace.  CopyObject and UploadPartCopy are judged twice (GetObject on
the source, PutObject on the target) and DeleteObjects once per key, as S3 does.
"""

from __future__ import annotations

import contextlib
import errno
import time
from urllib.parse import unquote

from tierd.acl import AccessDenied, Identity
from tierd.acl.authorize import authorize
from tierd.acl.keys import canonical_user_id
from tierd.acl.policy import ANONYMOUS, EXISTING_OBJECT_TAG, REQUEST_OBJECT_TAG, Policy, Requester
from tierd.namespace.api import Tags
from tierd.s3 import tagset
from tierd.s3.common import Ctx, parse_copy_source
from tierd.s3.errors import S3Error

#: list actions: their query parameters are the s3:prefix/delimiter/max-keys keys
_LISTINGS = frozenset({"s3:ListBucket", "s3:ListBucketVersions",
                       "s3:ListBucketMultipartUploads"})
#: headers that are condition keys of the same name (``s3:<header>``)
_HEADER_KEYS = ("x-amz-acl", "x-amz-content-sha256", "x-amz-copy-source",
                "x-amz-metadata-directive", "x-amz-storage-class")
#: actions on an existing object whose ``s3:ExistingObjectTag/<key>`` keys are its stored
#: tags (AWS's list; HeadObject is s3:GetObject, and the source of a copy is judged as one)
_EXISTING_TAG_ACTIONS = frozenset({
    "s3:GetObject", "s3:GetObjectAcl", "s3:PutObjectAcl", "s3:GetObjectTagging",
    "s3:PutObjectTagging", "s3:DeleteObjectTagging", "s3:GetObjectVersion",
    "s3:GetObjectVersionAcl", "s3:PutObjectVersionAcl", "s3:GetObjectVersionTagging",
    "s3:PutObjectVersionTagging", "s3:DeleteObjectVersionTagging"})


def requester(ctx: Ctx) -> Requester:
    auth = ctx.auth
    if auth is None:
        return ANONYMOUS
    return Requester(auth.key.access_key, auth.key.user, canonical_user_id(auth.key.uid))


def context(ctx: Ctx, action: str) -> dict[str, str]:
    """The condition keys of this request (lower-case names, as the policy module wants)."""
    req = ctx.request
    auth = ctx.auth
    c = {
        "aws:sourceip": req.remote or "",
        "aws:securetransport": "true" if req.secure else "false",
        "aws:epochtime": str(int(time.time())),
        "aws:principaltype": "Anonymous" if auth is None else "User",
    }
    for name, key in (("User-Agent", "aws:useragent"), ("Referer", "aws:referer")):
        if name in req.headers:
            c[key] = req.headers[name]
    if auth is not None:
        if auth.key.user:
            c["aws:username"] = auth.key.user
        c["aws:userid"] = str(auth.key.uid)
        c["s3:authtype"] = "REST-QUERY-STRING" if auth.presigned else "REST-HEADER"
        c["s3:signatureversion"] = auth.version
    for name in _HEADER_KEYS:
        if name in req.headers:
            c["s3:" + name] = req.headers[name]
    if action == "s3:PutObject" and tagset.HEADER in req.headers:
        # PutObject, CopyObject, CreateMultipartUpload; a malformed header is the handler's
        # InvalidArgument (tierd.s3.common.objmeta_from_headers), with no tag keys here
        with contextlib.suppress(S3Error):
            tags = tagset.parse_header(req.headers[tagset.HEADER])
            c.update(tag_keys(REQUEST_OBJECT_TAG, tags))
    if action in _LISTINGS:
        q = ctx.query
        c["s3:prefix"] = q.get("prefix", "")
        for name in ("delimiter", "max-keys"):
            if name in q:
                c["s3:" + name] = q[name]
    return c


def tag_keys(prefix: str, tags: Tags) -> dict[str, str]:
    """Condition keys ``prefix + tag key`` (lower case, as every condition key name) of
    ``tags``; of two keys differing only in case, the first one's value."""
    out: dict[str, str] = {}
    for key, value in tags:
        out.setdefault(prefix + key.lower(), value)
    return out


def _judge(ctx: Ctx, policy: Policy | None, action: str, bucket: str,
           key: str | None, extra: dict[str, str] | None = None,
           vid: str | None = None) -> Identity:
    """The identity for one action on one resource of a bucket whose policy (None without
    one) was already read (AccessDenied when refused).  ``extra``: condition keys only the
    handler knows (the tags of a PutObjectTagging body); ``vid``: the version of ``key``
    the request names (its tags are the ``s3:ExistingObjectTag`` keys)."""
    if policy is None and not ctx.anonymous:
        return ctx.caller  # the common case: POSIX decides, nothing to evaluate
    cond = context(ctx, action)
    if (policy is not None and key and action in _EXISTING_TAG_ACTIONS
            and policy.tests(EXISTING_OBJECT_TAG)):
        stored = ctx.ns.peek_object_tags(bucket, key, vid)
        cond.update(tag_keys(EXISTING_OBJECT_TAG, stored or []))
    cond.update(extra or {})
    return authorize(policy, ctx.caller, requester(ctx), action, bucket, key, cond)


#: the action a request naming a version (``versionId``) is, as AWS judges it
VERSION_ACTIONS = {"s3:GetObject": "s3:GetObjectVersion",
                   "s3:DeleteObject": "s3:DeleteObjectVersion"}


def version_action(action: str, vid: str | None) -> str:
    """``action`` on one version of an object (``vid`` given) is its ``*Version`` action."""
    return VERSION_ACTIONS.get(action, action) if vid is not None else action


def _source_version(value: str) -> str | None:
    """The ``versionId`` of an ``x-amz-copy-source`` (None without one; its validity is the
    handler's to judge)."""
    name, _, vid = value.strip().partition("?")[2].partition("=")
    return unquote(vid) if name == "versionId" else None


def judge_object(ctx: Ctx, action: str, extra: dict[str, str]) -> None:
    """Set ``ctx.identity`` for ``action`` on ``ctx.key`` with the condition keys ``extra``,
    for a handler that judges itself once it has read its body (AccessDenied when
    refused)."""
    policy = ctx.state.policies.get(ctx.bucket)
    ctx.identity = _judge(ctx, policy, action, ctx.bucket, ctx.key, extra,
                          ctx.query.get("versionId"))


async def authorize_request(ctx: Ctx, action: str | None, on_object: bool,
                            copy: bool = False) -> None:
    """Set ``ctx.identity`` (and ``ctx.src_identity`` for a ``copy``) for a request that is
    IAM ``action`` on the object ``ctx.key`` (``on_object``) or on its bucket, or raise
    AccessDenied before anything else happens.  ``action`` None: the handler judges for
    itself (per key, from its body, or the bucket owner's operations); only an anonymous
    request's bucket is checked here.  The actions are declared in
    :data:`tierd.s3.operations.OPERATIONS`."""
    # one read: whether the bucket exists, and its policy (and its record, for later)
    exists, policy = True, None
    if ctx.bucket and (ctx.anonymous or action is not None):
        ctx.bucket_record = await ctx.state.policies.aread(ctx.bucket)
        ctx.bucket_read = True
        exists, policy = ctx.state.policies.decide(ctx.bucket, ctx.bucket_record)
    if ctx.anonymous and not ctx.bucket:
        raise AccessDenied(errno.EACCES, "anonymous requests cannot list buckets; sign the "
                           "request (ListBuckets)")
    if ctx.anonymous and not exists and action != "s3:CreateBucket":
        # S3 tells anyone that a bucket does not exist; what is in one, POSIX (the
        # anonymous grants on the way) and the policy decide
        raise S3Error("NoSuchBucket", BucketName=ctx.bucket)
    if action is None:
        return
    if not ctx.bucket:  # ListBuckets (an anonymous one was refused above)
        return
    vid = ctx.query.get("versionId") if on_object else None
    ctx.identity = _judge(ctx, policy, version_action(action, vid), ctx.bucket,
                          ctx.key if on_object else None, vid=vid)
    if copy and "x-amz-copy-source" in ctx.headers:
        src_bucket, src_key = parse_copy_source(ctx.headers["x-amz-copy-source"])
        src_policy = (policy if src_bucket == ctx.bucket
                      else ctx.state.policies.get(src_bucket) if src_bucket else None)
        src_vid = _source_version(ctx.headers["x-amz-copy-source"])
        ctx.src_identity = _judge(ctx, src_policy, version_action("s3:GetObject", src_vid),
                                  src_bucket, src_key, vid=src_vid)


def judge_keys(ctx: Ctx, action: str, keys: list[str]
               ) -> tuple[dict[str, AccessDenied], list[tuple[Identity, list[str]]]]:
    """Per-key decisions of a multi-key request (DeleteObjects): the refused keys with their
    error, and the others grouped by the identity they run as (order kept in a group)."""
    refused: dict[str, AccessDenied] = {}
    groups: dict[bool, tuple[Identity, list[str]]] = {}
    policy = ctx.state.policies.get(ctx.bucket) if ctx.bucket else None
    if policy is None and not ctx.anonymous:  # POSIX decides every key
        return refused, [(ctx.caller, list(keys))] if keys else []
    # read once for up to 1000 keys: the policy, the requester, the condition keys
    who, cond = requester(ctx), context(ctx, action)
    for key in keys:
        try:
            ident = authorize(policy, ctx.caller, who, action, ctx.bucket, key, cond)
        except AccessDenied as e:
            refused[key] = e
            continue
        granted = ident.grant is not None
        if granted not in groups:
            groups[granted] = (ident, [])
        groups[granted][1].append(key)
    return refused, list(groups.values())
