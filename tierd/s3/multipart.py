"""Multipart uploads: Create, UploadPart, UploadPartCopy, Complete, Abort, ListParts,
ListMultipartUploads.

Checksums: CreateMultipartUpload may name an algorithm (``x-amz-checksum-algorithm``, as
boto3 does by default with CRC32) and a type (COMPOSITE, or FULL_OBJECT for the CRCs).  Every
part's checksum is then computed (and verified when the client sent one) and the completed
object carries the COMPOSITE ``checksum-of-checksums-N`` or the FULL_OBJECT CRC combined from
the part CRCs.  Completion also records the part sizes so ``GET ?partNumber=N`` works.

CompleteMultipartUpload as AWS answers it: an ``x-amz-checksum-*`` header there is the
checksum of the whole object (FULL_OBJECT, or COMPOSITE with or without its ``-N``) and is
checked against the one the parts give (BadDigest), never against the XML body; a retry
after a lost response (the upload is gone, the key holds the object it made) answers as
the first call did, and so does one that loses to another Complete running meanwhile;
``If-None-Match: *`` and ``If-Match`` make it conditional like a PUT.  A Complete that runs
long (parts fetched from other nodes of a cluster) answers 200 at once and sends spaces
until its result, as S3 does (setting ``s3_complete_keepalive``).  The bucket owner may list and
abort other users' uploads into its bucket.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
from urllib.parse import quote

from aiohttp import web

from tierd.errors import FsError, Reason
from tierd.namespace.api import Inode, MultipartUpload, UploadPart
from tierd.s3 import checksums, xmlio
from tierd.s3.body import Body
from tierd.s3.buckets import bucket_or_404, xml_response
from tierd.s3.common import (
    MAX_PUT_SIZE,
    META_MPU_ALGORITHM,
    META_MPU_TYPE,
    META_PARTS,
    Ctx,
    encode_layout,
    max_keys,
    object_checksum,
    objmeta_from_headers,
    quoted,
)
from tierd.s3.errors import S3Error, from_fs_error
from tierd.s3.objects import fs_error, head_source, put_conditions, put_error
from tierd.s3.versioning import copy_source_version, set_version_header
from tierd.s3.xmlio import document, el, iso8601
from tierd.tiers.fileio import INLINE_BYTES

MAX_PARTS = 10000
_COPY_ATTEMPTS = 3
#: a Complete still running after ``s3_complete_keepalive`` seconds (S3State) answers 200
#: and the XML declaration, then a space every half that time until its result, as S3
#: does: clients and load balancers drop a connection idle for a minute (boto3, the AWS
#: CLI, nginx, ALB) while a Complete fetches gigabytes of parts from other nodes.  A
#: failure after that is the body, an Error document, which clients read as that error
#: (botocore does for a 200 CompleteMultipartUpload); the x-amz-version-id header cannot
#: follow once started.

log = logging.getLogger("tierd.s3")


def _upload_error(ctx: Ctx, e: FsError) -> S3Error:
    return from_fs_error(e, missing="NoSuchUpload", bucket=ctx.bucket, key=ctx.key)


#: objmeta key of a completed object: the upload it was made by (a retried Complete of
#: that upload is answered from it; dropped with every other content fact when the bytes
#: change: tierd.namespace.contentmeta)
META_UPLOAD = "tierd.s3.upload-id"


async def _upload(ctx: Ctx, *, bucket_owner: bool = False) -> MultipartUpload:
    """The upload named by ``uploadId``; NoSuchUpload unless it is for this bucket/key.
    ``bucket_owner``: the bucket's owner may have it too (list its parts, abort it)."""
    upload_id = ctx.query.get("uploadId", "")
    try:
        up = await ctx.ns.get_upload(ctx.ident, upload_id, bucket_owner=bucket_owner)
    except FsError as e:
        raise _upload_error(ctx, e) from None
    if (up.bucket, up.key) != (ctx.bucket, ctx.key):
        raise S3Error("NoSuchUpload", f"upload {upload_id!r} is not an upload of "
                      f"{ctx.bucket}/{ctx.key}", UploadId=upload_id)
    return up


