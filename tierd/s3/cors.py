"""CORS: Put/Get/DeleteBucketCors, the ``OPTIONS`` preflight, and the CORS headers of every
request a rule matches.

A browser asks before a cross-origin request that is not "simple" (a PUT, a custom header):
it sends ``OPTIONS`` with ``Origin``, ``Access-Control-Request-Method`` and maybe
``Access-Control-Request-Headers``, unsigned -- also for a presigned URL, whose signature
is for the method that follows, not for the preflight.  So the preflight is answered before
authentication (:func:`preflight`) from the bucket's rules alone: it never looks at the
object, so it says nothing about what exists; a bucket without rules, a missing bucket and a
request no rule matches all get the same ``403 AccessForbidden`` ("CORSResponse: ...").

The actual request then carries ``Origin``; :func:`add_headers` puts the first matching
rule's ``Access-Control-*`` headers into ``ctx.response_headers`` before authentication, so
they are on every answer, errors included (a browser shows the script nothing without them,
not even the error).

The rules are stored, validated, as JSON under the bucket configuration name ``cors``
(:mod:`tierd.namespace.bucketconf`); parsed rules are cached by that text.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from xml.etree.ElementTree import Element

from aiohttp import web

from tierd.errors import FsError
from tierd.s3 import bucketdoc, xmlio
from tierd.s3.body import Body
from tierd.s3.bucket_policy import owner_or_granted
from tierd.s3.buckets import xml_response
from tierd.s3.common import Ctx, bucket_doc
from tierd.s3.errors import S3Error
from tierd.s3.xmlio import document, el

#: the bucket configuration document's name (tierd.namespace.bucketconf)
CONFIG_NAME = "cors"
METHODS = ("GET", "PUT", "POST", "DELETE", "HEAD")
MAX_RULES = 100
MAX_BODY = 64 << 10  # AWS's limit on a CORS configuration
#: AWS's preflight refusal, word for word (its typo included: clients match on it)
NOT_ALLOWED = ("CORSResponse: This CORS request is not allowed. This is usually because the "
               "evalution of Origin, request method / Access-Control-Request-Method or "
               "Access-Control-Request-Headers are not whitelisted by the resource's CORS "
               "spec.")
VARY = "Origin, Access-Control-Request-Headers, Access-Control-Request-Method"


@dataclass(frozen=True, slots=True)
class Rule:
    """One ``<CORSRule>``."""

    methods: list[str]
    origins: list[str]
    headers: list[str]
    expose: list[str]
    max_age: int | None = None
    id: str | None = None

    def origin_match(self, origin: str) -> str | None:
        """The first AllowedOrigin that matches ``origin`` (None: none does)."""
        return next((o for o in self.origins if _wildcard(o, origin)), None)

    def headers_match(self, asked: list[str]) -> bool:
        allowed = [h.lower() for h in self.headers]
        return all(any(_wildcard(a, h) for a in allowed) for h in asked)


def _wildcard(pattern: str, value: str) -> bool:
    """``pattern`` with at most one ``*`` (any run of characters) matches ``value``."""
    head, star, tail = pattern.partition("*")
    if not star:
        return pattern == value
    return (len(value) >= len(head) + len(tail) and value.startswith(head)
            and value.endswith(tail))


# -- the configuration document ----------------------------------------------------------

def parse_config(raw: bytes) -> list[Rule]:
    """The rules of a ``<CORSConfiguration>`` body, validated as S3 does."""
    doc = xmlio.parse(raw, "CORSConfiguration")
    nodes = xmlio.children(doc, "CORSRule")
    if not nodes:
        raise S3Error("MalformedXML", "a CORS configuration needs at least one <CORSRule>")
    if len(nodes) > MAX_RULES:
        raise S3Error("MalformedXML", f"a CORS configuration may have at most {MAX_RULES} "
                      f"rules, not {len(nodes)}")
    return [_rule(n) for n in nodes]


def _texts(node: Element, tag: str) -> list[str]:
    return [(c.text or "").strip() for c in xmlio.children(node, tag)]


def _rule(node: Element) -> Rule:
    methods, origins = _texts(node, "AllowedMethod"), _texts(node, "AllowedOrigin")
    headers, expose = _texts(node, "AllowedHeader"), _texts(node, "ExposeHeader")
    if not methods or not origins:
        raise S3Error("MalformedXML", "every <CORSRule> needs an <AllowedMethod> and an "
                      "<AllowedOrigin>")
    for m in methods:
        if m not in METHODS:
            raise S3Error("InvalidRequest", "Found unsupported HTTP method in CORS config. "
                          f"Unsupported method is {m}")
    for tag, values in (("AllowedOrigin", origins), ("AllowedHeader", headers)):
        for v in values:
            if v.count("*") > 1:
                raise S3Error("InvalidRequest", f'{tag} "{v}" can not have more than one '
                              "wildcard.")
    for v in expose:
        if "*" in v:
            raise S3Error("InvalidRequest", f'ExposeHeader "{v}" contains wildcard. We '
                          "currently do not support wildcard for ExposeHeader.")
    raw_age = xmlio.child_text(node, "MaxAgeSeconds")
    max_age = None
    if raw_age is not None:
        try:
            max_age = int(raw_age.strip())
        except ValueError:
            raise S3Error("MalformedXML", f"MaxAgeSeconds must be an integer, not "
                          f"{raw_age!r}") from None
    rule_id = xmlio.child_text(node, "ID")
    if rule_id is not None and len(rule_id) > 255:
        raise S3Error("InvalidRequest", "a CORSRule ID may be at most 255 characters")
    return Rule(methods, origins, headers, expose, max_age, rule_id)


def to_xml(rules: list[Rule]) -> str:
    out = []
    for r in rules:
        parts = [el("ID", r.id)] if r.id is not None else []
        parts += [el("AllowedHeader", h) for h in r.headers]
        parts += [el("AllowedMethod", m) for m in r.methods]
        parts += [el("AllowedOrigin", o) for o in r.origins]
        parts += [el("ExposeHeader", h) for h in r.expose]
        if r.max_age is not None:
            parts.append(el("MaxAgeSeconds", r.max_age))
        out.append(f"<CORSRule>{''.join(parts)}</CORSRule>")
    return document("CORSConfiguration", "".join(out))


_cache: dict[str, list[Rule]] = {}


def _decode(text: str) -> list[Rule]:
    rules = _cache.get(text)
    if rules is None:
        if len(_cache) > 256:
            _cache.clear()
        rules = _cache[text] = [Rule(**d) for d in json.loads(text)]
    return rules


def rules_of(ctx: Ctx) -> list[Rule]:
    """The bucket's rules; empty without a configuration or without the bucket."""
    try:
        text = bucket_doc(ctx, CONFIG_NAME)
    except FsError:
        return []
    return _decode(text) if text else []


