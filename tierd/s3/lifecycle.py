"""Put/Get/DeleteBucketLifecycleConfiguration (``?lifecycle``).

The configuration is validated as AWS validates it, stored as the rule list of
:mod:`tierd.namespace.lifecycle` (JSON, bucket configuration ``lifecycle``) and given back
by GET in the form it was written (a rule's own ``<Prefix>`` or a ``<Filter>`` with
``Prefix``, ``Tag``, ``ObjectSizeGreaterThan``/``LessThan`` or ``And``).  The daemon's
lifecycle job applies it (:class:`tierd.namespace.lifecycle.LifecycleJob`).

Refused: structure S3 does not accept (``MalformedXML``: a missing ``Status``, both a rule
``Prefix`` and a ``Filter``, two filter kinds, Days and Date together, more than 1000
rules), values out of range (``InvalidArgument``: an ID over 255 characters or used twice,
days not positive, a date not at midnight UTC, ObjectSizeLessThan not above GreaterThan),
a rule without an action (``InvalidRequest``), and transitions, ``501 NotImplemented``:
tierd's placement policies decide which tier holds data, not storage classes.
"""

from __future__ import annotations

import datetime
import uuid
from xml.etree.ElementTree import Element

from aiohttp import web

from tierd.namespace.api import LIFECYCLE_CONFIG as CONFIG_NAME
from tierd.namespace.api import LifecycleFilter as Filter
from tierd.namespace.api import LifecycleRule as Rule
from tierd.namespace.api import decode_lifecycle as decode
from tierd.namespace.api import encode_lifecycle as encode
from tierd.s3 import bucketdoc, xmlio
from tierd.s3.body import Body
from tierd.s3.bucket_policy import owner_or_granted
from tierd.s3.buckets import xml_response
from tierd.s3.common import Ctx
from tierd.s3.errors import S3Error
from tierd.s3.xmlio import document, el

MAX_RULES = 1000
MAX_ID = 255
MAX_BODY = 2 << 20
_RULE_TAGS = {"ID", "Status", "Prefix", "Filter", "Expiration", "Transition",
              "NoncurrentVersionExpiration", "NoncurrentVersionTransition",
              "AbortIncompleteMultipartUpload"}


def _name(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _malformed(why: str) -> S3Error:
    return S3Error("MalformedXML", f"The XML you provided was not well-formed or did not "
                   f"validate against our published schema: {why}")


def _invalid(why: str, name: str = "") -> S3Error:
    if name:
        return S3Error("InvalidArgument", why, ArgumentName=name)
    return S3Error("InvalidArgument", why)


def _one(node: Element, tag: str) -> Element | None:
    found = xmlio.children(node, tag)
    if len(found) > 1:
        raise _malformed(f"<{tag}> appears more than once")
    return found[0] if found else None


def _int(node: Element, tag: str, *, positive: bool = True) -> int | None:
    text = xmlio.child_text(node, tag)
    if text is None:
        return None
    try:
        n = int(text.strip())
    except ValueError:
        raise _malformed(f"<{tag}> must be an integer") from None
    if n < (1 if positive else 0):
        raise _invalid(f"'{tag}' must be a {'positive' if positive else 'non-negative'} "
                       "integer", tag)
    return n


def _tag(node: Element) -> tuple[str, str]:
    key = xmlio.child_text(node, "Key")
    if key is None:
        raise _malformed("a <Tag> needs a <Key>")
    return key, xmlio.child_text(node, "Value") or ""


def _filter(rule: Element) -> Filter:
    legacy = _one(rule, "Prefix")
    node = _one(rule, "Filter")
    if legacy is not None and node is not None:
        raise _malformed("a rule has either <Prefix> or <Filter>, not both")
    if node is None:
        if legacy is None:
            raise _malformed("a rule needs <Filter> (or the older <Prefix>)")
        return Filter("legacy", legacy.text or "")
    parts = [c for c in node if _name(c.tag) in
             ("Prefix", "Tag", "And", "ObjectSizeGreaterThan", "ObjectSizeLessThan")]
    if len(parts) != len(node):
        raise _malformed("<Filter> holds only Prefix, Tag, ObjectSizeGreaterThan, "
                         "ObjectSizeLessThan or And")
    if len(parts) > 1:
        raise _malformed("<Filter> holds one condition; combine several with <And>")
    if not parts:
        return Filter("none")
    part = parts[0]
    kind = _name(part.tag)
    if kind == "Prefix":
        return Filter("prefix", part.text or "")
    if kind == "Tag":
        return Filter("tag", tags=[_tag(part)])
    if kind == "And":
        f = Filter("and", xmlio.child_text(part, "Prefix") or "",
                   [_tag(t) for t in xmlio.children(part, "Tag")],
                   _int(part, "ObjectSizeGreaterThan", positive=False),
                   _int(part, "ObjectSizeLessThan"))
        keys = [k for k, _ in f.tags]
        if len(set(keys)) != len(keys):
            raise _invalid("Duplicate Tag Keys are not allowed.")
    else:
        f = Filter("gt" if kind == "ObjectSizeGreaterThan" else "lt")
        f.gt = _int(node, "ObjectSizeGreaterThan", positive=False)
        f.lt = _int(node, "ObjectSizeLessThan")
    if f.gt is not None and f.lt is not None and f.lt <= f.gt:
        raise _invalid("ObjectSizeLessThan must be greater than ObjectSizeGreaterThan")
    return f


def _date(text: str) -> str:
    try:
        d = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise _invalid("'Date' must be in ISO 8601 format", "Date") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=datetime.UTC)
    d = d.astimezone(datetime.UTC)
    if (d.hour, d.minute, d.second, d.microsecond) != (0, 0, 0, 0):
        raise _invalid("'Date' must be at midnight GMT", "Date")
    return d.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _expiration(rule: Element, r: Rule) -> None:
    exp = _one(rule, "Expiration")
    if exp is None:
        return
    r.days = _int(exp, "Days")
    date = xmlio.child_text(exp, "Date")
    r.date = _date(date) if date is not None else None
    marker = xmlio.child_text(exp, "ExpiredObjectDeleteMarker")
    if marker is not None:
        if marker.strip().lower() not in ("true", "false"):
            raise _malformed("<ExpiredObjectDeleteMarker> is true or false")
        r.expired_marker = marker.strip().lower() == "true"
    given = sum(x is not None for x in (r.days, r.date, r.expired_marker))
    if given != 1:
        raise _malformed("<Expiration> holds exactly one of Days, Date and "
                         "ExpiredObjectDeleteMarker")
    if r.expired_marker is not None and r.filter.tags:
        raise _invalid("ExpiredObjectDeleteMarker cannot be specified with tags")