def _checksum_headers(up: MultipartUpload, h: dict[str, str]) -> None:
    alg = up.objmeta.get(META_MPU_ALGORITHM)
    if alg:
        h["x-amz-checksum-algorithm"] = alg.upper()
        h[checksums.META_TYPE] = up.objmeta.get(META_MPU_TYPE, "COMPOSITE")


async def create(ctx: Ctx) -> web.Response:
    await bucket_or_404(ctx)
    objmeta = objmeta_from_headers(ctx.headers)
    alg_raw = ctx.headers.get("x-amz-checksum-algorithm")
    kind = ctx.headers.get("x-amz-checksum-type", "").upper()
    if kind and kind not in ("COMPOSITE", "FULL_OBJECT"):
        raise S3Error("InvalidRequest", f"Value for x-amz-checksum-type header is invalid: "
                      f"{kind!r}")
    if alg_raw:
        alg = checksums.check_algorithm(alg_raw)
        kind = kind or ("FULL_OBJECT" if alg == "crc64nvme" else "COMPOSITE")
        if kind == "FULL_OBJECT" and alg not in checksums.CRCS:
            raise S3Error("InvalidRequest", f"The FULL_OBJECT checksum type cannot be used "
                          f"with the {alg.upper()} checksum algorithm.")
        if kind == "COMPOSITE" and alg == "crc64nvme":
            raise S3Error("InvalidRequest", "The COMPOSITE checksum type cannot be used with "
                          "the CRC64NVME checksum algorithm.")
        objmeta[META_MPU_ALGORITHM] = alg
        objmeta[META_MPU_TYPE] = kind
    elif kind:
        raise S3Error("InvalidRequest", "x-amz-checksum-type needs x-amz-checksum-algorithm")
    try:
        up = await ctx.ns.create_multipart(ctx.ident, ctx.bucket, ctx.key, objmeta)
    except FsError as e:
        raise await fs_error(ctx, e) from None
    _checksum_headers(up, ctx.response_headers)
    body = el("Bucket", ctx.bucket) + el("Key", ctx.key) + el("UploadId", up.upload_id)
    return xml_response(ctx, document("InitiateMultipartUploadResult", body))


def _part_number(ctx: Ctx) -> int:
    raw = ctx.query.get("partNumber", "")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PARTS:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and "
                      f"{MAX_PARTS}, inclusive", ArgumentName="partNumber", ArgumentValue=raw)
    return n


async def part_target(ctx: Ctx) -> tuple[int, MultipartUpload]:
    """(part number, upload) of an UploadPart: all it checks before reading the body, so
    also what is checked before "100 Continue" is sent (:func:`tierd.s3.app.send_continue`)."""
    return _part_number(ctx), await _upload(ctx)


async def upload_part(ctx: Ctx) -> web.Response:
    number, up = await part_target(ctx)
    alg = up.objmeta.get(META_MPU_ALGORITHM)
    body = Body(ctx.request, ctx.verified, max_size=MAX_PUT_SIZE, checksum_algorithm=alg)
    try:
        # the namespace writes and hashes in one pass, verifies, and only then reads
        # ``body.checksums`` (filled by the verification)
        part = await ctx.ns.upload_part(ctx.ident, up.upload_id, number, body.payload(),
                                        body.checksums)
    except FsError as e:
        raise _upload_error(ctx, e) from None
    h = ctx.response_headers
    h["ETag"] = quoted(part.etag)
    for a, v in part.checksums.items():
        h[checksums.META_PREFIX + a] = v
    return web.Response(status=200, headers=h)


def _update_both(a: checksums.Hasher, b: checksums.Hasher, data: bytes) -> None:
    a.update(data)
    b.update(data)


async def _range_digests(ctx: Ctx, alg: str, bucket: str, key: str, first: int,
                         length: int) -> tuple[str, str]:
    """(checksum ``alg`` base64, MD5 hex) of a source byte range."""
    h = checksums.new_hasher(alg)
    md5 = hashlib.md5()
    reader = await ctx.ns.get_object(ctx.src_ident, bucket, key)
    try:
        async for chunk in reader.iter(first, length):
            if len(chunk) > INLINE_BYTES:
                await asyncio.to_thread(_update_both, h, md5, chunk)
            else:
                _update_both(h, md5, chunk)
    finally:
        await reader.close()
    return checksums.encode(h.digest()), md5.hexdigest()


