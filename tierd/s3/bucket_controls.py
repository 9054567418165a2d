"""PublicAccessBlock and BucketOwnershipControls (Get/Put/Delete), and the ACL a write
carries once they and the grant headers are applied.

Both settings are bucket configuration documents (:mod:`tierd.namespace.bucketconf`):
``publicAccessBlock`` is the JSON of :class:`tierd.acl.authorize.PublicAccessBlock`, which
the one decision function reads (its Ignore/Restrict flags reach every decision through
:class:`tierd.acl.authorize.GuardedPolicy`); ``ownershipControls`` is the rule's name.
Like the bucket policy they are the bucket owner's (or root's, or an admin user's), and
anyone's whom the policy allows the action.

Before an object write or CreateBucket runs, :func:`prepare_acl` works out the ACL it
applies in its commit (:data:`tierd.s3.common.REQUEST_ACL`): ``x-amz-acl`` or the
``x-amz-grant-*`` headers (resolved through :mod:`tierd.acl.s3map`), refused when the
bucket blocks public ACLs (403 AccessDenied) or has ACLs disabled (400
AccessControlListNotSupported), and prefixed with
:data:`~tierd.acl.s3map.TO_BUCKET_OWNER` where the ownership rule gives the object to the
bucket's owner: always under ``BucketOwnerEnforced``, for ``bucket-owner-full-control``
under ``BucketOwnerPreferred``.  All of this is decided before the body is read.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable

from aiohttp import web
from multidict import CIMultiDictProxy

from tierd.acl import s3map
from tierd.acl.authorize import PAB_CONFIG, PublicAccessBlock
from tierd.acl.keys import canonical_user_id
from tierd.errors import FsError
from tierd.namespace.api import Bucket
from tierd.s3 import bucketdoc, xmlio
from tierd.s3.body import Body
from tierd.s3.bucket_policy import bucket_record, may_manage
from tierd.s3.buckets import xml_response
from tierd.s3.common import REQUEST_ACL, Ctx, bucket_doc, header_canned_acl
from tierd.s3.errors import S3Error
from tierd.s3.xmlio import document, el

OWNERSHIP_CONFIG = "ownershipControls"
OWNERSHIP_RULES = ("BucketOwnerEnforced", "BucketOwnerPreferred", "ObjectWriter")
#: canned ACLs that a bucket with ACLs disabled (BucketOwnerEnforced) still accepts
_ENFORCED_OK = ("private", "bucket-owner-full-control")
_PUBLIC_CANNED = ("public-read", "public-read-write", "authenticated-read")


# -- who a canonical id is ------------------------------------------------------------------

def uid_resolver(ctx: Ctx, *also: int) -> Callable[[str], int | None]:
    """Canonical id -> uid for the users this server knows: root, every user and every
    access key's user, and ``also`` (an inode's and a bucket's owners, who may have no
    key)."""
    uids = {0, *also}
    with ctx.state.keys.meta.snapshot() as tx:
        uids.update(u.uid for u in tx.list_users())
        uids.update(k.uid for k in tx.list_access_keys())
    table = {canonical_user_id(u): u for u in uids}
    return table.get


# -- the ACL of a request -------------------------------------------------------------------

def ownership(ctx: Ctx, bucket: str) -> str:
    """The bucket's ObjectOwnership rule ("" without one: ObjectWriter)."""
    try:
        return bucket_doc(ctx, OWNERSHIP_CONFIG, bucket) or ""
    except FsError:
        return ""


def header_acl(ctx: Ctx, h: CIMultiDictProxy[str], owner: int, *also: int
               ) -> tuple[str | None, bool, bool]:
    """(the ACL spec of the ``x-amz-acl`` or ``x-amz-grant-*`` headers ``h`` or None,
    whether it is public, whether a bucket with ACLs disabled accepts it) for an inode
    that ``owner`` will own; ``also``: other uids a grant may name.  S3 errors for
    malformed or unresolvable grants."""
    grant_headers = [(k, v) for k, v in h.items() if k.lower().startswith("x-amz-grant-")]
    canned = h.get("x-amz-acl")
    if canned is not None and grant_headers:
        raise S3Error("InvalidRequest", "Specifying both Canned ACLs and Header Grants is not "
                      "allowed")
    if canned is not None:
        name = header_canned_acl(h)
        assert name is not None
        return name, name in _PUBLIC_CANNED, name in _ENFORCED_OK
    if not grant_headers:
        return None, False, True
    try:
        pairs = s3map.grant_header_pairs(grant_headers)
        grants = s3map.resolve_grants(pairs, uid_resolver(ctx, owner, *also), owner)
    except s3map.GrantError as e:
        raise S3Error(e.code, str(e)) from None
    return grants.encode(), grants.public, enforced_ok(grants, also)


