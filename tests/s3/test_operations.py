"""The S3 gateway's one list of operations (tierd/s3/operations.py), checked without a
daemon: every record is reachable from its own declaration (no earlier record shadows
it), names and handlers are unique, and the precedence rules the router has always had
(a claiming sub-resource wins, ``?lifecycle`` on an object is 501, ``?cors`` on an object is
an ordinary parameter, a bad ``list-type`` is InvalidArgument) hold.  The S3 suites check
the same behaviour end to end over HTTP."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, MultiDict

from tierd.acl.policy import BUCKET_ACTIONS, OBJECT_ACTIONS, SERVICE_ACTIONS
from tierd.s3.errors import S3Error
from tierd.s3.operations import COPY_SOURCE, OPERATIONS, UNSUPPORTED, Level, Operation, find


def request_of(op: Operation) -> tuple[MultiDict[str], CIMultiDict[str]]:
    """The smallest query and headers its own declaration says select ``op``."""
    query: MultiDict[str] = MultiDict()
    if op.sub:
        query[op.sub] = ""
    if op.query:
        name, _, value = op.query[0].partition("=")
        query[name] = value
    headers: CIMultiDict[str] = CIMultiDict()
    if op.header:
        headers[op.header] = "/src/key"
    return query, headers


def error_of(method: str, level: Level, query: str, headers: dict[str, str] | None = None
             ) -> tuple[str, int]:
    with pytest.raises(S3Error) as e:
        find(method, level, MultiDict(p.partition("=")[::2] for p in query.split("&") if p),
             CIMultiDict(headers or {}))
    return e.value.code, e.value.status


def found(method: str, level: Level, query: str, headers: dict[str, str] | None = None) -> str:
    q = MultiDict(p.partition("=")[::2] for p in query.split("&") if p)
    return find(method, level, q, CIMultiDict(headers or {})).name


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_every_record_is_found_from_its_declaration(op: Operation) -> None:
    query, headers = request_of(op)
    assert find(op.method, op.level, query, headers) is op


def test_names_and_handlers_are_unique() -> None:
    names = [op.name for op in OPERATIONS]
    assert len(set(names)) == len(names)
    handlers = [op.handler for op in OPERATIONS]
    assert len(set(handlers)) == len(handlers)


def test_actions_follow_the_record() -> None:
    """Object operations are judged on the key, copies on their source too; and only the
    operations whose handlers judge for themselves have no action."""
    by_name = {op.name: op for op in OPERATIONS}
    assert {n for n, op in by_name.items() if op.copy} == {"CopyObject", "UploadPartCopy"}
    assert by_name["CopyObject"].header == COPY_SOURCE
    assert by_name["GetObjectTagging"].on_object and not by_name["GetBucketTagging"].on_object
    assert {n for n, op in by_name.items() if op.action is None} == {
        "PutObjectTagging", "PostObject", "DeleteObjects", "GetBucketPolicy",
        "PutBucketPolicy", "DeleteBucketPolicy", "GetBucketPolicyStatus",
        "GetPublicAccessBlock", "PutPublicAccessBlock", "DeletePublicAccessBlock",
        "GetBucketOwnershipControls", "PutBucketOwnershipControls",
        "DeleteBucketOwnershipControls"}



@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.action],
                         ids=lambda op: op.name)
def test_actions_are_policy_actions_of_their_level(op: Operation) -> None:
    """A record's action is one a bucket policy can name, of its own kind (an object action
    for an object operation): a misspelt or misplaced one could never be granted."""
    kinds = {"service": SERVICE_ACTIONS, "bucket": BUCKET_ACTIONS, "object": OBJECT_ACTIONS}
    assert op.action in kinds[op.level]

def test_precedence() -> None:
    # a claiming sub-resource wins over the selectors of the method, and over later claims
    assert found("GET", "object", "tagging&uploadId=1") == "GetObjectTagging"
    assert found("PUT", "bucket", "tagging&acl") == "PutBucketTagging"
    assert found("GET", "bucket", "policy&policyStatus") == "GetBucketPolicy"
    assert found("GET", "bucket", "ownershipControls&publicAccessBlock") == \
        "GetPublicAccessBlock"
    # a claimed request with another method is 405, never a fall-through
    assert error_of("POST", "bucket", "cors") == ("MethodNotAllowed", 405)
    assert error_of("DELETE", "object", "acl") == ("MethodNotAllowed", 405)
    # bucket sub-resources on an object: ?lifecycle is refused, the others are ignored
    assert error_of("GET", "object", "lifecycle&acl") == ("NotImplemented", 501)
    assert found("GET", "object", "cors") == "GetObject"
    assert found("PUT", "object", "policy") == "PutObject"
    # selectors in record order
    assert found("GET", "bucket", "versions&uploads") == "ListObjectVersions"
    assert found("GET", "bucket", "list-type=2") == "ListObjectsV2"
    assert found("GET", "bucket", "prefix=a") == "ListObjects"
    assert error_of("GET", "bucket", "list-type=1") == ("InvalidArgument", 400)
    assert found("GET", "bucket", "location&list-type=1") == "GetBucketLocation"
    assert found("PUT", "object", "partNumber=1", {"X-Amz-Copy-Source": "/b/k"}) == \
        "UploadPartCopy"
    assert found("PUT", "object", "", {"X-Amz-Copy-Source": "/b/k"}) == "CopyObject"
    assert found("POST", "bucket", "") == "PostObject"
    assert error_of("POST", "object", "foo") == ("NotImplemented", 501)
    # the service: only ListBuckets, whatever the query
    assert found("GET", "service", "tagging&website") == "ListBuckets"
    assert error_of("PUT", "service", "") == ("MethodNotAllowed", 405)


@pytest.mark.parametrize("sub", sorted(UNSUPPORTED))
def test_unsupported_sub_resources_are_501(sub: str) -> None:
    cases: tuple[tuple[str, Level], ...] = (("GET", "bucket"), ("PUT", "object"),
                                            ("DELETE", "bucket"))
    for method, level in cases:
        assert error_of(method, level, f"{sub}&tagging") == ("NotImplemented", 501)