async def _copy_part(ctx: Ctx, up: MultipartUpload, number: int, src_bucket: str,
                     src_key: str, byte_range: tuple[int, int] | None, first: int,
                     length: int) -> UploadPart:
    """Copy the part; in an upload with a checksum algorithm, with the checksum of the
    copied bytes.  That checksum comes from a separate read of the source, so the MD5 of
    that read must equal the part's ETag (the MD5 of what was copied): if the source
    changed in between, try again."""
    alg = up.objmeta.get(META_MPU_ALGORITHM)
    for _ in range(_COPY_ATTEMPTS):
        sums: dict[str, str] = {}
        md5 = ""
        if alg:
            sums[alg], md5 = await _range_digests(ctx, alg, src_bucket, src_key, first, length)
        part = await ctx.ns.upload_part_copy(ctx.ident, up.upload_id, number, src_bucket,
                                             src_key, byte_range, checksums=sums,
                                             src_ident=ctx.src_ident,
                                             src_version=copy_source_version(
                                                 ctx.headers["x-amz-copy-source"]))
        if not alg or part.etag == md5:
            return part
    raise S3Error("SlowDown", "the copy source kept changing while it was copied; retry")


async def upload_part_copy(ctx: Ctx) -> web.Response:
    number = _part_number(ctx)
    up = await _upload(ctx)
    src_bucket, src_key, src = await head_source(ctx)
    byte_range: tuple[int, int] | None = None
    raw = ctx.headers.get("x-amz-copy-source-range")
    if raw is not None:
        unit, _, spec = raw.strip().partition("=")
        first_s, _, last_s = spec.partition("-")
        try:
            if unit != "bytes":
                raise ValueError(unit)
            byte_range = (int(first_s), int(last_s))
        except ValueError:
            raise S3Error("InvalidArgument", "The x-amz-copy-source-range value must be of "
                          "the form bytes=first-last where first and last are the zero-based "
                          "offsets of the first and last bytes to copy",
                          ArgumentName="x-amz-copy-source-range", ArgumentValue=raw) from None
        if byte_range[1] >= src.size or byte_range[0] > byte_range[1]:
            raise S3Error("InvalidRange", f"Range specified is not valid for source object of "
                          f"size: {src.size}", ActualObjectSize=str(src.size))
    first, last = byte_range or (0, src.size - 1)
    if last - first + 1 > MAX_PUT_SIZE:
        raise S3Error("EntityTooLarge", "a copied part may be at most 5 GiB")
    try:
        part = await _copy_part(ctx, up, number, src_bucket, src_key, byte_range, first,
                                max(0, last - first + 1))
    except FsError as e:
        if e.errno == errno.ENOENT and not e.reason:
            raise await fs_error(ctx, e, src_bucket, src_key) from None
        raise _upload_error(ctx, e) from None
    fields = el("LastModified", iso8601(part.mtime_ns)) + el("ETag", quoted(part.etag))
    for a, v in part.checksums.items():
        fields += el("Checksum" + a.upper(), v)
    return xml_response(ctx, document("CopyPartResult", fields))


def _parse_complete(raw: bytes) -> list[tuple[int, str, dict[str, str]]]:
    doc = xmlio.parse(raw, "CompleteMultipartUpload")
    parts: list[tuple[int, str, dict[str, str]]] = []
    for p in xmlio.children(doc, "Part"):
        num = xmlio.child_text(p, "PartNumber")
        etag = xmlio.child_text(p, "ETag")
        if num is None or etag is None:
            raise S3Error("MalformedXML", "every <Part> needs <PartNumber> and <ETag>")
        try:
            n = int(num)
        except ValueError:
            raise S3Error("MalformedXML", f"PartNumber {num!r} is not a number") from None
        sums = {}
        for a in checksums.ALGORITHMS:
            v = xmlio.child_text(p, "Checksum" + a.upper())
            if v is not None:
                sums[a] = v.strip()
        parts.append((n, etag.strip(), sums))
    if not parts:
        raise S3Error("MalformedXML", "The XML you provided did not list any part")
    if len(parts) > MAX_PARTS:
        raise S3Error("MalformedXML", f"at most {MAX_PARTS} parts")
    return parts


