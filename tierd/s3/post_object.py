"""POST object: browser form uploads (``POST /<bucket>`` with ``multipart/form-data``).

A web page can upload straight to the gateway without the secret key: the server that owns
the key hands the page a **policy document** (base64 JSON: ``expiration`` and
``conditions``) and its signature, and the form carries them with the file.  The gateway
checks, in this order:

1. the form: fields before the ``file`` field (those after it are ignored, as AWS does),
   at most :data:`MAX_FIELDS_BYTES` of them (``MaxPostPreDataLengthExceeded``); a ``key``
   field and exactly one file (``InvalidArgument``); ``${filename}`` in the key is the
   file's name;
2. the signature: SigV4 form fields (``x-amz-algorithm``, ``x-amz-credential``,
   ``x-amz-date``, ``x-amz-signature``: hex HMAC-SHA256 of the base64 policy with the
   signing key of :mod:`tierd.s3.auth`), or SigV2 (``AWSAccessKeyId``, ``signature``:
   base64 HMAC-SHA1) unless ``s3_allow_sigv2 = off``.  A form without a policy is an
   anonymous upload (a bucket policy or ACL must allow it); a policy without a signature
   is ``AccessDenied``;
3. the policy: not expired; every condition met (exact ``{"k": "v"}``/``["eq", ...]``,
   ``["starts-with", "$k", "prefix"]``, ``["content-length-range", min, max]``, the bucket);
   every form field named by a condition (except the signature fields, ``policy``,
   ``file`` and ``x-ignore-*``).  A failure is ``AccessDenied`` whose message says which;
4. permission: the signer's identity must be allowed to write the key exactly as for
   PutObject (:func:`tierd.s3.access.authorize_request`, then POSIX in the namespace).

The file then streams into :meth:`tierd.namespace.Namespace.put_object`, the PutObject
path (staging file, ``dirty_limit``, durable before the answer), through a counter that
stops it with ``EntityTooLarge`` past the policy's maximum (or the gateway's 5 GiB) and
``EntityTooSmall`` below its minimum -- raised inside the stream, so the staged bytes are
discarded and an existing object is left intact.  Nothing is held in memory beyond one
piece.  The answer is ``success_action_redirect`` (303 to it with ``bucket``, ``key`` and
``etag`` added), else ``success_action_status`` 200 or 204 (empty) or 201 (the
``PostResponse`` document); 204 by default.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDict, CIMultiDictProxy

from tierd.acl.keys import identity_of
from tierd.errors import FsError
from tierd.meta import Inode
from tierd.s3 import sigv2, tagset, versioning
from tierd.s3.access import authorize_request
from tierd.s3.auth import ALGORITHM, UNSIGNED_PAYLOAD, Auth, parse_amz_date, signing_key
from tierd.s3.buckets import xml_response
from tierd.s3.common import MAX_PUT_SIZE, STORED_HEADERS, Ctx, etag_of, objmeta_from_headers, quoted
from tierd.s3.errors import S3Error
from tierd.s3.objects import put_error
from tierd.s3.xmlio import document, el

#: bytes of the form fields before the file (AWS allows about 20 KB; policies can be long)
MAX_FIELDS_BYTES = 64 << 10
PIECE = 1 << 20
#: fields no condition has to name
_EXEMPT = frozenset({"x-amz-signature", "file", "policy", "awsaccesskeyid", "signature"})
_SIGV4_FIELDS = ("x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-signature")


#: what aiohttp's multipart reader raises on a body that is not multipart/form-data
_BROKEN = (ValueError, AssertionError, HttpProcessingError)


def _malformed(e: Exception) -> S3Error:
    return S3Error("MalformedPOSTRequest", "The body of your POST request is not "
                   f"well-formed multipart/form-data: {e}")


def _denied(why: str) -> S3Error:
    return S3Error("AccessDenied", f"Invalid according to Policy: {why}")


async def _read_fields(reader: MultipartReader) -> tuple[dict[str, str], BodyPartReader]:
    """The form fields before the file (names lower-cased) and the file's part."""
    fields: dict[str, str] = {}
    used = 0
    while True:
        part = await reader.next()
        if part is None:
            raise S3Error("InvalidArgument", "POST requires exactly one file upload per "
                          "request.", ArgumentName="file", ArgumentValue="0")
        if not isinstance(part, BodyPartReader) or not part.name:
            raise S3Error("MalformedPOSTRequest", "a form part without a name, or nested")
        name = part.name.lower()
        if name == "file":
            return fields, part
        value = bytearray()
        while chunk := await part.read_chunk(8192):
            value += chunk
            used += len(chunk)
            if used > MAX_FIELDS_BYTES:
                raise S3Error("MaxPostPreDataLengthExceeded", "Your POST request fields "
                              f"preceding the upload file were larger than {MAX_FIELDS_BYTES} "
                              "bytes.")
        if name in fields:
            raise S3Error("InvalidArgument", f"the form field {part.name!r} is given twice",
                          ArgumentName=part.name)
        try:
            fields[name] = value.decode()
        except UnicodeDecodeError:
            raise S3Error("MalformedPOSTRequest", f"the form field {part.name!r} is not "
                          "UTF-8") from None


