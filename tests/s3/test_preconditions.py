"""RFC 7232 preconditions, evaluated in one place (:mod:`tierd.preconditions`): the rules on
their own, and a conditional PUT whose early check (before the body) and commit check (in
the transaction) now read the same If-Match the same way."""

from __future__ import annotations

from typing import Any

from tierd.preconditions import (
    IF_MATCH,
    IF_MODIFIED_SINCE,
    IF_NONE_MATCH,
    IF_UNMODIFIED_SINCE,
    Failed,
    etag_matches,
    evaluate,
)

from .conftest import assert_error

NOW = 1_700_000_000.0


def test_etag_lists() -> None:
    assert etag_matches('"abc"', "abc") and etag_matches("abc", "abc")
    assert etag_matches('W/"abc"', "abc") and etag_matches('"x", "abc"', "abc")
    assert etag_matches("*", "abc") and not etag_matches('"x"', "abc")


def test_evaluation_order() -> None:
    def ev(**kw: Any) -> Failed | None:
        return evaluate("abc", 1000, now=NOW, **kw)

    assert ev() is None
    assert ev(if_match='"x"') == Failed(IF_MATCH, False)
    assert ev(if_unmodified_since=999) == Failed(IF_UNMODIFIED_SINCE, False)
    assert ev(if_match="abc", if_unmodified_since=999) is None  # If-Match wins
    assert ev(if_none_match="abc") == Failed(IF_NONE_MATCH, True)
    assert ev(if_modified_since=1000) == Failed(IF_MODIFIED_SINCE, True)
    assert ev(if_modified_since=999) is None
    assert ev(if_modified_since=NOW + 10) is None  # a future date is ignored
    assert ev(if_none_match='"x"', if_modified_since=1000) is None  # If-None-Match wins
    assert ev(if_match='"x"', if_none_match="abc") == Failed(IF_MATCH, False)  # 412 first


def test_put_if_match_with_a_list(s3: Any, bucket: str) -> None:
    """If-Match naming the current ETag among others: the early check and the commit agree
    (the commit compared the whole value as one tag and answered 412 after the early check
    had let the body in)."""
    etag = s3.put_object(Bucket=bucket, Key="k", Body=b"1")["ETag"]
    s3.put_object(Bucket=bucket, Key="k", Body=b"2", IfMatch=f'"other", {etag}')
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"2"
    assert_error("PreconditionFailed", 412, s3.put_object, Bucket=bucket, Key="k",
                 Body=b"3", IfMatch=f'"other", {etag}')
