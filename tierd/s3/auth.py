"""AWS Signature Version 4: the Authorization header and presigned (query) URLs (Signature
Version 2, when the setting ``s3_allow_sigv2`` takes it, is :mod:`tierd.s3.sigv2`'s).

:func:`authenticate` checks a request's signature and returns an :class:`Auth` with the
identity of its access key and what :mod:`tierd.s3.body` needs to verify a streamed body
(the signing key, scope and seed signature for ``aws-chunked`` chunk signatures, the
declared ``x-amz-content-sha256``).  An unsigned request is anonymous (``None``): it gets
only what a bucket policy grants to ``*`` (:mod:`tierd.acl.authorize`, asked by
:mod:`tierd.s3.access`).

Clients encode paths differently (``~``, ``+``, ``!``...), so the canonical URI is computed
the way AWS does -- decode, then re-encode every byte outside ``A-Za-z0-9-._~/`` -- and, if
that does not match, from the path exactly as sent.  Signatures are compared with
:func:`hmac.compare_digest`.
"""

from __future__ import annotations

import calendar
import datetime
import email.utils
import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import quote, unquote

from aiohttp import web

from tierd.acl import Identity
from tierd.acl.keys import KeyStore, identity_of
from tierd.meta import AccessKey
from tierd.s3 import sigv2
from tierd.s3.errors import S3Error

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING = (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER)
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_PRESIGN_EXPIRES = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class Auth:
    """A verified request: who sent it and how to check its body."""

    key: AccessKey
    identity: Identity
    signing_key: bytes
    amz_date: str
    scope: str
    signature: str
    payload: str  # x-amz-content-sha256: a hex digest, UNSIGNED-PAYLOAD or STREAMING-*
    presigned: bool
    version: str = ALGORITHM  # s3:signatureversion: AWS4-HMAC-SHA256, or AWS (SigV2)


def uri_encode(s: str, keep_slash: bool = False) -> str:
    """AWS's UriEncode: every byte but ``A-Za-z0-9-._~`` (and ``/`` in paths) as %XX."""
    return quote(s, safe="/~" if keep_slash else "~")


def _split_query(raw: str) -> list[tuple[str, str]]:
    out = []
    for part in raw.split("&"):
        if not part:
            continue
        k, _, v = part.partition("=")
        out.append((unquote(k), unquote(v)))
    return out


def canonical_query(raw_query: str, skip: str = "") -> str:
    pairs = [(uri_encode(k), uri_encode(v)) for k, v in _split_query(raw_query) if k != skip]
    pairs.sort()
    return "&".join(f"{k}={v}" for k, v in pairs)


def _header_value(request: web.Request, name: str) -> str:
    values = request.headers.getall(name, [])
    return ",".join(" ".join(v.split()) for v in values)


def signing_key(secret: str, date: str, region: str, service: str = "s3") -> bytes:
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    k = hmac.new(k, region.encode(), hashlib.sha256).digest()
    k = hmac.new(k, service.encode(), hashlib.sha256).digest()
    return hmac.new(k, b"aws4_request", hashlib.sha256).digest()


