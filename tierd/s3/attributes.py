"""GetObjectAttributes (``GET /bucket/key?attributes``): what a client asks for in
``x-amz-object-attributes`` (ETag, Checksum, ObjectParts, StorageClass, ObjectSize), read
from the object's metadata without its body.

Clients call it to learn an object's size and checksum, and the part layout of a multipart
object (to download or verify it part by part) without a HEAD per part.  The part layout
is the one CompleteMultipartUpload stored (:data:`tierd.s3.common.META_PARTS`); parts are
paged with ``x-amz-max-parts`` and ``x-amz-part-number-marker``.  Part checksums are not
kept, so a ``<Part>`` carries its number and size only.  ``versionId`` names a version as
for GetObject (a delete marker: 404 or 405 with ``x-amz-delete-marker``).
"""

from __future__ import annotations

import errno

from aiohttp import web

from tierd.errors import FsError
from tierd.s3 import checksums, versioning
from tierd.s3.buckets import xml_response
from tierd.s3.common import (
    Ctx,
    etag_of,
    http_date,
    int_value,
    object_checksum,
    part_layout,
    reject_unsupported_headers,
)
from tierd.s3.errors import S3Error
from tierd.s3.objects import fs_error
from tierd.s3.xmlio import document, el

#: the attribute names ``x-amz-object-attributes`` may list, in the answer's order
ATTRIBUTES = ("ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize")
MAX_PARTS = 1000  # default and largest page of parts, as ListParts


def requested(header: str | None) -> set[str]:
    """The attribute names of the header (comma separated; InvalidArgument when missing,
    empty or naming an unknown attribute)."""
    names = {n.strip() for n in (header or "").split(",") if n.strip()}
    if not names:
        raise S3Error("InvalidArgument", "The x-amz-object-attributes header specifying the "
                      "attributes to be retrieved is either missing or empty",
                      ArgumentName="x-amz-object-attributes")
    unknown = sorted(names - set(ATTRIBUTES))
    if unknown:
        raise S3Error("InvalidArgument", "Invalid attribute name specified.",
                      ArgumentName="x-amz-object-attributes", ArgumentValue=unknown[0])
    return names


def parts_xml(sizes: list[int], marker: int, limit: int) -> str:
    """``<ObjectParts>`` of a multipart object: the parts after ``marker``, at most
    ``limit`` of them."""
    page = list(enumerate(sizes, 1))[marker:marker + limit]
    truncated = marker + limit < len(sizes)
    body = (el("PartsCount", len(sizes)) + el("PartNumberMarker", marker))
    if page:
        body += el("NextPartNumberMarker", page[-1][0])
    body += el("MaxParts", limit) + el("IsTruncated", "true" if truncated else "false")
    body += "".join(f"<Part>{el('PartNumber', n)}{el('Size', size)}</Part>"
                    for n, size in page)
    return f"<ObjectParts>{body}</ObjectParts>"


async def get_object_attributes(ctx: Ctx) -> web.Response:
    names = requested(ctx.headers.get("x-amz-object-attributes"))
    reject_unsupported_headers(ctx.headers)  # SSE-C keys: no encrypted objects to open
    h = ctx.headers
    limit = int_value(h.get("x-amz-max-parts"), "x-amz-max-parts", 0, MAX_PARTS, MAX_PARTS)
    marker = int_value(h.get("x-amz-part-number-marker"), "x-amz-part-number-marker", 0,
                       10000, 0)
    vid = versioning.version_param(ctx)
    try:
        if vid is not None:
            inode = await ctx.ns.head_version(ctx.ident, ctx.bucket, ctx.key, vid)
        else:
            inode = await ctx.ns.head_object(ctx.ident, ctx.bucket, ctx.key)
    except versioning.DeleteMarkerHit as e:
        raise versioning.marker_error(ctx, e) from None
    except FsError as e:
        raise (versioning.missing_error(ctx, e) or await fs_error(ctx, e)) from None
    if not inode.is_reg and not inode.is_dir:
        raise await fs_error(ctx, FsError(errno.ENOENT, f"no such key {ctx.key!r}"))
    out = ""
    if "ETag" in names:
        out += el("ETag", etag_of(inode))  # unquoted here, unlike the ETag header
    if "Checksum" in names:
        ck = object_checksum(inode)
        if ck is not None:
            kind = inode.objmeta.get(checksums.META_TYPE, "FULL_OBJECT")
            out += (f"<Checksum>{el('Checksum' + ck[0].upper(), ck[1])}"
                    f"{el('ChecksumType', kind)}</Checksum>")
    if "ObjectParts" in names:
        sizes = part_layout(inode)
        if sizes:
            out += parts_xml(sizes, marker, limit)
    if "StorageClass" in names:
        out += el("StorageClass", "STANDARD")
    if "ObjectSize" in names:
        out += el("ObjectSize", inode.size)
    ctx.response_headers["Last-Modified"] = http_date(inode.mtime_ns)
    if vid is not None:
        ctx.response_headers["x-amz-version-id"] = vid
    else:
        versioning.set_version_header(ctx, inode)
    return xml_response(ctx, document("GetObjectAttributesResponse", out))
