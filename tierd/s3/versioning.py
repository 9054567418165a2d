"""Bucket versioning at the S3 door: Get/PutBucketVersioning, ListObjectVersions, and the
version parts of the object calls (``versionId``, ``x-amz-version-id``,
``x-amz-delete-marker``).  The semantics live in :mod:`tierd.namespace.versionops`."""

from __future__ import annotations

import errno
from urllib.parse import unquote

from aiohttp import web

from tierd.acl import Identity
from tierd.errors import FsError, Reason
from tierd.namespace.api import (
    ENABLED,
    SUSPENDED,
    VERSIONING_CONFIG,
    Deleted,
    DeleteMarkerHit,
    Inode,
    VersionListing,
    current_vid,
    valid_vid,
)
from tierd.s3 import xmlio
from tierd.s3.body import Body
from tierd.s3.buckets import bucket_or_404, xml_response
from tierd.s3.common import Ctx, etag_of, http_date, max_keys, quoted
from tierd.s3.errors import S3Error, from_fs_error
from tierd.s3.listing import _common, _enc
from tierd.s3.xmlio import document, el, iso8601

__all__ = ["DeleteMarkerHit"]


# -- version ids -------------------------------------------------------------------------

def invalid_vid(value: str, name: str = "versionId") -> S3Error:
    return S3Error("InvalidArgument", "Invalid version id specified", ArgumentName=name,
                   ArgumentValue=value)


def version_param(ctx: Ctx) -> str | None:
    """The request's ``versionId`` (None when absent); InvalidArgument when malformed."""
    vid = ctx.query.get("versionId")
    if vid is not None and not valid_vid(vid):
        raise invalid_vid(vid)
    return vid


def copy_source_version(value: str) -> str | None:
    """The ``versionId`` of an ``x-amz-copy-source`` header (None when absent)."""
    _, _, query = value.strip().partition("?")
    if not query:
        return None
    name, _, vid = query.partition("=")
    vid = unquote(vid)
    if name != "versionId" or not valid_vid(vid):
        raise invalid_vid(vid, "x-amz-copy-source")
    return vid


def versioned(ctx: Ctx, bucket: str | None = None) -> bool:
    """Whether the bucket has ever had versioning enabled (it then answers version ids);
    the request's own bucket from the record its authorization read (no transaction)."""
    if ctx.bucket_read and (bucket is None or bucket == ctx.bucket):
        b = ctx.bucket_record
        return b is not None and bool(b.config.get(VERSIONING_CONFIG, ""))
    try:
        return bool(ctx.ns.versioning(bucket or ctx.bucket))
    except FsError:
        return False


def set_version_header(ctx: Ctx, inode: Inode, bucket: str | None = None) -> None:
    """``x-amz-version-id`` of a current object, in a bucket that is or was versioned."""
    if inode.is_reg and versioned(ctx, bucket):
        ctx.response_headers["x-amz-version-id"] = current_vid(inode)


def marker_error(ctx: Ctx, e: DeleteMarkerHit) -> S3Error:
    """404 NoSuchKey (the latest version is a marker) or 405 (a marker asked for by id),
    both with ``x-amz-delete-marker: true`` as S3 answers."""
    headers = {"x-amz-delete-marker": "true", "x-amz-version-id": e.marker.vid,
               "Last-Modified": http_date(e.marker.mtime_ns)}
    if e.reason is Reason.METHOD_NOT_ALLOWED:
        return S3Error("MethodNotAllowed", "The specified method is not allowed against "
                       "this resource.", Method=ctx.request.method, ResourceType="DeleteMarker",
                       headers=headers)
    return S3Error("NoSuchKey", Key=ctx.key, headers=headers)


def missing_error(ctx: Ctx, e: FsError) -> S3Error | None:
    """A GET/HEAD that found no current object: when the latest version is a delete
    marker, the NoSuchKey that says so; else None."""
    if e.errno != errno.ENOENT or e.reason:
        return None
    try:
        marker = ctx.ns.latest_marker(ctx.bucket, ctx.key)
    except FsError:
        return None
    return marker_error(ctx, DeleteMarkerHit(marker, latest=True)) if marker else None