# -- signature -----------------------------------------------------------------------------

def _authenticate(ctx: Ctx, fields: dict[str, str]) -> Auth | None:
    """The signer of the policy (None: an anonymous form, without a policy)."""
    policy = fields.get("policy")
    v4 = [f for f in _SIGV4_FIELDS if f in fields]
    if policy is None:
        if v4 or "signature" in fields:
            raise S3Error("InvalidArgument", "a signed POST form needs its policy field",
                          ArgumentName="policy")
        return ctx.auth  # an anonymous form (or one whose request itself was signed)
    if v4:
        return _sigv4(ctx, fields, policy)
    if "signature" in fields or "awsaccesskeyid" in fields:
        return _sigv2(ctx, fields, policy)
    raise S3Error("AccessDenied", "a POST form with a policy needs its signature fields "
                  "(x-amz-algorithm, x-amz-credential, x-amz-date, x-amz-signature)")


def _sigv4(ctx: Ctx, fields: dict[str, str], policy: str) -> Auth:
    for name in _SIGV4_FIELDS:
        if name not in fields:
            raise S3Error("InvalidArgument", f"Bucket POST must contain a field named "
                          f"'{name}'.  If it is specified, please check the order of the "
                          "fields.", ArgumentName=name)
    if fields["x-amz-algorithm"] != ALGORITHM:
        raise S3Error("InvalidArgument", f"x-amz-algorithm must be {ALGORITHM}",
                      ArgumentName="x-amz-algorithm", ArgumentValue=fields["x-amz-algorithm"])
    credential = fields["x-amz-credential"]
    cparts = credential.rsplit("/", 4)
    region = ctx.state.region
    if len(cparts) != 5 or cparts[3:] != ["s3", "aws4_request"]:
        raise S3Error("InvalidArgument", f"malformed x-amz-credential {credential!r}: "
                      "expected ACCESSKEY/YYYYMMDD/REGION/s3/aws4_request",
                      ArgumentName="x-amz-credential")
    access, date = cparts[0], cparts[1]
    if cparts[2] != region:
        raise S3Error("AuthorizationQueryParametersError", f"the region {cparts[2]!r} is "
                      f"wrong; expecting {region!r}", Region=region)
    if not fields["x-amz-date"].startswith(date):
        raise S3Error("InvalidArgument", "x-amz-date is not the date of x-amz-credential",
                      ArgumentName="x-amz-date")
    key = ctx.state.keys.lookup(access)
    if key is None:
        raise S3Error("InvalidAccessKeyId", AWSAccessKeyId=access)
    skey = signing_key(key.secret, date, region)
    expected = hmac.new(skey, policy.encode(), hashlib.sha256).hexdigest()
    given = fields["x-amz-signature"].strip().lower()
    if not hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape")):
        raise S3Error("SignatureDoesNotMatch", AWSAccessKeyId=access, StringToSign=policy,
                      SignatureProvided=given)
    ts = parse_amz_date(fields["x-amz-date"]) or time.time()
    return Auth(key, identity_of(key), skey, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(ts)),
                f"{date}/{region}/s3/aws4_request", given, UNSIGNED_PAYLOAD, True)


def _sigv2(ctx: Ctx, fields: dict[str, str], policy: str) -> Auth:
    if ctx.state.auth.sigv2 == "off":
        raise sigv2.refused("is not accepted by this gateway (s3_allow_sigv2 = off)")
    for name, label in (("awsaccesskeyid", "AWSAccessKeyId"), ("signature", "signature")):
        if name not in fields:
            raise S3Error("InvalidArgument", f"Bucket POST must contain a field named "
                          f"'{label}'.", ArgumentName=label)
    access = fields["awsaccesskeyid"]
    key = ctx.state.keys.lookup(access)
    if key is None:
        raise S3Error("InvalidAccessKeyId", AWSAccessKeyId=access)
    given = fields["signature"].strip()
    if not hmac.compare_digest(sigv2.sign(key.secret, policy).encode(),
                               given.encode("utf-8", "surrogateescape")):
        raise S3Error("SignatureDoesNotMatch", AWSAccessKeyId=access, StringToSign=policy,
                      SignatureProvided=given)
    return Auth(key, identity_of(key), b"", "", "", given, UNSIGNED_PAYLOAD, True,
                sigv2.VERSION)