def parse_rule(rule: Element) -> Rule:
    unknown = sorted({_name(c.tag) for c in rule} - _RULE_TAGS)
    if unknown:
        raise _malformed(f"unknown element <{unknown[0]}> in <Rule>")
    if xmlio.children(rule, "Transition") or xmlio.children(rule, "NoncurrentVersionTransition"):
        raise S3Error("NotImplemented", "lifecycle transitions are not supported: tierd's "
                      "placement policies decide which tier holds data (docs/placement.md); "
                      "expiration and abort rules are")
    rid = xmlio.child_text(rule, "ID")
    if rid is not None and len(rid) > MAX_ID:
        raise _invalid(f"ID length should not exceed allowed limit of {MAX_ID}", "ID")
    status = xmlio.child_text(rule, "Status")
    if status not in ("Enabled", "Disabled"):
        raise _malformed("<Status> must be Enabled or Disabled")
    r = Rule(rid or uuid.uuid4().hex, status == "Enabled", _filter(rule))
    _expiration(rule, r)
    nve = _one(rule, "NoncurrentVersionExpiration")
    if nve is not None:
        r.noncurrent_days = _int(nve, "NoncurrentDays")
        if r.noncurrent_days is None:
            raise _malformed("<NoncurrentVersionExpiration> needs <NoncurrentDays>")
        r.newer_noncurrent = _int(nve, "NewerNoncurrentVersions")
        if r.newer_noncurrent is not None and r.newer_noncurrent > 100:
            raise _invalid("NewerNoncurrentVersions must be between 1 and 100",
                           "NewerNoncurrentVersions")
    abort = _one(rule, "AbortIncompleteMultipartUpload")
    if abort is not None:
        r.abort_days = _int(abort, "DaysAfterInitiation")
        if r.abort_days is None:
            raise _malformed("<AbortIncompleteMultipartUpload> needs <DaysAfterInitiation>")
        if not r.filter.prefix_only:
            raise _invalid("AbortIncompleteMultipartUpload cannot be specified with tags or "
                           "object size filters")
    if not (r.expires_current or r.expired_marker is not None
            or r.noncurrent_days is not None or r.abort_days is not None):
        raise S3Error("InvalidRequest", "At least one action needs to be specified in a rule")
    if (r.noncurrent_days is not None or r.expired_marker) and not r.filter.prefix_only:
        raise S3Error("NotImplemented", "NoncurrentVersionExpiration and "
                      "ExpiredObjectDeleteMarker rules may filter by prefix only in tierd")
    return r


