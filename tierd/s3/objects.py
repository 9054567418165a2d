"""Object operations: PutObject, GetObject, HeadObject, DeleteObject, DeleteObjects and
CopyObject.  GET bodies go out with sendfile from the local tier file when possible."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator

from aiohttp import web

from tierd.acl import canned
from tierd.errors import FsError, Reason
from tierd.namespace import ObjectReader
from tierd.namespace.api import Inode, close_source, current_vid
from tierd.preconditions import IF_NONE_MATCH, etag_matches
from tierd.s3 import access, checksums, tagset, versioning, xmlio
from tierd.s3.body import Body
from tierd.s3.buckets import xml_response
from tierd.s3.common import (
    MAX_PUT_SIZE,
    Ctx,
    canned_acl,
    check_conditions,
    checksum_meta,
    etag_of,
    object_checksum,
    object_headers,
    objmeta_from_headers,
    parse_copy_source,
    parse_range,
    part_layout,
    quoted,
    reject_unsupported_headers,
)
from tierd.s3.errors import S3Error, from_fs_error
from tierd.s3.xmlio import document, el, iso8601

MAX_DELETE_KEYS = 1000
DELETE_BATCH = 100
_RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}


async def fs_error(ctx: Ctx, e: OSError, bucket: str | None = None,
                   key: str | None = None) -> S3Error:
    """The S3 error of a failed object call: ENOENT is NoSuchBucket when the bucket is
    missing, NoSuchKey otherwise."""
    bucket = ctx.bucket if bucket is None else bucket
    key = ctx.key if key is None else key
    missing = "NoSuchKey"
    if e.errno == errno.ENOENT and not (isinstance(e, FsError) and e.reason):
        try:
            await ctx.ns.get_bucket(bucket)
        except FsError:
            missing = "NoSuchBucket"
    return from_fs_error(e, missing=missing, bucket=bucket, key=key)


# -- PUT ---------------------------------------------------------------------------------

def put_conditions(ctx: Ctx) -> tuple[str | None, str | None]:
    """(If-Match, If-None-Match) of a conditional PUT; If-None-Match may only be ``*``."""
    if_none, if_match = ctx.headers.get("If-None-Match"), ctx.headers.get("If-Match")
    if if_none is not None:
        if if_none.strip() != "*":
            raise S3Error("NotImplemented", "If-None-Match on PUT supports only '*'")
        if_none = "*"
    if if_match is not None:
        if_match = if_match.strip()
    return if_match, if_none


async def put_error(ctx: Ctx, e: FsError) -> S3Error:
    """The S3 error of a failed conditional write (PUT, CompleteMultipartUpload): a
    condition the commit found false is PreconditionFailed naming the header."""
    if e.reason is Reason.PRECONDITION_FAILED:
        return S3Error("PreconditionFailed", Condition="If-None-Match"
                       if e.errno == errno.EEXIST else "If-Match")
    return await fs_error(ctx, e)


async def _fail_fast(ctx: Ctx, if_match: str | None, if_none: str | None) -> None:
    """Answer a conditional PUT that already fails before its body is received.  Only an
    early exit: the namespace checks the condition again inside the commit, which is what
    makes it atomic against concurrent writers."""
    try:
        cur: Inode | None = await ctx.ns.head_object(ctx.ident, ctx.bucket, ctx.key)
    except FsError as e:
        if e.errno != errno.ENOENT:
            raise await fs_error(ctx, e) from None
        cur = None
    if (if_none is not None and cur is not None and cur.is_reg
            and etag_matches(if_none, etag_of(cur))):
        raise S3Error("PreconditionFailed", Condition=IF_NONE_MATCH)
    if if_match is not None:
        if cur is None or not cur.is_reg:
            raise S3Error("NoSuchKey", Key=ctx.key)
        check_conditions(ctx.headers, cur)


async def put_object(ctx: Ctx) -> web.Response:
    objmeta = objmeta_from_headers(ctx.headers)
    body = Body(ctx.request, ctx.verified, max_size=MAX_PUT_SIZE)
    if_match, if_none = put_conditions(ctx)
    if if_match is not None or if_none is not None:
        await _fail_fast(ctx, if_match, if_none)
    try:
        stream = _with_checksums(body, objmeta) if body.client_checksum else body
        inode = await ctx.ns.put_object(ctx.ident, ctx.bucket, ctx.key, stream, objmeta,
                                        if_match=if_match, if_none_match=if_none)
    except FsError as e:
        raise await put_error(ctx, e) from None
    h = ctx.response_headers
    h["ETag"] = quoted(etag_of(inode))
    versioning.set_version_header(ctx, inode)
    if body.client_checksum:
        for alg, value in body.checksums.items():
            h[checksums.META_PREFIX + alg] = value
            h[checksums.META_TYPE] = "FULL_OBJECT"
    return web.Response(status=200, headers=h)


async def _with_checksums(body: Body, objmeta: dict[str, str]) -> AsyncIterator[bytes]:
    """The body's pieces; once it is complete and verified, its checksum goes into
    ``objmeta`` (the namespace reads ``objmeta`` only after the body is consumed)."""
    pieces = aiter(body)
    try:
        async for piece in pieces:
            yield piece
    except BaseException:
        await close_source(pieces)  # closed early (a refused write): close the reader too
        raise
    objmeta.update(checksum_meta(body.checksums))


# -- GET / HEAD --------------------------------------------------------------------------

async def get_object(ctx: Ctx) -> web.StreamResponse:
    return await _read_object(ctx, head=False)


async def head_object(ctx: Ctx) -> web.StreamResponse:
    return await _read_object(ctx, head=True)


async def _read_object(ctx: Ctx, head: bool) -> web.StreamResponse:
    vid = versioning.version_param(ctx)
    reader: ObjectReader | None = None
    try:
        if vid is not None:
            if head:
                inode = await ctx.ns.head_version(ctx.ident, ctx.bucket, ctx.key, vid)
            else:
                reader = await ctx.ns.get_version(ctx.ident, ctx.bucket, ctx.key, vid)
                inode = reader.inode
        elif head:
            inode = await ctx.ns.head_object(ctx.ident, ctx.bucket, ctx.key)
        else:
            reader = await ctx.ns.get_object(ctx.ident, ctx.bucket, ctx.key)
            inode = reader.inode
    except versioning.DeleteMarkerHit as e:
        raise versioning.marker_error(ctx, e) from None
    except FsError as e:
        raise (versioning.missing_error(ctx, e) or await fs_error(ctx, e)) from None
    try:
        check_conditions(ctx.headers, inode)
        size = inode.size
        whole = True
        status = 200
        h = ctx.response_headers
        span: tuple[int, int] | None = None
        part_number = ctx.query.get("partNumber")
        if part_number is not None:
            span, count = _part_span(inode, part_number)
            h["x-amz-mp-parts-count"] = str(count)
            status = 206
            whole = span == (0, size - 1) and count == 1
        else:
            span = parse_range(ctx.headers.get("Range"), size)
            if span is not None:
                status = 206
                whole = False
        checksum_mode = (ctx.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"
                         and whole)
        h.update(object_headers(inode, checksum_mode=checksum_mode))
        for param, header in _RESPONSE_OVERRIDES.items():
            value = ctx.query.get(param)
            if value is not None:
                h[header] = value
        if vid is not None:
            h["x-amz-version-id"] = vid
        else:
            versioning.set_version_header(ctx, inode)
        first, count_bytes = 0, size
        if span is not None:
            first, last = span
            count_bytes = max(0, last - first + 1)
            h["Content-Range"] = f"bytes {first}-{last}/{size}"
        stream = web.StreamResponse(status=status, headers=h)
        stream.content_length = count_bytes
        ctx.stream = stream
        await stream.prepare(ctx.request)
        if count_bytes and reader is not None:
            await send_range(ctx.request, stream, reader, first, count_bytes)
        await stream.write_eof()
        return stream
    finally:
        if reader is not None:
            await reader.close()


def _part_span(inode: Inode, raw: str) -> tuple[tuple[int, int] | None, int]:
    """Byte span of part ``raw`` of the object and its part count."""
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= 10000:
        raise S3Error("InvalidArgument", "Part number must be an integer between 1 and "
                      "10000, inclusive", ArgumentName="partNumber", ArgumentValue=raw)
    sizes = part_layout(inode) or [inode.size]
    if n > len(sizes):
        raise S3Error("InvalidPartNumber", PartNumberRequested=str(n),
                      ActualPartCount=str(len(sizes)))
    first = sum(sizes[: n - 1])
    if sizes[n - 1] == 0:
        return None, len(sizes)
    return (first, first + sizes[n - 1] - 1), len(sizes)


async def send_range(request: web.Request, resp: web.StreamResponse, reader: ObjectReader,
                     offset: int, count: int) -> None:
    """Send ``count`` bytes at ``offset``: the kernel's sendfile from the tier file when
    there is one and the transport is a plain socket, else streamed reads."""
    transport = request.transport
    if reader.fd >= 0 and transport is not None and \
            transport.get_extra_info("sslcontext") is None:
        loop = asyncio.get_running_loop()
        with open(reader.fd, "rb", buffering=0, closefd=False) as fobj:
            try:
                await loop.sendfile(transport, fobj, offset, count)
                return
            except NotImplementedError:
                pass
    async for chunk in reader.iter(offset, count):
        await resp.write(chunk)


# -- DELETE ------------------------------------------------------------------------------

async def delete_object(ctx: Ctx) -> web.Response:
    vid = versioning.version_param(ctx)
    try:
        if vid is None and not versioning.versioned(ctx):
            await ctx.ns.delete_object(ctx.ident, ctx.bucket, ctx.key)
        else:
            done = await ctx.ns.delete_version(ctx.ident, ctx.bucket, ctx.key, vid)
            if done.vid is not None:
                ctx.response_headers["x-amz-version-id"] = done.vid
            if done.marker:
                ctx.response_headers["x-amz-delete-marker"] = "true"
    except FsError as e:
        raise await fs_error(ctx, e) from None
    return web.Response(status=204, headers=ctx.response_headers)


async def delete_objects(ctx: Ctx) -> web.Response:
    """DeleteObjects: the keys go to the namespace in batches (one metadata sync each)."""
    raw = await Body(ctx.request, ctx.verified).read_all(xmlio.MAX_XML_BODY)
    doc = xmlio.parse(raw, "Delete")
    quiet = (xmlio.child_text(doc, "Quiet", "false") or "").strip().lower() == "true"
    objects = xmlio.children(doc, "Object")
    if len(objects) > MAX_DELETE_KEYS:
        raise S3Error("MalformedXML", f"a DeleteObjects request may name at most "
                      f"{MAX_DELETE_KEYS} keys, not {len(objects)}")
    asked: list[tuple[str, str | None]] = []
    for obj in objects:
        key = xmlio.child_text(obj, "Key")
        if key is None:
            raise S3Error("MalformedXML", "every <Object> needs a <Key>")
        asked.append((key, xmlio.child_text(obj, "VersionId")))
    if versioning.versioned(ctx) or any(vid is not None for _, vid in asked):
        return await versioning.delete_objects(ctx, asked, quiet)
    keys = [key for key, _ in asked]
    # the bucket policy judges every key (s3:DeleteObject); refused keys are not touched
    refused, groups = access.judge_keys(ctx, "s3:DeleteObject", keys)
    done: dict[str, bool | FsError] = dict(refused)
    try:
        # the namespace deletes a batch without yielding to the event loop (~0.5 ms a
        # key): batches of DELETE_BATCH keep other requests moving during a large request
        for ident, group in groups or [(ctx.ident, [])]:
            for i in range(0, max(len(group), 1), DELETE_BATCH):
                done.update(await ctx.ns.delete_objects(ident, ctx.bucket,
                                                        group[i:i + DELETE_BATCH]))
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    out: list[str] = []
    for key, _ in asked:
        result = done[key]
        if isinstance(result, FsError):
            err = from_fs_error(result, bucket=ctx.bucket, key=key)
            out.append(f"<Error>{el('Key', key)}{el('Code', err.code)}"
                       f"{el('Message', err.message)}</Error>")
        elif not quiet:
            out.append(f"<Deleted>{el('Key', key)}</Deleted>")
    return xml_response(ctx, document("DeleteResult", "".join(out)))


# -- COPY --------------------------------------------------------------------------------

def copied_meta(src: Inode) -> dict[str, str]:
    """Metadata a copy keeps from its source (COPY directive): not the multipart layout or
    composite checksums, which describe the source's parts."""
    meta = {k: v for k, v in src.objmeta.items() if not k.startswith("tierd.")}
    if meta.get(checksums.META_TYPE) == "COMPOSITE":
        meta = {k: v for k, v in meta.items() if not k.startswith(checksums.META_PREFIX)}
    return meta