# -- bucket state ------------------------------------------------------------------------

async def get_versioning(ctx: Ctx) -> web.Response:
    await bucket_or_404(ctx)
    status = ctx.ns.versioning(ctx.bucket)
    body = el("Status", status) if status else ""
    return xml_response(ctx, document("VersioningConfiguration", body))


async def put_versioning(ctx: Ctx) -> web.Response:
    await bucket_or_404(ctx)
    raw = await Body(ctx.request, ctx.verified).read_all(xmlio.MAX_XML_BODY)
    doc = xmlio.parse(raw, "VersioningConfiguration")
    status = (xmlio.child_text(doc, "Status") or "").strip()
    mfa = (xmlio.child_text(doc, "MfaDelete") or "").strip()
    if mfa not in ("", "Disabled"):
        if mfa != "Enabled":
            raise S3Error("MalformedXML", f"MfaDelete must be Enabled or Disabled, not {mfa!r}")
        raise S3Error("InvalidRequest", "MFA delete is not supported by tierd: it has no MFA "
                      "devices to check a token against")
    if status == "":
        return web.Response(status=200, headers=ctx.response_headers)  # nothing to change
    if status not in (ENABLED, SUSPENDED):
        raise S3Error("MalformedXML", f"Status must be Enabled or Suspended, not {status!r}")
    try:
        await ctx.ns.set_versioning(ctx.bucket, status)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    return web.Response(status=200, headers=ctx.response_headers)


# -- ListObjectVersions ------------------------------------------------------------------

async def list_object_versions(ctx: Ctx) -> web.Response:
    q = ctx.query
    prefix, delimiter, url, enc = _common(ctx)
    key_marker = q.get("key-marker", "")
    vid_marker = q.get("version-id-marker")
    if vid_marker is not None and not key_marker:
        raise S3Error("InvalidArgument", "A version-id marker cannot be specified without a "
                      "key marker.", ArgumentName="version-id-marker",
                      ArgumentValue=vid_marker)
    if vid_marker and not valid_vid(vid_marker):
        raise invalid_vid(vid_marker, "version-id-marker")
    limit = max_keys(ctx)
    try:
        page = await ctx.ns.list_versions(ctx.ident, ctx.bucket, prefix, key_marker,
                                          vid_marker or "", delimiter, limit)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    head = (el("Name", ctx.bucket) + el("Prefix", _enc(url, prefix))
            + el("KeyMarker", _enc(url, key_marker)) + el("VersionIdMarker", vid_marker or ""))
    if page.truncated:
        head += el("NextKeyMarker", _enc(url, page.next_key))
        if page.next_vid:
            head += el("NextVersionIdMarker", page.next_vid)
    head += el("MaxKeys", limit)
    if delimiter:
        head += el("Delimiter", _enc(url, delimiter))
    head += el("IsTruncated", "true" if page.truncated else "false")
    if enc:
        head += el("EncodingType", enc)
    return xml_response(ctx, document("ListVersionsResult", head + _rows(ctx, page, url)))


def _rows(ctx: Ctx, page: VersionListing, url: bool) -> str:
    out: list[str] = []
    owners: dict[int, str] = {}
    for e in page.entries:
        owner = owners.get(e.uid)
        if owner is None:
            owner = owners[e.uid] = ctx.owner_xml(e.uid)
        row = (el("Key", _enc(url, e.key)) + el("VersionId", e.vid)
               + el("IsLatest", "true" if e.is_latest else "false")
               + el("LastModified", iso8601(e.mtime_ns)))
        if e.inode is None:
            out.append(f"<DeleteMarker>{row}{owner}</DeleteMarker>")
            continue
        row += el("ETag", quoted(etag_of(e.inode))) + el("Size", e.inode.size)
        out.append(f"<Version>{row}{el('StorageClass', 'STANDARD')}{owner}</Version>")
    for p in page.prefixes:
        out.append(f"<CommonPrefixes>{el('Prefix', _enc(url, p))}</CommonPrefixes>")
    return "".join(out)