# -- the policy ----------------------------------------------------------------------------

class Policy:
    """A decoded POST policy: its conditions, checked against the form."""

    def __init__(self, encoded: str) -> None:
        try:
            doc = json.loads(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            raise S3Error("InvalidPolicyDocument", "Invalid Policy: Invalid JSON (the policy "
                          "must be base64 JSON).") from None
        if not isinstance(doc, dict):
            raise S3Error("InvalidPolicyDocument", "Invalid Policy: Invalid JSON.")
        expiration = doc.get("expiration")
        if not isinstance(expiration, str):
            raise S3Error("InvalidPolicyDocument", "Invalid Policy: Policy missing "
                          "expiration.")
        self.expires = _iso_time(expiration)
        conditions = doc.get("conditions")
        if not isinstance(conditions, list):
            raise S3Error("InvalidPolicyDocument", "Invalid Policy: Policy missing "
                          "conditions.")
        self.conditions: list[Any] = conditions
        self.min_size, self.max_size = 0, MAX_PUT_SIZE

    def check(self, fields: dict[str, str], bucket: str, key_raw: str, key: str) -> None:
        """Expiration, every condition, and no field outside them (AccessDenied, naming
        what failed); sets :attr:`min_size`/:attr:`max_size` from content-length-range."""
        if time.time() > self.expires:
            raise _denied("Policy expired.")
        values = dict(fields, bucket=bucket)
        named: set[str] = {"bucket"}
        for cond in self.conditions:
            if isinstance(cond, dict):
                for k, v in cond.items():
                    name = k.lower()
                    named.add(name)
                    if not _equal(name, values.get(name), str(v), key_raw):
                        raise _denied(f"Policy Condition failed: [\"eq\", \"${k}\", "
                                      f"{json.dumps(v)}]")
            elif isinstance(cond, list) and cond:
                named.update(self._operator(cond, values, key_raw))
            else:
                raise S3Error("InvalidPolicyDocument", f"Invalid Policy: Invalid Simple-"
                              f"Condition: {json.dumps(cond)}")
        extra = sorted(n for n in fields
                       if n not in named and n not in _EXEMPT and not n.startswith("x-ignore-"))
        if extra:
            raise _denied(f"Extra input fields: {', '.join(extra)}")

    def _operator(self, cond: list[Any], values: dict[str, str], key_raw: str) -> set[str]:
        op = str(cond[0]).lower()
        text = json.dumps(cond)
        if op == "content-length-range":
            if len(cond) != 3 or not all(isinstance(x, int) for x in cond[1:]):
                raise S3Error("InvalidPolicyDocument", f"Invalid Policy: Invalid "
                              f"content-length-range: {text}")
            self.min_size, self.max_size = cond[1], min(cond[2], MAX_PUT_SIZE)
            return set()
        if op not in ("eq", "starts-with") or len(cond) != 3 or not isinstance(cond[1], str) \
                or not cond[1].startswith("$"):
            raise S3Error("InvalidPolicyDocument", f"Invalid Policy: Invalid Condition: "
                          f"{text}")
        name, want = cond[1][1:].lower(), str(cond[2])
        have = values.get(name)
        if op == "eq":
            ok = _equal(name, have, want, key_raw)
        else:
            candidates = [have, key_raw] if name == "key" else [have]
            # Content-Type may list several types, each of which must match
            ok = any(c is not None and all(
                p.strip().startswith(want) for p in (c.split(",") if name == "content-type"
                                                      else [c])) for c in candidates)
        if not ok:
            raise _denied(f"Policy Condition failed: {text}")
        return {name}


def _equal(name: str, have: str | None, want: str, key_raw: str) -> bool:
    """An exact condition; the key may match as sent (with ``${filename}``) or resolved."""
    return have == want or (name == "key" and key_raw == want)


def _iso_time(value: str) -> float:
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise S3Error("InvalidPolicyDocument", f"Invalid Policy: Invalid 'expiration' value: "
                      f"{value!r}") from None


# -- the upload ----------------------------------------------------------------------------

async def _file_body(part: BodyPartReader, low: int, high: int) -> AsyncIterator[bytes]:
    """The file's bytes, stopped with EntityTooLarge past ``high`` and EntityTooSmall below
    ``low`` (inside the stream: the namespace then discards what it staged)."""
    size = 0
    while True:
        try:
            chunk = await part.read_chunk(PIECE)
        except _BROKEN as e:
            raise _malformed(e) from None
        if not chunk:
            break
        size += len(chunk)
        if size > high:
            raise S3Error("EntityTooLarge", f"Your proposed upload exceeds the maximum "
                          f"allowed size ({high} bytes)", MaxSizeAllowed=str(high))
        yield chunk
    if size < low:
        raise S3Error("EntityTooSmall", f"Your proposed upload is smaller than the minimum "
                      f"allowed size ({low} bytes)", ProposedSize=str(size),
                      MinSizeAllowed=str(low))


def _headers(fields: dict[str, str]) -> CIMultiDictProxy[str]:
    """The form fields that PutObject takes as headers."""
    h: CIMultiDict[str] = CIMultiDict()
    for name, value in fields.items():
        if name in STORED_HEADERS or name.startswith("x-amz-meta-") or (
                name == "x-amz-storage-class"):
            h[name] = value
    if "acl" in fields:
        h["x-amz-acl"] = fields["acl"]
    if "tagging" in fields:  # a <Tagging> document, as PutObjectTagging's body
        h[tagset.HEADER] = urlencode(tagset.parse_document(fields["tagging"].encode()))
    return CIMultiDictProxy(h)


async def post_object(ctx: Ctx) -> web.StreamResponse:
    if not ctx.headers.get("Content-Type", "").lower().startswith("multipart/form-data"):
        raise S3Error("PreconditionFailed", "Bucket POST must be of the enclosure-type "
                      "multipart/form-data", Condition="Bucket POST must be of the "
                      "enclosure-type multipart/form-data")
    length = ctx.request.content_length
    if length is not None and length > MAX_PUT_SIZE + 2 * MAX_FIELDS_BYTES:
        raise S3Error("EntityTooLarge", f"the form is {length} bytes; an upload may be at "
                      f"most {MAX_PUT_SIZE}", ProposedSize=str(length),
                      MaxSizeAllowed=str(MAX_PUT_SIZE))
    try:
        reader = await ctx.request.multipart()
        fields, part = await _read_fields(reader)
    except _BROKEN as e:
        raise _malformed(e) from None
    key_raw = fields.get("key")
    if not key_raw:
        raise S3Error("InvalidArgument", "Bucket POST must contain a field named 'key'.  If "
                      "it is specified, please check the order of the fields.",
                      ArgumentName="key")
    filename = part.filename or ""
    ctx.key = key_raw.replace("${filename}", filename)
    ctx.auth = _authenticate(ctx, fields)
    low, high = 0, MAX_PUT_SIZE
    if "policy" in fields:
        policy = Policy(fields["policy"])
        policy.check(fields, ctx.bucket, key_raw, ctx.key)
        low, high = policy.min_size, policy.max_size
    await authorize_request(ctx, "s3:PutObject", on_object=True)  # on the key, as PutObject
    objmeta = objmeta_from_headers(_headers(fields))
    try:
        inode = await ctx.ns.put_object(ctx.ident, ctx.bucket, ctx.key,
                                        _file_body(part, low, high), objmeta)
    except FsError as e:
        raise await put_error(ctx, e) from None
    return _answer(ctx, fields, inode)


def _answer(ctx: Ctx, fields: dict[str, str], inode: Inode) -> web.Response:
    etag = quoted(etag_of(inode))
    h = ctx.response_headers
    h["ETag"] = etag
    versioning.set_version_header(ctx, inode)
    location = f"{ctx.request.scheme}://{ctx.request.host}/{quote(ctx.bucket)}/" \
               f"{quote(ctx.key)}"
    h["Location"] = location
    redirect = fields.get("success_action_redirect") or fields.get("redirect")
    if redirect and urlsplit(redirect).scheme in ("http", "https"):
        sep = "&" if urlsplit(redirect).query else "?"
        h["Location"] = redirect + sep + urlencode(
            {"bucket": ctx.bucket, "key": ctx.key, "etag": etag})
        return web.Response(status=303, headers=h)
    status = fields.get("success_action_status", "204")
    if status == "201":
        body = document("PostResponse", el("Location", location) + el("Bucket", ctx.bucket)
                        + el("Key", ctx.key) + el("ETag", etag))
        return xml_response(ctx, body, 201)
    return web.Response(status=200 if status == "200" else 204, headers=h)