def sign(key: bytes, string_to_sign: str) -> str:
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def parse_amz_date(value: str) -> float | None:
    """Seconds since the epoch of an ``X-Amz-Date`` (``20130524T000000Z``) or RFC 1123
    ``Date`` value; None when unparsable."""
    if len(value) == 16 and value[8] == "T" and value[15] == "Z" and value[:8].isdigit():
        # the usual form, without strptime's cost (it is parsed on every request)
        try:
            day = datetime.date(int(value[:4]), int(value[4:6]), int(value[6:8]))
            h, m, s = int(value[9:11]), int(value[11:13]), int(value[13:15])
        except ValueError:
            return None
        if h > 23 or m > 59 or s > 60 or not value[9:15].isdigit():
            return None
        return float(calendar.timegm((day.year, day.month, day.day, h, m, s, 0, 0, 0)))
    try:
        dt = datetime.datetime.strptime(value, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
        return dt.timestamp()
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def _amz_format(ts: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(ts))


class Authenticator:
    """Checks SigV4 signatures against the access keys in the metadata store."""

    def __init__(self, keys: KeyStore, region: str, max_skew: float,
                 sigv2: str = "off") -> None:
        """``sigv2``: how much Signature Version 2 is taken (:data:`tierd.s3.sigv2.MODES`,
        the setting ``s3_allow_sigv2``); off unless the S3 gateway asks for it."""
        self.keys = keys
        self.region = region
        self.max_skew = max_skew
        self.sigv2 = sigv2
        self._key_cache: dict[tuple[str, str, str], bytes] = {}

    def _signing_key(self, secret: str, date: str, region: str) -> bytes:
        ck = (secret, date, region)
        k = self._key_cache.get(ck)
        if k is None:
            if len(self._key_cache) > 256:
                self._key_cache.clear()
            k = self._key_cache[ck] = signing_key(secret, date, region)
        return k

    @staticmethod
    def is_signed(request: web.Request) -> bool:
        q = request.rel_url.query
        return ("Authorization" in request.headers or "X-Amz-Signature" in q
                or "Signature" in q)

    def authenticate(self, request: web.Request, vhost_bucket: str = "") -> Auth | None:
        """The verified signature of ``request``; None when it is not signed at all (an
        anonymous request); S3Error when a signature is present but wrong.
        ``vhost_bucket``: the bucket a virtual-host request named in its Host (SigV2 signs
        it as part of the path)."""
        header = request.headers.get("Authorization")
        q = request.rel_url.query
        if header is not None:
            if header.startswith("AWS "):
                return self._sigv2(request, header, vhost_bucket)
            return self._from_header(request, header)
        if "X-Amz-Signature" in q or "X-Amz-Credential" in q:
            return self._from_query(request)
        if "Signature" in q and "AWSAccessKeyId" in q:
            return self._sigv2(request, None, vhost_bucket)
        return None  # anonymous

    def _sigv2(self, request: web.Request, header: str | None, vhost_bucket: str) -> Auth:
        """A SigV2 request (:mod:`tierd.s3.sigv2`), if ``s3_allow_sigv2`` takes it."""
        sigv2.check_allowed(self.sigv2, request, presigned=header is None)
        if header is None:
            key, signature, ts = sigv2.verify_query(request, self.keys.lookup, vhost_bucket)
        else:
            key, signature, ts = sigv2.verify_header(request, header, self.keys.lookup,
                                                     parse_amz_date, self.max_skew,
                                                     vhost_bucket)
        return Auth(key, identity_of(key), b"", _amz_format(ts), "", signature,
                    sigv2.payload_of(request, UNSIGNED_PAYLOAD), header is None,
                    sigv2.VERSION)

    # -- the two forms -------------------------------------------------------------------
    def _from_header(self, request: web.Request, header: str) -> Auth:
        algo, _, rest = header.partition(" ")
        if algo != ALGORITHM:
            raise S3Error("AuthorizationHeaderMalformed",
                          f"unsupported authorization algorithm {algo!r}; use {ALGORITHM}")
        parts: dict[str, str] = {}
        for item in rest.split(","):
            k, sep, v = item.strip().partition("=")
            if sep:
                parts[k] = v
        if not {"Credential", "SignedHeaders", "Signature"} <= parts.keys():
            raise S3Error("AuthorizationHeaderMalformed", "the Authorization header needs "
                          "Credential, SignedHeaders and Signature")
        amz_date = request.headers.get("X-Amz-Date") or request.headers.get("Date") or ""
        payload = request.headers.get("X-Amz-Content-SHA256")
        if payload is None:
            raise S3Error("InvalidRequest", "Missing required header for this request: "
                          "x-amz-content-sha256")
        ts = parse_amz_date(amz_date)
        if ts is None:
            raise S3Error("AccessDenied", "AWS authentication requires a valid Date or "
                          "x-amz-date header")
        return self._verify(request, parts["Credential"], parts["SignedHeaders"],
                            parts["Signature"], ts, payload, presigned=False,
                            error="AuthorizationHeaderMalformed")

    def _from_query(self, request: web.Request) -> Auth:
        q = request.rel_url.query
        err = "AuthorizationQueryParametersError"
        if q.get("X-Amz-Algorithm") != ALGORITHM:
            raise S3Error(err, f"X-Amz-Algorithm only supports \"{ALGORITHM}\"")
        for name in ("X-Amz-Credential", "X-Amz-Signature", "X-Amz-SignedHeaders",
                     "X-Amz-Date", "X-Amz-Expires"):
            if name not in q:
                raise S3Error(err, f"Query-string authentication requires the {name} "
                              "parameter")
        try:
            expires = int(q["X-Amz-Expires"])
        except ValueError:
            raise S3Error(err, "X-Amz-Expires should be a number") from None
        if expires < 0:
            raise S3Error(err, "X-Amz-Expires must be non-negative")
        if expires > MAX_PRESIGN_EXPIRES:
            raise S3Error(err, "X-Amz-Expires must be less than a week (in seconds) that is "
                          f"{MAX_PRESIGN_EXPIRES}")
        try:
            ts = datetime.datetime.strptime(q["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(
                tzinfo=datetime.UTC).timestamp()
        except ValueError:
            raise S3Error(err, "X-Amz-Date must be in the ISO8601 Long Format "
                          "\"yyyyMMdd'T'HHmmss'Z'\"") from None
        now = time.time()
        if now > ts + expires:
            expired = S3Error("AccessDenied", "Request has expired", Expires=_iso(ts + expires),
                          ServerTime=_iso(now))
            expired.fields["X-Amz-Expires"] = str(expires)
            raise expired
        if ts - now > self.max_skew:
            raise S3Error("AccessDenied", "Request is not valid yet")
        payload = (q.get("X-Amz-Content-Sha256")
                   or request.headers.get("X-Amz-Content-SHA256") or UNSIGNED_PAYLOAD)
        return self._verify(request, q["X-Amz-Credential"], q["X-Amz-SignedHeaders"],
                            q["X-Amz-Signature"], ts, payload, presigned=True, error=err)

    # -- the check itself ----------------------------------------------------------------
    def _verify(self, request: web.Request, credential: str, signed_headers: str,
                signature: str, ts: float, payload: str, *, presigned: bool,
                error: str) -> Auth:
        cparts = credential.rsplit("/", 4)
        if len(cparts) != 5 or cparts[4] != "aws4_request" or cparts[3] != "s3":
            raise S3Error(error, f"malformed credential {credential!r}: expected "
                          "ACCESSKEY/YYYYMMDD/REGION/s3/aws4_request")
        access, date, region = cparts[0], cparts[1], cparts[2]
        amz_date = _amz_format(ts)
        if date != amz_date[:8]:
            raise S3Error(error, f"the credential date {date} is not the request's date "
                          f"{amz_date[:8]}")
        if region != self.region:
            raise S3Error(error, f"the region {region!r} is wrong; expecting "
                          f"{self.region!r}", Region=self.region)
        if not presigned and abs(time.time() - ts) > self.max_skew:
            raise S3Error("RequestTimeTooSkewed", RequestTime=amz_date,
                          ServerTime=_amz_format(time.time()),
                          MaxAllowedSkewMilliseconds=str(int(self.max_skew * 1000)))
        key = self.keys.lookup(access)
        if key is None:
            raise S3Error("InvalidAccessKeyId", AWSAccessKeyId=access)
        names = signed_headers.split(";")
        if "host" not in names:
            raise S3Error(error, "the signed headers must include host")
        skip = "X-Amz-Signature" if presigned else ""
        query = canonical_query(request.rel_url.raw_query_string, skip)
        headers = "".join(f"{n}:{_header_value(request, n)}\n" for n in names)
        raw_path = request.rel_url.raw_path or "/"
        norm_path = uri_encode(unquote(raw_path), keep_slash=True)
        scope = f"{date}/{region}/s3/aws4_request"
        skey = self._signing_key(key.secret, date, region)
        canonical = ""
        string_to_sign = ""
        # bytes: compare_digest refuses str with non-ASCII characters (a TypeError, a 500)
        given = signature.lower().encode("utf-8", "surrogateescape")
        for path in dict.fromkeys((norm_path, raw_path)):
            canonical = "\n".join((request.method, path, query, headers, signed_headers,
                                   payload))
            string_to_sign = "\n".join((ALGORITHM, amz_date, scope, hashlib.sha256(
                canonical.encode("utf-8", "surrogateescape")).hexdigest()))
            if hmac.compare_digest(sign(skey, string_to_sign).encode(), given):
                return Auth(key, identity_of(key), skey, amz_date, scope, signature.lower(),
                            payload, presigned)
        raise S3Error("SignatureDoesNotMatch", AWSAccessKeyId=access,
                      StringToSign=string_to_sign, SignatureProvided=signature,
                      CanonicalRequest=canonical)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