def enforced_ok(grants: s3map.GrantSet, bucket_owner: tuple[int, ...]) -> bool:
    """Whether a grant list amounts to ``private`` or ``bucket-owner-full-control`` (what
    a bucket with ACLs disabled accepts)."""
    return not grants.public and all(u in bucket_owner for u, _ in grants.users)


def check_acl_allowed(ctx: Ctx, rule: str, block: PublicAccessBlock, public: bool,
                      accepted: bool) -> None:
    """Refuse an ACL the bucket's settings forbid: ACLs disabled (BucketOwnerEnforced, 400
    AccessControlListNotSupported) or public ACLs blocked (BlockPublicAcls, 403)."""
    if rule == "BucketOwnerEnforced" and not accepted:
        raise S3Error("AccessControlListNotSupported", f"bucket {ctx.bucket!r} has ACLs "
                      "disabled (ObjectOwnership BucketOwnerEnforced): only private and "
                      "bucket-owner-full-control are accepted")
    if block.block_public_acls and public:
        raise S3Error("AccessDenied", f"bucket {ctx.bucket!r} blocks public ACLs "
                      "(PublicAccessBlock BlockPublicAcls)")


def ownership_header(ctx: Ctx) -> None:
    """CreateBucket's ``x-amz-object-ownership``: ``ObjectWriter`` is what a new bucket
    has anyway; the other rules are set with PutBucketOwnershipControls once the bucket
    exists (NotImplemented rather than a bucket that silently lacks the rule)."""
    value = ctx.headers.get("x-amz-object-ownership")
    if value is None or value.strip() == "ObjectWriter":
        return
    if value.strip() not in OWNERSHIP_RULES:
        raise S3Error("InvalidArgument", f"x-amz-object-ownership must be one of "
                      f"{', '.join(OWNERSHIP_RULES)}", ArgumentName="x-amz-object-ownership",
                      ArgumentValue=value)
    raise S3Error("NotImplemented", "x-amz-object-ownership on CreateBucket: create the "
                  "bucket, then set the rule with PutBucketOwnershipControls")


def write_acl(ctx: Ctx, h: CIMultiDictProxy[str]) -> str | None:
    """The ACL spec an object write into ``ctx.bucket`` with headers ``h`` applies in its
    commit: the headers' ACL, refused where the bucket's settings forbid it, and given to
    the bucket's owner where its ownership rule says so."""
    with ctx.state.policies.meta.snapshot() as tx:
        rec = tx.get_bucket(ctx.bucket)
    if rec is None:  # the handler answers NoSuchBucket
        return header_acl(ctx, h, ctx.ident.uid)[0]
    rule = rec.config.get(OWNERSHIP_CONFIG, "")
    to_bucket_owner = rule == "BucketOwnerEnforced"
    owner = rec.owner_uid if to_bucket_owner else ctx.ident.uid
    spec, public, accepted = header_acl(ctx, h, owner, rec.owner_uid)
    block_text = rec.config.get(PAB_CONFIG)  # the record already read: no second read
    block = PublicAccessBlock.from_text(block_text) if block_text else PublicAccessBlock()
    check_acl_allowed(ctx, rule, block, public, accepted)
    if rule == "BucketOwnerPreferred" and spec == "bucket-owner-full-control":
        to_bucket_owner = True
    if to_bucket_owner:
        spec = s3map.TO_BUCKET_OWNER + (spec or "")
    return spec


def prepare_acl(ctx: Ctx, action: str | None, form: bool = False) -> None:
    """Set :data:`~tierd.s3.common.REQUEST_ACL` for this request: for an object write
    (``s3:PutObject``, or a browser ``form`` upload, whose ACL is a form field) and
    CreateBucket the function that works out the ACL of the headers it is given (the
    request's are checked here, before any body is read); None for every other request.
    The answer is kept per headers object: a handler asks for it more than once."""
    if action == "s3:CreateBucket":
        ownership_header(ctx)
        spec = header_acl(ctx, ctx.headers, ctx.ident.uid)[0]
        REQUEST_ACL.set(lambda h: spec if h is ctx.headers
                        else header_acl(ctx, h, ctx.ident.uid)[0])
        return
    if not ctx.bucket or not (form or action == "s3:PutObject"):
        REQUEST_ACL.set(None)
        return
    answers: dict[int, tuple[CIMultiDictProxy[str], str | None]] = {}

    def resolve(h: CIMultiDictProxy[str]) -> str | None:
        got = answers.get(id(h))
        if got is None or got[0] is not h:
            got = answers[id(h)] = (h, write_acl(ctx, h))
        return got[1]

    if not form:
        resolve(ctx.headers)
    REQUEST_ACL.set(resolve)