# -- Put/Get/DeleteBucketCors ------------------------------------------------------------

async def get_bucket_cors(ctx: Ctx) -> web.Response:
    await owner_or_granted(ctx, "s3:GetBucketCORS")
    rules = rules_of(ctx)
    if not rules:
        raise S3Error("NoSuchCORSConfiguration", BucketName=ctx.bucket)
    return xml_response(ctx, to_xml(rules))


async def put_bucket_cors(ctx: Ctx) -> web.Response:
    await owner_or_granted(ctx, "s3:PutBucketCORS")
    rules = parse_config(await Body(ctx.request, ctx.verified).read_all(MAX_BODY))
    await bucketdoc.store(ctx, CONFIG_NAME,
                          json.dumps([asdict(r) for r in rules], separators=(",", ":")))
    return web.Response(status=200, headers=ctx.response_headers)


async def delete_bucket_cors(ctx: Ctx) -> web.Response:
    # AWS names the permission of DeleteBucketCors s3:PutBucketCORS
    await owner_or_granted(ctx, "s3:PutBucketCORS")
    await bucketdoc.store(ctx, CONFIG_NAME, None)
    return web.Response(status=204, headers=ctx.response_headers)


# -- browsers ----------------------------------------------------------------------------

def _allow_headers(rule: Rule, matched: str, origin: str) -> dict[str, str]:
    """The ``Access-Control-*`` headers of a rule whose AllowedOrigin ``matched`` matched
    ``origin``, as S3 sends them: ``*`` for the any-origin rule, else the origin itself
    with credentials allowed."""
    h = {"Vary": VARY, "Access-Control-Allow-Methods": ", ".join(rule.methods)}
    if matched == "*":
        h["Access-Control-Allow-Origin"] = "*"
    else:
        h["Access-Control-Allow-Origin"] = origin
        h["Access-Control-Allow-Credentials"] = "true"
    if rule.expose:
        h["Access-Control-Expose-Headers"] = ", ".join(rule.expose)
    if rule.max_age is not None:
        h["Access-Control-Max-Age"] = str(rule.max_age)
    return h


def add_headers(ctx: Ctx) -> None:
    """For a request with ``Origin`` to a bucket with rules: the first rule matching the
    origin and the method goes into the response headers (errors included)."""
    origin = ctx.headers.get("Origin")
    if origin is None or not ctx.bucket:
        return
    method = ctx.request.method
    for rule in rules_of(ctx):
        matched = rule.origin_match(origin) if method in rule.methods else None
        if matched is not None:
            ctx.response_headers.update(_allow_headers(rule, matched, origin))
            return


def preflight(ctx: Ctx) -> web.Response:
    """The answer to ``OPTIONS`` (unauthenticated, from the bucket's rules alone)."""
    origin = ctx.headers.get("Origin")
    method = ctx.headers.get("Access-Control-Request-Method")
    if origin is None:
        raise S3Error("BadRequest", "Insufficient information. Origin request header needed.")
    if method is None:
        raise S3Error("BadRequest", "Invalid Access-Control-Request-Method: null")
    if method not in METHODS:
        raise S3Error("BadRequest", f"Invalid Access-Control-Request-Method: {method}")
    asked = [h.strip().lower() for h in
             ctx.headers.get("Access-Control-Request-Headers", "").split(",") if h.strip()]
    if ctx.bucket:
        for rule in rules_of(ctx):
            matched = rule.origin_match(origin) if method in rule.methods else None
            if matched is not None and rule.headers_match(asked):
                h = dict(ctx.response_headers)
                h.update(_allow_headers(rule, matched, origin))
                if asked:
                    h["Access-Control-Allow-Headers"] = ", ".join(asked)
                return web.Response(status=200, headers=h)
    raise S3Error("AccessForbidden", NOT_ALLOWED, Method=method,
                  ResourceType="OBJECT" if ctx.key else "BUCKET")
