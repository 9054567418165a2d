"""HTTP preconditions (RFC 7232) on an object's ETag and modification time, evaluated in
one place: the S3 door's GET/HEAD and copy sources, its early answer to a conditional PUT,
and the namespace's check inside the commit of a conditional write all ask here, so the
same header gets the same answer before the body is read and in the transaction.

Pure functions of parsed values: the door parses HTTP dates and picks its error (412, 304,
S3's ``PreconditionFailed``/``NotModified``); the namespace raises its ``FsError``.
"""

from __future__ import annotations

from dataclasses import dataclass

IF_MATCH = "If-Match"
IF_NONE_MATCH = "If-None-Match"
IF_UNMODIFIED_SINCE = "If-Unmodified-Since"
IF_MODIFIED_SINCE = "If-Modified-Since"


def etag_list(value: str) -> list[str]:
    """The entity tags of an ``If-Match``/``If-None-Match`` value: comma-separated, quotes
    and a weak ``W/`` prefix dropped (S3 compares them as strong tags)."""
    return [e.strip().removeprefix("W/").strip('"') for e in value.split(",")]


def etag_matches(value: str, etag: str) -> bool:
    """Whether header ``value`` names ``etag`` (of an object that exists): ``*`` or one of
    its tags."""
    tags = etag_list(value)
    return "*" in tags or etag in tags


@dataclass(frozen=True, slots=True)
class Failed:
    """The condition that decided: ``header`` (one of the ``IF_*`` names) and whether it
    is a "not modified" (``If-None-Match``, ``If-Modified-Since``: 304 for GET and HEAD)
    rather than a failed precondition (412)."""

    header: str
    not_modified: bool


def evaluate(etag: str, mtime_s: int, *, if_match: str | None = None,
             if_none_match: str | None = None, if_unmodified_since: float | None = None,
             if_modified_since: float | None = None, now: float) -> Failed | None:
    """The first precondition an existing object (``etag``, modified at ``mtime_s``)
    fails, in RFC 7232's order, or None.  A date is considered only without its ETag
    counterpart (If-Match overrides If-Unmodified-Since, If-None-Match overrides
    If-Modified-Since); a date the caller could not parse is passed as None (ignored); an
    If-Modified-Since in the future (after ``now``) is ignored, as RFC 7232 says."""
    if if_match is not None:
        if not etag_matches(if_match, etag):
            return Failed(IF_MATCH, False)
    elif if_unmodified_since is not None and mtime_s > if_unmodified_since:
        return Failed(IF_UNMODIFIED_SINCE, False)
    if if_none_match is not None:
        if etag_matches(if_none_match, etag):
            return Failed(IF_NONE_MATCH, True)
    elif (if_modified_since is not None and mtime_s <= if_modified_since
          and if_modified_since <= now):
        return Failed(IF_MODIFIED_SINCE, True)
    return None
