"""AWS Signature Version 2: the ``Authorization: AWS KEY:SIGNATURE`` header and presigned
query URLs (``AWSAccessKeyId``, ``Signature``, ``Expires``).

Clients still produce SigV2 without being asked: botocore presigns with it for a custom
endpoint unless told ``signature_version="s3v4"``, and ``aws s3 presign`` and s3cmd's
``signature_v2`` do the same.  How much of it the gateway takes is the setting
``s3_allow_sigv2`` (:data:`MODES`): ``presigned`` (the default, as MinIO does: presigned
GET, HEAD and PUT URLs only, the links people hand out, and SigV2-signed POST forms,
:mod:`tierd.s3.post_object`), ``all``, or ``off``.  A refused
SigV2 request is answered ``400 InvalidRequest`` naming the setting.

The string to sign is S3's: the method, ``Content-MD5``, ``Content-Type``, the date line
(``Date``, empty when the client dates the request with ``x-amz-date``, or ``Expires`` for a
presigned URL), the ``x-amz-*`` headers (lower-case, sorted, values joined with ``,``) and
the resource (``/bucket/key`` even for virtual-host requests, plus the sub-resources S3
lists, sorted).  The signature is base64 HMAC-SHA1 with the secret key; signatures are
compared with :func:`hmac.compare_digest`.  The body is not signed in SigV2 (only
``Content-MD5``, which :mod:`tierd.s3.body` verifies), so the request's payload is
``UNSIGNED-PAYLOAD`` unless the client declared a SHA-256 of it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from collections.abc import Callable
from urllib.parse import quote, unquote

from aiohttp import web

from tierd.meta import AccessKey
from tierd.s3.errors import S3Error

#: values of ``s3_allow_sigv2``
MODES = ("presigned", "all", "off")
#: the methods a presigned SigV2 URL may carry under ``s3_allow_sigv2 = presigned``
PRESIGNED_METHODS = frozenset({"GET", "HEAD", "PUT"})
#: the name of the algorithm in bucket-policy condition keys (``s3:signatureversion``)
VERSION = "AWS"
#: query parameters that are part of the signed resource (S3's list, as botocore signs it)
SUBRESOURCES = frozenset({
    "accelerate", "acl", "cors", "defaultObjectAcl", "location", "logging", "partNumber",
    "policy", "requestPayment", "torrent", "versioning", "versionId", "versions", "website",
    "uploads", "uploadId", "response-content-type", "response-content-language",
    "response-expires", "response-cache-control", "response-content-disposition",
    "response-content-encoding", "delete", "lifecycle", "tagging", "restore",
    "storageClass", "notification", "replication", "analytics", "metrics", "inventory",
    "select", "select-type", "object-lock",
})
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def refused(why: str) -> S3Error:
    """The answer to SigV2 the setting does not allow."""
    return S3Error("InvalidRequest", f"Signature Version 2 {why}; use AWS4-HMAC-SHA256 "
                   "(Signature Version 4), or change the gateway's s3_allow_sigv2 setting.")


def check_allowed(mode: str, request: web.Request, presigned: bool) -> None:
    """Refuse a SigV2 request that ``mode`` (``s3_allow_sigv2``) does not take."""
    if mode == "all":
        return
    if mode == "off":
        raise refused("is not accepted by this gateway (s3_allow_sigv2 = off)")
    if not presigned:
        raise refused("is accepted only in presigned URLs by this gateway "
                      "(s3_allow_sigv2 = presigned), not in the Authorization header")
    if request.method not in PRESIGNED_METHODS:
        raise refused(f"presigned URLs may only GET, HEAD or PUT on this gateway "
                      f"(s3_allow_sigv2 = presigned), not {request.method}")


def sign(secret: str, string_to_sign: str) -> str:
    """Base64 HMAC-SHA1 of ``string_to_sign`` with ``secret`` (also POST policies)."""
    mac = hmac.new(secret.encode(), string_to_sign.encode("utf-8", "surrogateescape"),
                   hashlib.sha1)
    return base64.b64encode(mac.digest()).decode()


def amz_headers(request: web.Request) -> str:
    """The canonicalized ``x-amz-*`` headers: ``name:value\\n`` each, sorted by name."""
    found: dict[str, list[str]] = {}
    for k, v in request.headers.items():
        lk = k.lower()
        if lk.startswith("x-amz-"):
            found.setdefault(lk, []).append(" ".join(v.split()))
    return "".join(f"{k}:{','.join(found[k])}\n" for k in sorted(found))


def sub_resources(raw_query: str) -> str:
    """``?a&b=v`` of the signed sub-resources in the query (values decoded), or ''."""
    pairs: list[tuple[str, str | None]] = []
    for part in raw_query.split("&"):
        k, eq, v = part.partition("=")
        if k in SUBRESOURCES:
            pairs.append((k, unquote(v) if eq else None))
    if not pairs:
        return ""
    pairs.sort(key=lambda p: p[0])
    return "?" + "&".join(k if v is None else f"{k}={v}" for k, v in pairs)


def resources(request: web.Request, vhost_bucket: str) -> list[str]:
    """The canonicalized resource as clients compute it: the path as sent and re-encoded
    the AWS way (clients differ on ``~``, ``+``, ``!``...), with the bucket in front for a
    virtual-host request."""
    raw = request.rel_url.raw_path or "/"
    paths = [raw, quote(unquote(raw), safe="/~")]
    if not vhost_bucket and raw.count("/") == 1 and len(raw) > 1:
        paths.append(raw + "/")  # a bucket: botocore signs "/bucket/" for "/bucket"
    prefix = "/" + vhost_bucket if vhost_bucket else ""
    subs = sub_resources(request.rel_url.raw_query_string)
    return [prefix + p + subs for p in dict.fromkeys(paths)]


def _verify(request: web.Request, lookup: Callable[[str], AccessKey | None], access: str,
            signature: str, date_lines: list[str], vhost_bucket: str) -> AccessKey:
    key = lookup(access)
    if key is None:
        raise S3Error("InvalidAccessKeyId", AWSAccessKeyId=access)
    h = request.headers
    head = f"{request.method}\n{h.get('Content-MD5', '')}\n{h.get('Content-Type', '')}\n"
    amz = amz_headers(request)
    given = signature.strip().encode("utf-8", "surrogateescape")
    sts = ""
    for resource in resources(request, vhost_bucket):
        for date in date_lines:
            sts = f"{head}{date}\n{amz}{resource}"
            if hmac.compare_digest(sign(key.secret, sts).encode(), given):
                return key
    raise S3Error("SignatureDoesNotMatch", AWSAccessKeyId=access, StringToSign=sts,
                  SignatureProvided=signature)


def verify_header(request: web.Request, header: str, lookup: Callable[[str], AccessKey | None],
                  parse_date: Callable[[str], float | None], max_skew: float,
                  vhost_bucket: str) -> tuple[AccessKey, str, float]:
    """(key, signature, request time) of ``Authorization: AWS KEY:SIGNATURE``."""
    access, colon, signature = header[4:].strip().partition(":")
    if not colon or not access or not signature:
        raise S3Error("InvalidArgument", "AWS authorization header is invalid.  Expected "
                      "AwsAccessKeyId:signature", ArgumentName="Authorization",
                      ArgumentValue=header)
    h = request.headers
    when = h.get("x-amz-date") or h.get("Date") or ""
    ts = parse_date(when)
    if ts is None:
        raise S3Error("AccessDenied", "AWS authentication requires a valid Date or "
                      "x-amz-date header")
    if abs(time.time() - ts) > max_skew:
        raise S3Error("RequestTimeTooSkewed", RequestTime=when,
                      MaxAllowedSkewMilliseconds=str(int(max_skew * 1000)))
    # with x-amz-date the Date line is empty (S3's rule); some clients sign Date anyway
    lines = list(dict.fromkeys(("", h.get("Date", "")) if "x-amz-date" in h
                               else (h.get("Date", ""),)))
    key = _verify(request, lookup, access, signature, lines, vhost_bucket)
    return key, signature, ts


def verify_query(request: web.Request, lookup: Callable[[str], AccessKey | None],
                 vhost_bucket: str) -> tuple[AccessKey, str, float]:
    """(key, signature, request time) of a presigned SigV2 URL."""
    q = request.rel_url.query
    for name in ("AWSAccessKeyId", "Signature", "Expires"):
        if name not in q:
            raise S3Error("AccessDenied", f"Query-string authentication requires the "
                          f"Signature, Expires and AWSAccessKeyId parameters ({name} is "
                          "missing)")
    raw = q["Expires"]
    try:
        expires = int(raw)
    except ValueError:
        raise S3Error("AccessDenied", f"Expires must be a number of seconds since the "
                      f"epoch, not {raw!r}") from None
    now = time.time()
    if now > expires:
        raise S3Error("AccessDenied", "Request has expired", Expires=_iso(expires),
                      ServerTime=_iso(now))
    key = _verify(request, lookup, q["AWSAccessKeyId"], q["Signature"], [raw], vhost_bucket)
    return key, q["Signature"], now


def payload_of(request: web.Request, unsigned: str) -> str:
    """What the body is checked against: a SHA-256 the client declared, else unsigned."""
    declared = request.headers.get("X-Amz-Content-SHA256", "")
    return declared if _HEX64.match(declared) else unsigned


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
