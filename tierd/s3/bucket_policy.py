"""GetBucketPolicy, PutBucketPolicy, DeleteBucketPolicy and GetBucketPolicyStatus.

A public policy (an unconditional Allow for everyone) is refused when the bucket's public
access block says BlockPublicPolicy (403 AccessDenied), and GetBucketPolicyStatus calls a
policy public only where RestrictPublicBuckets does not confine it (without a policy:
not public, as AWS answers).

Putting a policy is the bucket owner's (or root's, or an admin user's) right alone, and a
policy never takes it away: a policy that locks everyone out can always be replaced.  Reading
and deleting it are the owner's too, and anyone's whom the policy itself allows (and does not
deny).  Validation is :func:`tierd.acl.policy.parse_policy`'s; its message goes back in the
``MalformedPolicy`` error.
"""

from __future__ import annotations

import errno

from aiohttp import web

from tierd.acl import AccessDenied
from tierd.acl.authorize import decide
from tierd.acl.policy import MAX_POLICY_BYTES, Decision, MalformedPolicy, Policy, parse_policy
from tierd.errors import FsError
from tierd.namespace.api import Bucket
from tierd.s3 import access
from tierd.s3.body import Body
from tierd.s3.buckets import xml_response
from tierd.s3.common import Ctx
from tierd.s3.errors import S3Error, from_fs_error
from tierd.s3.xmlio import document, el


async def bucket_record(ctx: Ctx) -> Bucket:
    try:
        return await ctx.ns.get_bucket(ctx.bucket)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None


def is_manager(ctx: Ctx, bucket: Bucket) -> bool:
    """The bucket owner, root, or an admin user (never an anonymous request)."""
    auth = ctx.auth
    if auth is None:
        return False
    ident = auth.identity
    return ident.is_root or auth.key.admin or ident.uid == bucket.owner_uid


def may_manage(ctx: Ctx, bucket: Bucket, action: str) -> Policy | None:
    """Owner/root/admin always; others when the policy allows ``action`` on the bucket
    (and its public access block does not take that away).  Returns the bucket's own
    policy (None without one)."""
    _, policy = ctx.state.policies.lookup(ctx.bucket, guarded=False)
    if is_manager(ctx, bucket):
        return policy
    guarded = ctx.state.policies.get(ctx.bucket)
    decision, _ = decide(guarded, access.requester(ctx), action, ctx.bucket, None,
                         access.context(ctx, action))
    if decision is not Decision.ALLOW:
        raise AccessDenied(errno.EACCES, f"only the owner of bucket {ctx.bucket!r} may call "
                           f"{action}")
    return policy


async def owner_or_granted(ctx: Ctx, action: str, refusal: str | None = None) -> None:
    """NoSuchBucket, or AccessDenied (``refusal``, or "only the owner ... may call
    ``action``") unless the caller manages the bucket or the bucket policy allowed
    ``action``.  Unlike :func:`may_manage` it does not decide the policy again: the
    sub-resources that use it (CORS, bucket tags, lifecycle) are judged before the
    handler (:mod:`tierd.s3.access`), and a grant of that judgement rides on the
    request's identity."""
    b = await bucket_record(ctx)
    if not is_manager(ctx, b) and ctx.ident.grant is None:
        raise AccessDenied(errno.EACCES, refusal or f"only the owner of bucket "
                           f"{ctx.bucket!r} may call {action}")


async def get_policy(ctx: Ctx) -> web.Response:
    b = await bucket_record(ctx)
    policy = may_manage(ctx, b, "s3:GetBucketPolicy")
    if policy is None:
        raise S3Error("NoSuchBucketPolicy", BucketName=ctx.bucket)
    return web.Response(status=200, body=policy.text.encode(), headers=ctx.response_headers,
                        content_type="application/json")


async def put_policy(ctx: Ctx) -> web.Response:
    b = await bucket_record(ctx)
    if not is_manager(ctx, b):
        raise AccessDenied(errno.EACCES, f"only the owner of bucket {ctx.bucket!r} (or root) "
                           "may set its policy")
    try:
        raw = await Body(ctx.request, ctx.verified).read_all(MAX_POLICY_BYTES)
    except S3Error as e:
        if e.code != "EntityTooLarge":
            raise
        raise S3Error("MalformedPolicy", f"the policy is larger than {MAX_POLICY_BYTES} bytes "
                      "(20 KiB)") from None
    try:
        policy = parse_policy(raw, ctx.bucket)
    except MalformedPolicy as e:
        raise S3Error("MalformedPolicy", str(e)) from None
    if policy.public and ctx.state.policies.block(ctx.bucket).block_public_policy:
        raise AccessDenied(errno.EACCES, f"bucket {ctx.bucket!r} blocks public policies "
                           "(PublicAccessBlock BlockPublicPolicy): this policy allows "
                           "everyone without a condition")
    try:
        await ctx.state.policies.put(ctx.bucket, policy)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    return web.Response(status=204, headers=ctx.response_headers)


async def delete_policy(ctx: Ctx) -> web.Response:
    b = await bucket_record(ctx)
    may_manage(ctx, b, "s3:DeleteBucketPolicy")
    try:
        await ctx.state.policies.delete(ctx.bucket)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    return web.Response(status=204, headers=ctx.response_headers)


async def get_policy_status(ctx: Ctx) -> web.Response:
    b = await bucket_record(ctx)
    policy = may_manage(ctx, b, "s3:GetBucketPolicyStatus")
    # no policy is not public (as AWS answers), nor is one RestrictPublicBuckets confines
    public = ("true" if policy is not None and policy.public
              and not ctx.state.policies.block(ctx.bucket).restrict_public_buckets else "false")
    return xml_response(ctx, document("PolicyStatus", el("IsPublic", public)))

