"""The ``prefix`` of the placement endpoints and jobs, checked before any work starts.

A prefix is ``bucket/key-prefix`` (``""``: everything; no ``/``: a prefix of bucket names).
Without this check an operator's typo passed silently: ``warmup nosuch/`` warmed nothing
and answered zero, and ``pin nosuch/`` stored a policy for a bucket that does not exist.
Now a prefix whose bucket does not exist is ``404 no_such_bucket``, and one that cannot name
anything (not a string, a NUL character, a lone surrogate) is
``400 bad_request`` -- before a streaming answer has started, so the status code says it.
"""

from __future__ import annotations

from aiohttp import web

from tierd.admin.backend import json_error
from tierd.meta import MetaStore


class NoSuchBucket(LookupError):
    """The prefix names a bucket that does not exist (the message says which)."""


def check_prefix(meta: MetaStore, prefix: object, need_bucket: bool = True) -> str:
    """``prefix`` if it can name files here; ValueError (bad) or :class:`NoSuchBucket`.
    ``need_bucket=False`` checks only the form (removing a policy or a pin must work after
    its bucket is gone)."""
    if not isinstance(prefix, str):
        raise ValueError("prefix must be a string (bucket/key-prefix)")
    if "\0" in prefix:
        raise ValueError("prefix must not contain a NUL character")
    try:  # as the namespace encodes names (surrogateescape: the bytes of non-UTF-8 names)
        prefix.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ValueError("prefix is not a file name (a lone surrogate)") from None
    if not prefix or not need_bucket:
        return prefix
    bucket, sep, _ = prefix.partition("/")
    with meta.snapshot() as tx:
        if sep:
            found = tx.get_bucket(bucket) is not None
        else:
            found = any(b.name.startswith(bucket) for b in tx.list_buckets())
    if not found:
        what = (f"no such bucket {bucket!r}" if sep
                else f"no such bucket: no bucket name starts with {bucket!r}")
        raise NoSuchBucket(f"{what} (tierctl bucket list shows the buckets)")
    return prefix


def prefix_error(e: Exception) -> web.Response:
    """The answer to a failed :func:`check_prefix`."""
    if isinstance(e, NoSuchBucket):
        return json_error(404, "no_such_bucket", str(e))
    return json_error(400, "bad_request", str(e))
