"""Listings: ListObjects (v1), ListObjectsV2 and ListObjectVersions, served page by page
from the namespace's sorted range scans (never a whole directory in memory)."""

from __future__ import annotations

import base64
import binascii
from urllib.parse import quote

from aiohttp import web

from tierd.errors import FsError
from tierd.namespace import Listing
from tierd.s3.buckets import xml_response
from tierd.s3.common import Ctx, etag_of, max_keys, quoted
from tierd.s3.errors import S3Error, from_fs_error
from tierd.s3.xmlio import document, el, iso8601


def _encoder(ctx: Ctx) -> tuple[bool, str | None]:
    enc = ctx.query.get("encoding-type")
    if enc is None:
        return False, None
    if enc.lower() != "url":
        raise S3Error("InvalidArgument", "Invalid Encoding Method specified in Request",
                      ArgumentName="encoding-type", ArgumentValue=enc)
    return True, "url"


def _enc(url: bool, value: str) -> str:
    return quote(value, safe="/") if url else value


async def _page(ctx: Ctx, prefix: str, start_after: str, delimiter: str,
                limit: int) -> Listing:
    if limit == 0:
        return Listing()
    try:
        return await ctx.ns.list_objects(ctx.ident, ctx.bucket, prefix, start_after,
                                         delimiter, limit)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None


def _contents(ctx: Ctx, listing: Listing, url: bool, owner: bool,
              tag: str = "Contents") -> str:
    out: list[str] = []
    owners: dict[int, str] = {}
    for key, inode in listing.contents:
        row = el("Key", _enc(url, key))
        row += (el("LastModified", iso8601(inode.mtime_ns)) + el("ETag", quoted(etag_of(inode)))
                + el("Size", inode.size))
        if owner:
            xml = owners.get(inode.uid)
            if xml is None:
                xml = owners[inode.uid] = ctx.owner_xml(inode.uid)
            row += xml
        row += el("StorageClass", "STANDARD")
        out.append(f"<{tag}>{row}</{tag}>")
    for p in listing.prefixes:
        out.append(f"<CommonPrefixes>{el('Prefix', _enc(url, p))}</CommonPrefixes>")
    return "".join(out)


def _common(ctx: Ctx) -> tuple[str, str, bool, str | None]:
    q = ctx.query
    url, enc = _encoder(ctx)
    return q.get("prefix", ""), q.get("delimiter", ""), url, enc


async def list_objects_v1(ctx: Ctx) -> web.Response:
    prefix, delimiter, url, enc = _common(ctx)
    marker = ctx.query.get("marker", "")
    limit = max_keys(ctx)
    listing = await _page(ctx, prefix, marker, delimiter, limit)
    head = (el("Name", ctx.bucket) + el("Prefix", _enc(url, prefix))
            + el("Marker", _enc(url, marker)))
    if listing.truncated:
        head += el("NextMarker", _enc(url, listing.next_marker))
    head += el("MaxKeys", limit)
    if delimiter:
        head += el("Delimiter", _enc(url, delimiter))
    head += el("IsTruncated", "true" if listing.truncated else "false")
    if enc:
        head += el("EncodingType", enc)
    body = head + _contents(ctx, listing, url, owner=True)
    return xml_response(ctx, document("ListBucketResult", body))


def _token(marker: str) -> str:
    return base64.urlsafe_b64encode(marker.encode("utf-8", "surrogateescape")).decode()


def _untoken(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode("utf-8", "surrogateescape")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise S3Error("InvalidArgument", "The continuation token provided is incorrect",
                      ArgumentName="continuation-token") from None


async def list_objects_v2(ctx: Ctx) -> web.Response:
    q = ctx.query
    prefix, delimiter, url, enc = _common(ctx)
    start_after = q.get("start-after", "")
    token = q.get("continuation-token") or None  # empty: absent, as AWS treats it
    start = start_after
    if token is not None:
        start = max(start, _untoken(token))
    limit = max_keys(ctx)
    fetch_owner = q.get("fetch-owner", "false").lower() == "true"
    listing = await _page(ctx, prefix, start, delimiter, limit)
    head = el("Name", ctx.bucket) + el("Prefix", _enc(url, prefix))
    if start_after:
        head += el("StartAfter", _enc(url, start_after))
    if token is not None:
        head += el("ContinuationToken", token)
    if listing.truncated:
        head += el("NextContinuationToken", _token(listing.next_marker))
    head += el("KeyCount", len(listing.contents) + len(listing.prefixes))
    head += el("MaxKeys", limit)
    if delimiter:
        head += el("Delimiter", _enc(url, delimiter))
    head += el("IsTruncated", "true" if listing.truncated else "false")
    if enc:
        head += el("EncodingType", enc)
    body = head + _contents(ctx, listing, url, owner=fetch_owner)
    return xml_response(ctx, document("ListBucketResult", body))
