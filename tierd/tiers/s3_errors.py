"""How the S3 engine (``s3_tier.py``) maps S3's error codes to the tier's few errors (see
``object_tier.py``): a whole response's code, and each key's in a ``DeleteObjects`` answer,
so that a key deleted in a batch fails exactly as :meth:`S3ObjectTier.delete` would."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tierd.tiers.object_tier import (
    KeyRejected,
    ObjectChanged,
    ObjectNotFound,
    TierError,
    TierThrottled,
    TierUnavailable,
)

NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
#: the store answered "slow down": up, and busy (TierThrottled)
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
              "TooManyRequests", "429"}
_UNAVAILABLE = {
    "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeTooSkewed",
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "AllAccessDisabled", "AccountProblem", "403",
}
_KEY_REJECTED = {"KeyTooLongError", "InvalidObjectName"}
#: characters an XML 1.0 body cannot carry (or that its parsers turn into others: CR); a
#: key with one cannot go in a ``DeleteObjects`` request
XML_UNSAFE = re.compile("[\x01-\x08\x0b-\x1f\ufffe\uffff]")


def code_error(code: str, status: int, key: str | None, msg: str, where: str,
               bucket: str) -> TierError:
    """The error of S3 error ``code`` (HTTP ``status``, 0 when unknown) for ``key`` in the
    store at ``where``; ``bucket`` is the tier's ("" in the per-bucket layout, where a
    missing bucket means a missing object, not a missing store)."""
    if code in NOT_FOUND:
        return ObjectNotFound(f"no object {key!r} in {where}", key=key)
    if code == "NoSuchBucket":
        if not bucket:
            return ObjectNotFound(f"no object {key!r} (no such bucket)", key=key)
        return TierUnavailable(f"cold bucket {bucket!r} does not exist at {where}", key=key)
    if code in _KEY_REJECTED:
        return KeyRejected(f"cold store refused the key: {msg}", key=key)
    if code in ("PreconditionFailed", "412") or status == 412:
        return ObjectChanged(f"{key!r} changed in {where}", key=key)
    if code in _THROTTLED or status == 429:
        return TierThrottled(f"cold store throttled the request: {msg}", key=key)
    if status >= 500 or status in (401, 403) or code in _UNAVAILABLE:
        return TierUnavailable(f"cold store failed: {msg}", key=key)
    return TierError(f"cold store refused: {msg}", key=key)


def bare_503(response: Mapping[str, Any]) -> bool:
    """Whether an error ``response`` is a 503 without an S3 error code: a HEAD's (its
    answer has no body; botocore names the error by its status), which does not tell
    throttling (``SlowDown``) from a store that is down (``ServiceUnavailable``)."""
    return str(response.get("Error", {}).get("Code", "")) == "503"


def delete_errors(errors: Sequence[Mapping[str, Any]], names: Mapping[str, str], where: str,
                  bucket: str) -> dict[str, TierError | None]:
    """Each key's outcome of a ``DeleteObjects`` whose answer listed ``errors`` (Quiet: only
    failures are listed); ``names`` maps the request's S3 names to tierd keys.  A missing
    key is deleted (as S3's own ``DeleteObject`` says)."""
    out: dict[str, TierError | None] = dict.fromkeys(names.values(), None)
    for err in errors:
        key = names.get(str(err.get("Key", "")))
        code = str(err.get("Code", ""))
        if key is None or code in NOT_FOUND:
            continue
        msg = f"delete {key} in {where}: {code} {err.get('Message', '')}"
        out[key] = code_error(code, 0, key, msg, where, bucket)
    return out