def parse_config(body: bytes) -> list[Rule]:
    doc = xmlio.parse(body, "LifecycleConfiguration")
    nodes = xmlio.children(doc, "Rule")
    if len(nodes) != len(doc):
        raise _malformed("<LifecycleConfiguration> holds only <Rule> elements")
    if not nodes:
        raise _malformed("a lifecycle configuration needs at least one <Rule>")
    if len(nodes) > MAX_RULES:
        raise _malformed(f"a lifecycle configuration holds at most {MAX_RULES} rules")
    rules = [parse_rule(n) for n in nodes]
    ids = [r.id for r in rules]
    if len(set(ids)) != len(ids):
        raise _invalid("Rule ID must be unique. Found same ID for more than one rule", "ID")
    return rules


def _tag_xml(tags: list[tuple[str, str]]) -> str:
    return "".join(f"<Tag>{el('Key', k)}{el('Value', v)}</Tag>" for k, v in tags)


def _filter_xml(f: Filter) -> str:
    if f.kind == "legacy":
        return el("Prefix", f.prefix)
    inner = ""
    if f.kind == "prefix":
        inner = el("Prefix", f.prefix)
    elif f.kind == "tag":
        inner = _tag_xml(f.tags)
    elif f.kind == "gt":
        inner = el("ObjectSizeGreaterThan", f.gt)
    elif f.kind == "lt":
        inner = el("ObjectSizeLessThan", f.lt)
    elif f.kind == "and":
        inner = "<And>" + (el("Prefix", f.prefix) if f.prefix else "") + _tag_xml(f.tags)
        inner += "".join(el(t, v) for t, v in (("ObjectSizeGreaterThan", f.gt),
                                               ("ObjectSizeLessThan", f.lt)) if v is not None)
        inner += "</And>"
    return f"<Filter>{inner}</Filter>"


def rule_xml(r: Rule) -> str:
    out = el("ID", r.id) + _filter_xml(r.filter) + el("Status",
                                                      "Enabled" if r.enabled else "Disabled")
    if r.days is not None:
        out += f"<Expiration>{el('Days', r.days)}</Expiration>"
    elif r.date is not None:
        out += f"<Expiration>{el('Date', r.date)}</Expiration>"
    elif r.expired_marker is not None:
        out += (f"<Expiration>{el('ExpiredObjectDeleteMarker', str(r.expired_marker).lower())}"
                "</Expiration>")
    if r.noncurrent_days is not None:
        out += "<NoncurrentVersionExpiration>" + el("NoncurrentDays", r.noncurrent_days)
        if r.newer_noncurrent is not None:
            out += el("NewerNoncurrentVersions", r.newer_noncurrent)
        out += "</NoncurrentVersionExpiration>"
    if r.abort_days is not None:
        out += ("<AbortIncompleteMultipartUpload>" + el("DaysAfterInitiation", r.abort_days)
                + "</AbortIncompleteMultipartUpload>")
    return f"<Rule>{out}</Rule>"


# -- the handlers ------------------------------------------------------------------------

async def _owner_or_granted(ctx: Ctx, action: str) -> None:
    """:func:`~tierd.s3.bucket_policy.owner_or_granted`, refusing in lifecycle's words."""
    await owner_or_granted(ctx, action, f"{action} is for the owner of bucket {ctx.bucket!r}")


async def get_bucket_lifecycle(ctx: Ctx) -> web.Response:
    await _owner_or_granted(ctx, "s3:GetLifecycleConfiguration")
    text = bucketdoc.require(ctx, CONFIG_NAME, "NoSuchLifecycleConfiguration")
    body = "".join(rule_xml(r) for r in decode(text))
    return xml_response(ctx, document("LifecycleConfiguration", body))


async def put_bucket_lifecycle(ctx: Ctx) -> web.Response:
    await _owner_or_granted(ctx, "s3:PutLifecycleConfiguration")
    rules = parse_config(await Body(ctx.request, ctx.verified).read_all(MAX_BODY))
    await bucketdoc.store(ctx, CONFIG_NAME, encode(rules))
    return web.Response(status=200, headers=ctx.response_headers)


async def delete_bucket_lifecycle(ctx: Ctx) -> web.Response:
    # AWS names the permission of DeleteBucketLifecycle s3:PutLifecycleConfiguration
    await _owner_or_granted(ctx, "s3:PutLifecycleConfiguration")
    await bucketdoc.store(ctx, CONFIG_NAME, None)
    return web.Response(status=204, headers=ctx.response_headers)