# -- DeleteObjects -----------------------------------------------------------------------

async def delete_objects(ctx: Ctx, asked: list[tuple[str, str | None]],
                         quiet: bool) -> web.Response:
    """DeleteObjects on a versioned bucket, or naming versions: per key a delete marker
    (no ``VersionId``) or the permanent delete of that version."""
    from tierd.s3 import access

    bad = {i for i, (_, vid) in enumerate(asked) if vid is not None
           and not valid_vid(vid)}
    # the bucket policy judges every key: s3:DeleteObjectVersion where a version is named
    refused: dict[tuple[str, bool], FsError] = {}
    ident_of: dict[tuple[str, bool], Identity] = {}
    for named in (False, True):
        keys = list(dict.fromkeys(k for k, v in asked if (v is not None) == named))
        action = access.version_action("s3:DeleteObject", "" if named else None)
        no, groups = access.judge_keys(ctx, action, keys) if keys else ({}, [])
        refused.update({(k, named): e for k, e in no.items()})
        ident_of.update({(k, named): ident for ident, group in groups for k in group})

    def who(n: int) -> tuple[str, bool]:
        return asked[n][0], asked[n][1] is not None

    results: dict[int, Deleted | FsError] = {}
    todo = [i for i in range(len(asked)) if i not in bad and who(i) in ident_of]
    try:
        for i in range(0, len(todo), 100):
            by_ident: dict[int, list[int]] = {}
            for n in todo[i:i + 100]:
                by_ident.setdefault(id(ident_of[who(n)]), []).append(n)
            for ns in by_ident.values():
                got = await ctx.ns.delete_versions(ident_of[who(ns[0])], ctx.bucket,
                                                   [asked[n] for n in ns])
                results.update(zip(ns, got, strict=True))
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    out: list[str] = []
    for i, (key, vid) in enumerate(asked):
        head = el("Key", key) + (el("VersionId", vid) if vid is not None else "")
        res: Deleted | FsError | S3Error
        res = S3Error("NoSuchVersion", "The specified version does not exist.") \
            if i in bad else results.get(i) or from_fs_error(
            refused.get(who(i)) or FsError(errno.EACCES, "refused"), bucket=ctx.bucket,
            key=key)
        if isinstance(res, FsError):
            res = from_fs_error(res, bucket=ctx.bucket, key=key)
        if isinstance(res, S3Error):
            out.append(f"<Error>{head}{el('Code', res.code)}{el('Message', res.message)}"
                       "</Error>")
        elif not quiet:
            if res.marker:
                head += el("DeleteMarker", "true") + el("DeleteMarkerVersionId", res.vid)
            out.append(f"<Deleted>{head}</Deleted>")
    return xml_response(ctx, document("DeleteResult", "".join(out)))


# -- object ACLs by version --------------------------------------------------------------

async def acl_version(ctx: Ctx, write: bool = False) -> Inode | None:
    """GetObjectAcl / PutObjectAcl with ``versionId``: the version's inode (None without a
    version id: the handler reads the current one).  An ACL is written on the current
    version only (``NotImplemented`` for an older one, whose inode no name reaches)."""
    vid = version_param(ctx)
    if vid is None:
        return None
    try:
        inode = await ctx.ns.head_version(ctx.ident, ctx.bucket, ctx.key, vid)
        if write and not (inode.is_reg and vid == _current_vid(ctx)):
            raise S3Error("NotImplemented", "tierd changes the ACL of the current version "
                          "only; this version is noncurrent")
    except DeleteMarkerHit as e:
        raise marker_error(ctx, e) from None
    except FsError as e:
        from tierd.s3.objects import fs_error

        raise await fs_error(ctx, e) from None
    return inode


def _current_vid(ctx: Ctx) -> str | None:
    try:
        cur = ctx.ns.current_version(ctx.ident, ctx.bucket, ctx.key)
    except FsError:
        return None
    return current_vid(cur) if cur is not None and cur.is_reg else None
