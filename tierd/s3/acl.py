"""GetObjectAcl, PutObjectAcl, GetBucketAcl and PutBucketAcl over POSIX state.

An S3 ACL is never stored as such: a canned ACL becomes mode bits, ACL entries and the
anonymous grant (:mod:`tierd.acl.canned`), and reading an ACL describes that state
(``AllUsers`` for the anonymous grant, or when the bucket policy lets anonymous requests
read), so the answer is the same whether the permissions were set by S3, ``chmod`` or
``setfacl`` on the mount.  PutObjectAcl and PutBucketAcl accept the ``x-amz-acl`` header,
the ``x-amz-grant-*`` headers or an ``AccessControlPolicy`` body; grants become POSIX state
through the table in :mod:`tierd.acl.s3map` (what POSIX cannot hold is refused, never
widened: see docs/permissions.md), within what the bucket's ownership controls and public
access block allow (:mod:`tierd.s3.bucket_controls`).
"""

from __future__ import annotations

import errno

from aiohttp import web

from tierd.acl import canned, s3map
from tierd.acl.keys import canonical_user_id
from tierd.acl.modes import anonymous_bits
from tierd.acl.policy import ANONYMOUS, Decision, Request
from tierd.errors import FsError
from tierd.namespace.api import Inode
from tierd.s3 import bucket_controls, versioning, xmlio
from tierd.s3.body import Body
from tierd.s3.buckets import xml_response
from tierd.s3.common import Ctx
from tierd.s3.errors import S3Error, from_fs_error
from tierd.s3.objects import fs_error
from tierd.s3.xmlio import document, el

_XSI = "http://www.w3.org/2001/XMLSchema-instance"


def _anonymous_read(ctx: Ctx, key: str | None) -> bool:
    """Does the bucket policy let any anonymous request read ``key`` (list the bucket when
    None)?  Judged without request context: conditions on the address do not hold."""
    policy = ctx.state.policies.get(ctx.bucket)
    if policy is None:
        return False
    action = "s3:GetObject" if key is not None else "s3:ListBucket"
    decision, _ = policy.evaluate(Request(ANONYMOUS, action, ctx.bucket, key, {}))
    return decision is Decision.ALLOW


def _grantee(g: canned.Grant, ctx: Ctx) -> str:
    if g.uid is not None:
        o = ctx.owner(g.uid)
        return (f'<Grantee xmlns:xsi="{_XSI}" xsi:type="CanonicalUser">{el("ID", o.id)}'
                f'{el("DisplayName", o.display_name)}</Grantee>')
    return f'<Grantee xmlns:xsi="{_XSI}" xsi:type="Group">{el("URI", g.group)}</Grantee>'


def _policy_document(ctx: Ctx, inode: Inode, anonymous_read: bool) -> web.Response:
    grants = canned.grants(inode.mode, inode.uid, inode.acl_access,
                           anonymous=anonymous_bits(inode), anonymous_read=anonymous_read)
    rows = "".join(f"<Grant>{_grantee(g, ctx)}{el('Permission', g.permission)}</Grant>"
                   for g in grants)
    body = f"{ctx.owner_xml(inode.uid)}<AccessControlList>{rows}</AccessControlList>"
    return xml_response(ctx, document("AccessControlPolicy", body))


async def _stat(ctx: Ctx, key: str) -> Inode:
    """The inode of the key (or of the bucket when ``key`` is empty); search permission on
    the way is all reading an ACL needs, as ``stat`` does."""
    path = f"{ctx.bucket}/{key}".rstrip("/")
    try:
        await ctx.ns.get_bucket(ctx.bucket)
        inode = await ctx.ns.resolve(ctx.ident, path)
    except FsError as e:
        if key:
            raise await fs_error(ctx, e) from None
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    if key and key.endswith("/") != inode.is_dir:
        raise S3Error("NoSuchKey", Key=key)
    return inode


async def get_object_acl(ctx: Ctx) -> web.Response:
    inode = await versioning.acl_version(ctx) or await _stat(ctx, ctx.key)
    return _policy_document(ctx, inode, _anonymous_read(ctx, ctx.key))


async def get_bucket_acl(ctx: Ctx) -> web.Response:
    inode = await _stat(ctx, "")
    return _policy_document(ctx, inode, _anonymous_read(ctx, None))


