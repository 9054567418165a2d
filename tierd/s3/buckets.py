"""Bucket operations: ListBuckets, CreateBucket, DeleteBucket, HeadBucket,
GetBucketLocation, GetBucketVersioning."""

from __future__ import annotations

import base64
import binascii
import errno

from aiohttp import web

from tierd.acl import R_OK, X_OK
from tierd.errors import FsError
from tierd.s3 import xmlio
from tierd.s3.body import Body
from tierd.s3.common import Ctx, canned_acl, int_param, reject_unsupported_headers
from tierd.s3.errors import S3Error, from_fs_error
from tierd.s3.xmlio import document, el, iso8601


def xml_response(ctx: Ctx, body: str, status: int = 200) -> web.Response:
    return web.Response(status=status, body=body.encode(), content_type="application/xml",
                        headers=ctx.response_headers)


async def bucket_or_404(ctx: Ctx, name: str | None = None) -> None:
    """NoSuchBucket unless the bucket exists."""
    name = name or ctx.bucket
    try:
        await ctx.ns.get_bucket(name)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=name) from None


MAX_BUCKETS = 10000  # ListBuckets' largest (and default) page


def _bucket_token(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def _bucket_untoken(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise S3Error("InvalidArgument", "The continuation token provided is incorrect",
                      ArgumentName="continuation-token", ArgumentValue=token) from None


async def list_buckets(ctx: Ctx) -> web.Response:
    """Root sees every bucket; other users the buckets they own.  Pages of ``max-buckets``
    (1..10000, default 10000) in name order; ``ContinuationToken`` in the answer names where
    the next page starts (an opaque encoding of the last name listed), as AWS does."""
    ident = ctx.ident
    q = ctx.query
    limit = int_param(ctx, "max-buckets", 1, MAX_BUCKETS, MAX_BUCKETS)
    token = q.get("continuation-token") or ""
    after = _bucket_untoken(token) if token else ""
    prefix = q.get("prefix", "")
    region = q.get("bucket-region", "")
    buckets = await ctx.ns.list_buckets(ident)
    mine = sorted((b for b in buckets if (ident.is_root or b.owner_uid == ident.uid)
                   and b.name.startswith(prefix) and b.name > after
                   and (not region or b.region == region)), key=lambda b: b.name)
    page = mine[:limit]
    rows = "".join(
        f"<Bucket>{el('Name', b.name)}{el('CreationDate', iso8601(b.created_ns))}"
        f"{el('BucketRegion', b.region)}</Bucket>"
        for b in page
    )
    body = f"{ctx.owner_xml(ident.uid)}<Buckets>{rows}</Buckets>"
    if len(mine) > limit:
        body += el("ContinuationToken", _bucket_token(page[-1].name))
    if prefix:
        body += el("Prefix", prefix)
    return xml_response(ctx, document("ListAllMyBucketsResult", body))


async def create_bucket(ctx: Ctx) -> web.Response:
    reject_unsupported_headers(ctx.headers)
    if ctx.headers.get("x-amz-bucket-object-lock-enabled", "").lower() == "true":
        raise S3Error("NotImplemented", "object lock is not supported by tierd")
    raw = await Body(ctx.request, ctx.verified).read_all(xmlio.MAX_XML_BODY)
    if raw.strip():
        doc = xmlio.parse(raw, "CreateBucketConfiguration")
        loc = xmlio.child_text(doc, "LocationConstraint")
        if loc and loc != ctx.state.region:
            raise S3Error("InvalidArgument",
                          f"this tierd serves region {ctx.state.region!r}; the location "
                          f"constraint {loc!r} cannot be satisfied",
                          ArgumentName="LocationConstraint", ArgumentValue=loc)
    try:
        await ctx.ns.create_bucket(ctx.ident, ctx.bucket)
    except FsError as e:
        if e.errno == errno.EEXIST:
            await _existing_bucket(ctx, e)
        elif e.errno == errno.EINVAL:
            raise S3Error("InvalidBucketName", e.message, BucketName=ctx.bucket) from None
        else:
            raise from_fs_error(e, bucket=ctx.bucket) from None
    acl = canned_acl(ctx.headers)
    if acl is not None:  # the creator owns the bucket, so this cannot be refused
        await ctx.ns.set_canned_acl(ctx.ident, ctx.bucket, "", acl)
    ctx.response_headers["Location"] = "/" + ctx.bucket
    return web.Response(status=200, headers=ctx.response_headers)


async def _existing_bucket(ctx: Ctx, e: FsError) -> None:
    """CreateBucket of a name that exists: another owner's is 409 BucketAlreadyExists; your
    own is 409 BucketAlreadyOwnedByYou, except in us-east-1, where AWS keeps its legacy
    answer, 200 (the bucket is untouched but for a canned ACL sent with the request, as AWS
    resets the ACL; without one nothing changes, so ACL entries set through the mount
    survive a client's "make sure the bucket exists" call)."""
    try:
        existing = await ctx.ns.get_bucket(ctx.bucket)
    except FsError:
        raise from_fs_error(e, bucket=ctx.bucket) from None
    if existing.owner_uid != ctx.ident.uid:
        raise S3Error("BucketAlreadyExists", BucketName=ctx.bucket) from None
    if ctx.state.region != "us-east-1":
        raise S3Error("BucketAlreadyOwnedByYou", BucketName=ctx.bucket) from None


async def delete_bucket(ctx: Ctx) -> web.Response:
    await bucket_or_404(ctx)
    try:
        await ctx.ns.delete_bucket(ctx.ident, ctx.bucket)
    except FsError as e:
        if e.errno == errno.ENOTEMPTY:
            raise S3Error("BucketNotEmpty", BucketName=ctx.bucket) from None
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    return web.Response(status=204, headers=ctx.response_headers)


async def head_bucket(ctx: Ctx) -> web.Response:
    try:
        b = await ctx.ns.get_bucket(ctx.bucket)
        await ctx.ns.access(ctx.ident, b.ino, R_OK | X_OK)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    ctx.response_headers["x-amz-bucket-region"] = b.region
    return web.Response(status=200, headers=ctx.response_headers)


async def get_location(ctx: Ctx) -> web.Response:
    try:
        b = await ctx.ns.get_bucket(ctx.bucket)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    region = "" if b.region == "us-east-1" else b.region  # AWS: empty for us-east-1
    return xml_response(ctx, f'{xmlio.HEADER}<LocationConstraint xmlns="{xmlio.S3_NS}">'
                        f"{xmlio.text(region)}</LocationConstraint>")


async def get_versioning(ctx: Ctx) -> web.Response:
    """Buckets are unversioned: an empty configuration (never enabled)."""
    await bucket_or_404(ctx)
    return xml_response(ctx, document("VersioningConfiguration", ""))


async def put_versioning(ctx: Ctx) -> web.Response:
    await bucket_or_404(ctx)
    raise S3Error("NotImplemented", "tierd buckets are unversioned; versioning cannot be "
                  "enabled or suspended")