async def _completed_before(ctx: Ctx) -> Inode | None:
    """The object this upload made, when a Complete of it already succeeded (the client
    lost the answer and asks again): the key still holds that object."""
    upload_id = ctx.query.get("uploadId", "")
    try:
        inode = await ctx.ns.head_object(ctx.ident, ctx.bucket, ctx.key)
    except FsError:
        return None
    return inode if upload_id and inode.objmeta.get(META_UPLOAD) == upload_id else None


def _complete_answer(ctx: Ctx, inode: Inode) -> web.Response:
    return xml_response(ctx, _complete_document(ctx, inode))


def _complete_document(ctx: Ctx, inode: Inode) -> str:
    host = ctx.request.host
    body = (el("Location", f"http://{host}/{ctx.bucket}/{ctx.key}") + el("Bucket", ctx.bucket)
            + el("Key", ctx.key) + el("ETag", quoted(inode.etag)))
    ck = object_checksum(inode)
    if ck is not None:
        body += el("Checksum" + ck[0].upper(), ck[1])
        body += el("ChecksumType", inode.objmeta.get(checksums.META_TYPE, "FULL_OBJECT"))
    return document("CompleteMultipartUploadResult", body)


def _check_object_checksum(ctx: Ctx, alg: str | None, kind: str, value: str | None,
                           count: int) -> None:
    """The ``x-amz-checksum-*`` header of a Complete names the whole object's checksum:
    it must be the upload's algorithm and type and equal what the parts give (a
    COMPOSITE value may leave out its ``-N``); BadDigest when it differs."""
    h = ctx.headers
    given = [(a, h[checksums.META_PREFIX + a].strip()) for a in checksums.ALGORITHMS
             if checksums.META_PREFIX + a in h]
    want_type = h.get(checksums.META_TYPE, "").strip().upper()
    if want_type and want_type != (kind if alg else ""):
        raise S3Error("InvalidRequest", f"the upload's checksum type is {kind if alg else 'none'}"
                      f", not {want_type}")
    if len(given) > 1:
        raise S3Error("InvalidRequest", "Expecting a single x-amz-checksum- header. "
                      "Multiple checksum Types are not allowed.")
    if not given:
        return
    a, v = given[0]
    if alg is None or value is None:
        raise S3Error("InvalidRequest", "the upload was created without a checksum "
                      "algorithm: its Complete cannot give the object's checksum")
    if a != alg:
        raise S3Error("InvalidRequest", f"the upload was created with the {alg.upper()} "
                      f"checksum algorithm: its Complete may give only the object's "
                      f"{alg.upper()} checksum")
    base, dash, n = v.partition("-")
    if kind == "COMPOSITE":
        if dash and n != str(count):
            raise S3Error("BadDigest", f"the {a.upper()} given is for {n} parts, the upload "
                          f"completes {count}")
        ok = base == value.partition("-")[0]
    else:
        ok = v == value
    if not ok:
        raise S3Error("BadDigest", f"The {a.upper()} you specified did not match the "
                      "calculated checksum.")