def _body_pairs(raw: bytes, owner_id: str) -> list[tuple[str, str]]:
    """(grantee, permission) pairs of an ``AccessControlPolicy`` body: grantee a canonical
    id, a group URI or ``emailAddress:<address>``.  Its Owner, when given, must be the
    current owner (an ACL cannot change who owns the inode: that is chown)."""
    doc = xmlio.parse(raw, "AccessControlPolicy")
    owners = xmlio.children(doc, "Owner")
    if owners:
        given = (xmlio.child_text(owners[0], "ID") or "").strip()
        if given and given != owner_id:
            raise S3Error("InvalidArgument", "the Owner of an AccessControlPolicy must be the "
                          "current owner: an ACL cannot change who owns it",
                          ArgumentName="Owner/ID", ArgumentValue=given)
    lists = xmlio.children(doc, "AccessControlList")
    if len(lists) != 1:
        raise S3Error("MalformedACLError", "an AccessControlPolicy needs one "
                      "AccessControlList")
    pairs: list[tuple[str, str]] = []
    for g in xmlio.children(lists[0], "Grant"):
        grantee = xmlio.children(g, "Grantee")
        perm = (xmlio.child_text(g, "Permission") or "").strip()
        if len(grantee) != 1 or perm not in s3map.GRANT_PERMISSIONS:
            raise S3Error("MalformedACLError", "every Grant needs a Grantee and a Permission "
                          "(READ, WRITE, READ_ACP, WRITE_ACP or FULL_CONTROL)")
        email = xmlio.child_text(grantee[0], "EmailAddress")
        who = (xmlio.child_text(grantee[0], "ID") or xmlio.child_text(grantee[0], "URI")
               or (f"emailAddress:{email.strip()}" if email else ""))
        if not who or not who.strip():
            raise S3Error("MalformedACLError", "a Grantee needs an ID, a URI or an "
                          "EmailAddress")
        pairs.append((who.strip(), perm))
    return pairs


async def _requested(ctx: Ctx, inode: Inode, bucket_owner: int) -> tuple[str, bool, bool]:
    """The ACL a PutObjectAcl/PutBucketAcl asks for (``x-amz-acl``, ``x-amz-grant-*`` or an
    AccessControlPolicy body) as the spec the namespace applies, whether it is public and
    whether a bucket with ACLs disabled accepts it."""
    raw = await Body(ctx.request, ctx.verified).read_all(xmlio.MAX_XML_BODY)
    spec, public, accepted = bucket_controls.header_acl(ctx, ctx.headers, inode.uid,
                                                          bucket_owner)
    if spec is not None:
        if raw.strip():
            raise S3Error("InvalidRequest", "give either x-amz-acl (or x-amz-grant-*) or an "
                          "AccessControlPolicy body, not both")
        return spec, public, accepted
    if not raw.strip():
        raise S3Error("MalformedACLError", "give a canned ACL (x-amz-acl), x-amz-grant-* "
                      "headers or an AccessControlPolicy body")
    pairs = _body_pairs(raw, canonical_user_id(inode.uid))
    try:
        grants = s3map.resolve_grants(
            pairs, bucket_controls.uid_resolver(ctx, inode.uid, bucket_owner), inode.uid)
    except s3map.GrantError as e:
        raise S3Error(e.code, str(e)) from None
    return (grants.encode(), grants.public,
            bucket_controls.enforced_ok(grants, (bucket_owner,)))


async def _put(ctx: Ctx, key: str) -> web.Response:
    inode = await _stat(ctx, key)
    try:
        b = await ctx.ns.get_bucket(ctx.bucket)
    except FsError as e:
        raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
    name, public, accepted = await _requested(ctx, inode, b.owner_uid)
    bucket_controls.check_acl_allowed(
        ctx, bucket_controls.ownership(ctx, ctx.bucket), ctx.state.policies.block(ctx.bucket),
        public, accepted)
    try:
        await ctx.ns.set_canned_acl(ctx.ident, ctx.bucket, key, name)
    except FsError as e:
        if e.errno == errno.ENOENT and not key:
            raise from_fs_error(e, missing="NoSuchBucket", bucket=ctx.bucket) from None
        raise await fs_error(ctx, e) from None
    return web.Response(status=200, headers=ctx.response_headers)


async def put_object_acl(ctx: Ctx) -> web.Response:
    await versioning.acl_version(ctx, write=True)  # the current version's, by id too
    return await _put(ctx, ctx.key)


async def put_bucket_acl(ctx: Ctx) -> web.Response:
    return await _put(ctx, "")
