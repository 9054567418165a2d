"""Reading and storing the bucket configuration document of an S3 bucket sub-resource
(CORS, bucket tags, lifecycle, public access block, ownership controls).

The handlers of those sub-resources each read their document, answer a sub-resource
specific 404 when it is unset and store or remove it; one home for that keeps their
answers alike: a bucket that is missing (or vanishes between the permission check and
the read or write) is ``NoSuchBucket`` everywhere, and a document over
:data:`tierd.namespace.bucketconf.MAX_CONFIG_BYTES` is ``EntityTooLarge`` everywhere.
The store is :mod:`tierd.namespace.bucketconf`'s: durable when :func:`store` returns.
"""

from __future__ import annotations

from tierd.errors import FsError
from tierd.s3.common import Ctx, bucket_doc
from tierd.s3.errors import S3Error, from_fs_error


def read(ctx: Ctx, name: str) -> str | None:
    """The bucket's document ``name`` (None when unset); NoSuchBucket without the bucket."""
    try:
        return bucket_doc(ctx, name)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None


def require(ctx: Ctx, name: str, missing: str) -> str:
    """The bucket's document ``name``; the S3 error ``missing`` (a 404 such as
    ``NoSuchTagSet``, naming the bucket) when it is unset."""
    text = read(ctx, name)
    if not text:
        raise S3Error(missing, BucketName=ctx.bucket)
    return text


async def store(ctx: Ctx, name: str, text: str | None) -> None:
    """Set (``text``) or remove (None) the bucket's document ``name``, durably;
    NoSuchBucket without the bucket."""
    try:
        await ctx.ns.bucket_config.put(ctx.bucket, name, text)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