async def complete(ctx: Ctx) -> web.StreamResponse:
    try:
        up = await _upload(ctx)
    except S3Error as e:
        done = await _completed_before(ctx) if e.code == "NoSuchUpload" else None
        if done is None:
            raise
        return _complete_answer(ctx, done)  # a retry: the same answer as the first time
    if_match, if_none = put_conditions(ctx)
    raw = await Body(ctx.request, ctx.verified, checksum_headers=False).read_all(
        xmlio.MAX_XML_BODY)
    listed = _parse_complete(raw)
    _, stored_list, _ = await ctx.ns.list_parts(ctx.ident, up.upload_id, 0, MAX_PARTS)
    stored = {p.number: p for p in stored_list}
    alg = up.objmeta.get(META_MPU_ALGORITHM)
    kind = up.objmeta.get(META_MPU_TYPE, "COMPOSITE")
    sizes: list[int] = []
    values: list[str] = []
    for n, etag, sums in listed:
        p = stored.get(n)
        if p is None or p.etag != etag.strip('"').lower():
            continue  # the namespace reports InvalidPart / InvalidPartOrder
        for a, v in sums.items():
            if p.checksums.get(a) != v:
                raise S3Error("InvalidPart", f"part {n}: the {a.upper()} checksum given does "
                              "not match the part's", PartNumber=str(n))
        sizes.append(p.size)
        if alg:
            values.append(p.checksums.get(alg, ""))
    extra: dict[str, str] = {META_UPLOAD: up.upload_id}
    value: str | None = None
    if len(sizes) == len(listed):
        extra[META_PARTS] = encode_layout(sizes)
        if alg and all(values):
            if kind == "FULL_OBJECT":
                value = checksums.combine_full(alg, list(zip(values, sizes, strict=True)))
            else:
                value = checksums.composite(alg, values)
            extra[checksums.META_PREFIX + alg] = value
            extra[checksums.META_TYPE] = kind
        _check_object_checksum(ctx, alg, kind, value, len(listed))
        declared = ctx.headers.get("x-amz-mp-object-size")
        if declared is not None and declared.strip() != str(sum(sizes)):
            raise S3Error("InvalidRequest", f"x-amz-mp-object-size is {declared.strip()}; the "
                          f"parts listed hold {sum(sizes)} bytes")
    async def commit() -> Inode:
        try:
            return await ctx.ns.complete_multipart(
                ctx.ident, up.upload_id, [(n, e) for n, e, _ in listed], objmeta=extra,
                if_match=if_match, if_none_match=if_none)
        except FsError as e:
            # another Complete of it won meanwhile (a client's retry, maybe through another
            # node behind a load balancer): the same answer as that one got
            done = await _completed_before(ctx) if e.reason is Reason.NO_SUCH_UPLOAD else None
            if done is None:
                raise await put_error(ctx, e) from None
            return done

    task = asyncio.ensure_future(commit())  # (it finishes even if the client leaves)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    if not (await asyncio.wait([task], timeout=ctx.state.complete_keepalive))[0]:
        return await _kept_alive(ctx, task)
    inode = task.result()
    set_version_header(ctx, inode)
    return _complete_answer(ctx, inode)


async def _kept_alive(ctx: Ctx, task: asyncio.Future[Inode]) -> web.StreamResponse:
    """A long Complete's answer (``s3_complete_keepalive``): 200 and the XML declaration
    now, a space every half that time, then the result or the Error document.
    A client that leaves meanwhile ends this answer, not the Complete."""
    stream = web.StreamResponse(status=200, headers=ctx.response_headers)
    stream.content_type = "application/xml"
    ctx.stream = stream
    await stream.prepare(ctx.request)
    await stream.write(xmlio.HEADER.encode())
    while not task.done():
        await asyncio.wait([task], timeout=ctx.state.complete_keepalive / 2)
        if not task.done():
            await stream.write(b" ")
    try:
        body = _complete_document(ctx, task.result())
    except S3Error as e:
        log.warning("%s %s after its answer started: %s", ctx.request.method,
                    ctx.request.rel_url.path, e)
        body = xmlio.error_document(e.code, e.message, ctx.request.rel_url.path,
                                    ctx.request_id, e.fields)
    await stream.write(body.removeprefix(xmlio.HEADER).encode())
    await stream.write_eof()
    return stream


async def abort(ctx: Ctx) -> web.Response:
    up = await _upload(ctx, bucket_owner=True)
    try:
        await ctx.ns.abort_multipart(ctx.ident, up.upload_id)
    except FsError as e:
        raise _upload_error(ctx, e) from None
    return web.Response(status=204, headers=ctx.response_headers)