async def head_source(ctx: Ctx) -> tuple[str, str, Inode]:
    """The copy source of this request, its inode, with the copy-source conditionals
    checked."""
    src_bucket, src_key = parse_copy_source(ctx.headers["x-amz-copy-source"])
    vid = versioning.copy_source_version(ctx.headers["x-amz-copy-source"])
    try:
        if vid is not None:
            src = await ctx.ns.head_version(ctx.src_ident, src_bucket, src_key, vid)
        else:
            src = await ctx.ns.head_object(ctx.src_ident, src_bucket, src_key)
    except versioning.DeleteMarkerHit:
        raise S3Error("InvalidRequest", "The source of a copy request may not specifically "
                      "refer to a delete marker by version id.") from None
    except FsError as e:
        raise await fs_error(ctx, e, src_bucket, src_key) from None
    check_conditions(ctx.headers, src, prefix="x-amz-copy-source-", copy=True)
    if vid is not None:
        ctx.response_headers["x-amz-copy-source-version-id"] = vid
    elif src.is_reg and versioning.versioned(ctx, src_bucket):
        ctx.response_headers["x-amz-copy-source-version-id"] = current_vid(src)
    return src_bucket, src_key, src


async def copy_object(ctx: Ctx) -> web.Response:
    if "x-amz-copy-source-range" in ctx.headers:
        raise S3Error("InvalidArgument", "x-amz-copy-source-range is only valid for "
                      "UploadPartCopy", ArgumentName="x-amz-copy-source-range")
    directive = ctx.headers.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise S3Error("InvalidArgument", "Unknown metadata directive.",
                      ArgumentName="x-amz-metadata-directive", ArgumentValue=directive)
    reject_unsupported_headers(ctx.headers)
    src_bucket, src_key, src = await head_source(ctx)
    if ((src_bucket, src_key) == (ctx.bucket, ctx.key) and directive == "COPY"
            and versioning.copy_source_version(ctx.headers["x-amz-copy-source"]) is None):
        raise S3Error("InvalidRequest", "This copy request is illegal because it is trying to "
                      "copy an object to itself without changing the object's metadata, "
                      "storage class, website redirect location or encryption attributes.")
    if src.is_dir:
        raise S3Error("InvalidRequest", "a directory marker cannot be copied")
    meta = copied_meta(src)
    if directive == "REPLACE":
        keep = {k: v for k, v in meta.items() if k.startswith(checksums.META_PREFIX)}
        meta = objmeta_from_headers(ctx.headers) | keep
    acl = canned_acl(ctx.headers)
    if acl is not None:  # applied by the namespace in the commit (tierd.acl.canned)
        meta[canned.META_KEY] = acl
    meta = tagset.copy_tags(ctx.headers, src.objmeta, meta)  # x-amz-tagging-directive
    try:
        inode = await ctx.ns.copy_object(
            ctx.ident, src_bucket, src_key, ctx.bucket, ctx.key, meta, src_ident=ctx.src_ident,
            src_version=versioning.copy_source_version(ctx.headers["x-amz-copy-source"]))
    except FsError as e:
        raise await fs_error(ctx, e) from None
    versioning.set_version_header(ctx, inode)
    fields = el("LastModified", iso8601(inode.mtime_ns)) + el("ETag", quoted(etag_of(inode)))
    ck = object_checksum(inode)
    if ck is not None:
        fields += el("Checksum" + ck[0].upper(), ck[1])
        ctx.response_headers[checksums.META_PREFIX + ck[0]] = ck[1]
    return xml_response(ctx, document("CopyObjectResult", fields))