# -- PublicAccessBlock ----------------------------------------------------------------------

async def _config(ctx: Ctx, b: Bucket, name: str, action: str) -> str | None:
    """The document ``name`` once the caller may call ``action`` (these handlers judge
    themselves: :func:`~tierd.s3.bucket_policy.may_manage`)."""
    may_manage(ctx, b, action)
    return bucketdoc.read(ctx, name)


async def _body(ctx: Ctx, root: str) -> ET.Element:
    raw = await Body(ctx.request, ctx.verified).read_all(xmlio.SMALL_BODY)
    return xmlio.parse(raw, root)


async def get_public_access_block(ctx: Ctx) -> web.Response:
    b = await bucket_record(ctx)
    text = await _config(ctx, b, PAB_CONFIG, "s3:GetBucketPublicAccessBlock")
    if text is None:
        raise S3Error("NoSuchPublicAccessBlockConfiguration", BucketName=ctx.bucket)
    flags = PublicAccessBlock.from_text(text).flags()
    body = "".join(el(n, "true" if v else "false") for n, v in flags.items())
    return xml_response(ctx, document("PublicAccessBlockConfiguration", body))


async def put_public_access_block(ctx: Ctx) -> web.Response:
    b = await bucket_record(ctx)
    await _config(ctx, b, PAB_CONFIG, "s3:PutBucketPublicAccessBlock")
    doc = await _body(ctx, "PublicAccessBlockConfiguration")
    values: list[bool] = []
    for name in PublicAccessBlock.NAMES:
        found = xmlio.children(doc, name)
        text = (found[0].text or "").strip().lower() if found else "false"
        if len(found) > 1 or text not in ("true", "false"):
            raise S3Error("MalformedXML", f"<{name}> must appear at most once, as true or "
                          "false")
        values.append(text == "true")
    await bucketdoc.store(ctx, PAB_CONFIG, PublicAccessBlock(*values).to_text())
    return web.Response(status=200, headers=ctx.response_headers)


async def _delete(ctx: Ctx, name: str, action: str) -> web.Response:
    """Remove the document ``name`` (204, also when there was none)."""
    b = await bucket_record(ctx)
    await _config(ctx, b, name, action)
    await bucketdoc.store(ctx, name, None)
    return web.Response(status=204, headers=ctx.response_headers)


async def delete_public_access_block(ctx: Ctx) -> web.Response:
    return await _delete(ctx, PAB_CONFIG, "s3:PutBucketPublicAccessBlock")


# -- BucketOwnershipControls ----------------------------------------------------------------

async def get_ownership_controls(ctx: Ctx) -> web.Response:
    b = await bucket_record(ctx)
    rule = await _config(ctx, b, OWNERSHIP_CONFIG, "s3:GetBucketOwnershipControls")
    if rule is None:
        raise S3Error("OwnershipControlsNotFoundError", BucketName=ctx.bucket)
    body = f"<Rule>{el('ObjectOwnership', rule)}</Rule>"
    return xml_response(ctx, document("OwnershipControls", body))


async def put_ownership_controls(ctx: Ctx) -> web.Response:
    b = await bucket_record(ctx)
    await _config(ctx, b, OWNERSHIP_CONFIG, "s3:PutBucketOwnershipControls")
    doc = await _body(ctx, "OwnershipControls")
    rules = xmlio.children(doc, "Rule")
    rule = (xmlio.child_text(rules[0], "ObjectOwnership") or "").strip() if rules else ""
    if len(rules) != 1 or rule not in OWNERSHIP_RULES:
        raise S3Error("MalformedXML", "OwnershipControls needs exactly one Rule whose "
                      f"ObjectOwnership is one of {', '.join(OWNERSHIP_RULES)}")
    await bucketdoc.store(ctx, OWNERSHIP_CONFIG, rule)
    return web.Response(status=200, headers=ctx.response_headers)


async def delete_ownership_controls(ctx: Ctx) -> web.Response:
    return await _delete(ctx, OWNERSHIP_CONFIG, "s3:PutBucketOwnershipControls")