async def list_parts(ctx: Ctx) -> web.Response:
    up = await _upload(ctx, bucket_owner=True)
    limit = max_keys(ctx, "max-parts")
    marker_raw = ctx.query.get("part-number-marker", "0") or "0"
    try:
        marker = int(marker_raw)
    except ValueError:
        raise S3Error("InvalidArgument", "part-number-marker must be an integer",
                      ArgumentName="part-number-marker", ArgumentValue=marker_raw) from None
    try:
        _, parts, truncated = await ctx.ns.list_parts(ctx.ident, up.upload_id, marker, limit)
    except FsError as e:
        raise _upload_error(ctx, e) from None
    body = (el("Bucket", ctx.bucket) + el("Key", ctx.key) + el("UploadId", up.upload_id)
            + ctx.owner_xml(up.uid, "Initiator") + ctx.owner_xml(up.uid)
            + el("StorageClass", "STANDARD") + el("PartNumberMarker", marker))
    if parts:
        body += el("NextPartNumberMarker", parts[-1].number)
    body += el("MaxParts", limit) + el("IsTruncated", "true" if truncated else "false")
    alg = up.objmeta.get(META_MPU_ALGORITHM)
    if alg:
        body += el("ChecksumAlgorithm", alg.upper())
        body += el("ChecksumType", up.objmeta.get(META_MPU_TYPE, "COMPOSITE"))
    for p in parts:
        row = (el("PartNumber", p.number) + el("LastModified", iso8601(p.mtime_ns))
               + el("ETag", quoted(p.etag)) + el("Size", p.size))
        for a, v in p.checksums.items():
            row += el("Checksum" + a.upper(), v)
        body += f"<Part>{row}</Part>"
    return xml_response(ctx, document("ListPartsResult", body))


async def list_uploads(ctx: Ctx) -> web.Response:
    q = ctx.query
    prefix = q.get("prefix", "")
    delimiter = q.get("delimiter", "")
    key_marker = q.get("key-marker", "")
    id_marker = q.get("upload-id-marker", "") if key_marker else ""
    limit = max_keys(ctx, "max-uploads")
    url = q.get("encoding-type", "").lower() == "url"
    await bucket_or_404(ctx)
    try:
        ups, truncated = await ctx.ns.list_multipart_uploads(
            ctx.ident, ctx.bucket, prefix, key_marker, id_marker,
            MAX_PARTS if delimiter else limit)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    owner = (await ctx.ns.get_bucket(ctx.bucket)).owner_uid  # sees every upload into it
    ups = [u for u in ups if ctx.ident.is_root or (ctx.ident.uid in (u.uid, owner)
                                                   and not ctx.ident.anonymous)]
    rows: list[str] = []
    prefixes: list[str] = []
    count = 0
    next_key = next_id = ""
    for u in ups:
        if count >= limit:
            truncated = True
            break
        if delimiter:
            i = u.key.find(delimiter, len(prefix))
            if i >= 0:
                cp = u.key[: i + len(delimiter)]
                if prefixes and prefixes[-1] == cp:
                    continue
                prefixes.append(cp)
                count += 1
                next_key, next_id = cp, ""
                continue
        rows.append(
            "<Upload>" + el("Key", _url(url, u.key)) + el("UploadId", u.upload_id)
            + ctx.owner_xml(u.uid, "Initiator") + ctx.owner_xml(u.uid)
            + el("StorageClass", "STANDARD") + el("Initiated", iso8601(u.initiated_ns))
            + "</Upload>")
        count += 1
        next_key, next_id = u.key, u.upload_id
    body = (el("Bucket", ctx.bucket) + el("KeyMarker", _url(url, key_marker))
            + el("UploadIdMarker", id_marker))
    if truncated:
        body += el("NextKeyMarker", _url(url, next_key)) + el("NextUploadIdMarker", next_id)
    if delimiter:
        body += el("Delimiter", _url(url, delimiter))
    body += el("Prefix", _url(url, prefix)) + el("MaxUploads", limit)
    body += el("IsTruncated", "true" if truncated else "false")
    if url:
        body += el("EncodingType", "url")
    body += "".join(rows)
    body += "".join(f"<CommonPrefixes>{el('Prefix', _url(url, p))}</CommonPrefixes>"
                    for p in prefixes)
    return xml_response(ctx, document("ListMultipartUploadsResult", body))


def _url(url: bool, value: str) -> str:
    return quote(value, safe="/") if url else value
