"""Object and bucket tagging: Get/Put/DeleteObjectTagging and Get/Put/DeleteBucketTagging.

Object tags are stored with the object's metadata (:mod:`tierd.namespace.tags`: changing
them keeps the ETag, version and Last-Modified; a write through the mount keeps them); the
POSIX checks are those of :mod:`tierd.acl.s3map` (read on the object to read them, write to
change them).  Bucket tags are the bucket configuration document ``tagging``
(:mod:`tierd.namespace.bucketconf`), stored URL-encoded like object tags.

Permissions: GetObjectTagging and DeleteObjectTagging are judged before the handler, like
every object call (:mod:`tierd.s3.access`).  PutObjectTagging judges itself once its body is
read, because its ``s3:RequestObjectTag/<key>`` condition keys are the tags in the body.
Bucket tagging is the bucket owner's (or root's, or an admin's), or anyone's whom the bucket
policy allows; an explicit Deny binds the owner too, as on AWS.

Versions: ``?versionId=`` names any version (``null`` included) whose tags are read or
changed (a version is an inode of its own, :mod:`tierd.namespace.versions`); without it the
current object.  Tagging never makes a version.  ``s3:ExistingObjectTag/<key>`` is judged on
the tags of the version the request names (:mod:`tierd.s3.access`).
"""

from __future__ import annotations

from aiohttp import web

from tierd.acl.policy import REQUEST_OBJECT_TAG
from tierd.errors import FsError
from tierd.namespace.api import Inode, decode_tags, encode_tags, tags_of
from tierd.s3 import access, bucketdoc, tagset, versioning, xmlio
from tierd.s3.body import Body
from tierd.s3.bucket_policy import owner_or_granted
from tierd.s3.buckets import xml_response
from tierd.s3.common import Ctx
from tierd.s3.errors import S3Error
from tierd.s3.objects import fs_error

#: the bucket configuration document of bucket tags (tierd.namespace.bucketconf)
BUCKET_CONFIG = "tagging"


def target_version(ctx: Ctx) -> str | None:
    """The version ``?versionId=`` names (None: the current object); InvalidArgument when
    it is no version id."""
    return versioning.version_param(ctx)


async def _error(ctx: Ctx, e: FsError, vid: str | None) -> S3Error:
    """The S3 error of a failed tagging call: a delete marker as S3 answers it (405 when
    named by id, 404 NoSuchKey with ``x-amz-delete-marker`` when it is the latest)."""
    if isinstance(e, versioning.DeleteMarkerHit):
        return versioning.marker_error(ctx, e)
    if vid is None:
        marker = versioning.missing_error(ctx, e)
        if marker is not None:
            return marker
    return await fs_error(ctx, e)


def _version_header(ctx: Ctx, inode: Inode, vid: str | None) -> None:
    """``x-amz-version-id``: the version named, or the current one's in a versioned bucket."""
    if vid is not None:
        ctx.response_headers["x-amz-version-id"] = vid
    else:
        versioning.set_version_header(ctx, inode)


async def _read_body(ctx: Ctx) -> bytes:
    return await Body(ctx.request, ctx.verified).read_all(xmlio.SMALL_BODY)


# -- objects -------------------------------------------------------------------------------

async def get_object_tagging(ctx: Ctx) -> web.Response:
    vid = target_version(ctx)
    try:
        inode = await ctx.ns.tagged_object(ctx.ident, ctx.bucket, ctx.key, vid)
    except FsError as e:
        raise await _error(ctx, e, vid) from None
    _version_header(ctx, inode, vid)
    return xml_response(ctx, tagset.tagging_document(tags_of(inode)))


async def put_object_tagging(ctx: Ctx) -> web.Response:
    vid = target_version(ctx)
    tags = tagset.parse_document(await _read_body(ctx))
    access.judge_object(ctx, "s3:PutObjectTagging", access.tag_keys(REQUEST_OBJECT_TAG, tags))
    try:
        inode = await ctx.ns.set_object_tags(ctx.ident, ctx.bucket, ctx.key, tags, vid=vid)
    except FsError as e:
        raise await _error(ctx, e, vid) from None
    _version_header(ctx, inode, vid)
    return web.Response(status=200, headers=ctx.response_headers)


async def delete_object_tagging(ctx: Ctx) -> web.Response:
    vid = target_version(ctx)
    try:
        inode = await ctx.ns.set_object_tags(ctx.ident, ctx.bucket, ctx.key, [],
                                             action="DeleteObjectTagging", vid=vid)
    except FsError as e:
        raise await _error(ctx, e, vid) from None
    _version_header(ctx, inode, vid)
    return web.Response(status=204, headers=ctx.response_headers)


# -- buckets -------------------------------------------------------------------------------

async def get_bucket_tagging(ctx: Ctx) -> web.Response:
    await owner_or_granted(ctx, "s3:GetBucketTagging")
    text = bucketdoc.require(ctx, BUCKET_CONFIG, "NoSuchTagSet")
    return xml_response(ctx, tagset.tagging_document(decode_tags(text)))


async def put_bucket_tagging(ctx: Ctx) -> web.Response:
    await owner_or_granted(ctx, "s3:PutBucketTagging")
    tags = tagset.parse_document(await _read_body(ctx), tagset.MAX_BUCKET_TAGS, "Bucket")
    await bucketdoc.store(ctx, BUCKET_CONFIG, encode_tags(tags) if tags else None)
    return web.Response(status=204, headers=ctx.response_headers)


async def delete_bucket_tagging(ctx: Ctx) -> web.Response:
    # AWS names the permission of DeleteBucketTagging s3:PutBucketTagging
    await owner_or_granted(ctx, "s3:PutBucketTagging")
    await bucketdoc.store(ctx, BUCKET_CONFIG, None)
    return web.Response(status=204, headers=ctx.response_headers)
