"""Bucket policies over tags: the ``s3:ExistingObjectTag/<key>`` condition keys (the object's
stored tags) and ``s3:RequestObjectTag/<key>`` (the tags of ``x-amz-tagging`` or of a
PutObjectTagging body), and the tagging actions judged like every other call; boto3,
unsigned HTTP and the AWS CLI against a real daemon."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from botocore.exceptions import ClientError

from . import test_clients
from .conftest import USER_KEY, Daemon, assert_error
from .test_policy import arn, doc, stmt

aws = test_clients.aws  # the AWS CLI (s3api) as a fixture, with the root key
ALICE = {"AWS": [USER_KEY]}


def tagset(**tags: str) -> dict[str, Any]:
    return {"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]}


@pytest.fixture
def policy(s3: Any, bucket: str) -> Iterator[Callable[..., None]]:
    """Sets the bucket's policy; removes it afterwards (root may, whatever it says), so the
    bucket can be emptied."""
    def put(*statements: dict[str, Any]) -> None:
        s3.put_bucket_policy(Bucket=bucket, Policy=doc(*statements))
    yield put
    with contextlib.suppress(ClientError):
        s3.delete_bucket_policy(Bucket=bucket)


def test_existing_object_tag_allows_get(s3: Any, alice: Any, bucket: str,
                                        policy: Callable[..., None]) -> None:
    s3.put_object(Bucket=bucket, Key="pub", Body=b"p", Tagging="class=public")
    s3.put_object(Bucket=bucket, Key="sec", Body=b"s", Tagging="class=secret")
    s3.put_object(Bucket=bucket, Key="none", Body=b"n")
    policy(stmt("Allow", ALICE, "s3:GetObject", arn(bucket, "*"),
                Condition={"StringEquals": {"s3:ExistingObjectTag/class": "public"}}))
    assert alice.get_object(Bucket=bucket, Key="pub")["Body"].read() == b"p"
    assert alice.head_object(Bucket=bucket, Key="pub")["ContentLength"] == 1
    assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="sec")
    assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="none")
    # re-tagging changes the decision at once
    s3.put_object_tagging(Bucket=bucket, Key="sec", Tagging=tagset(**{"class": "public"}))
    assert alice.get_object(Bucket=bucket, Key="sec")["Body"].read() == b"s"


def test_existing_object_tag_of_the_version_asked_for(s3: Any, alice: Any, bucket: str,
                                                     alice_bucket: str,
                                                     policy: Callable[..., None]) -> None:
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    v1 = s3.put_object(Bucket=bucket, Key="k", Body=b"1", Tagging="class=public")["VersionId"]
    v2 = s3.put_object(Bucket=bucket, Key="k", Body=b"2")["VersionId"]
    policy(stmt("Allow", ALICE, ["s3:GetObject", "s3:GetObjectVersion"], arn(bucket, "*"),
                Condition={"StringEquals": {"s3:ExistingObjectTag/class": "public"}}))
    assert alice.get_object(Bucket=bucket, Key="k", VersionId=v1)["Body"].read() == b"1"
    assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="k")
    assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="k", VersionId=v2)
    alice.copy_object(Bucket=alice_bucket, Key="c",
                      CopySource={"Bucket": bucket, "Key": "k", "VersionId": v1})
    assert_error("AccessDenied", 403, alice.copy_object, Bucket=alice_bucket, Key="d",
                 CopySource={"Bucket": bucket, "Key": "k", "VersionId": v2})


def test_existing_object_tag_judges_the_copy_source(s3: Any, alice: Any, bucket: str,
                                                    alice_bucket: str,
                                                    policy: Callable[..., None]) -> None:
    s3.put_object(Bucket=bucket, Key="pub", Body=b"p", Tagging="class=public")
    s3.put_object(Bucket=bucket, Key="sec", Body=b"s")
    policy(stmt("Allow", ALICE, "s3:GetObject", arn(bucket, "*"),
                Condition={"StringEquals": {"s3:ExistingObjectTag/class": "public"}}))
    alice.copy_object(Bucket=alice_bucket, Key="c", CopySource={"Bucket": bucket, "Key": "pub"})
    assert alice.get_object(Bucket=alice_bucket, Key="c")["Body"].read() == b"p"
    assert_error("AccessDenied", 403, alice.copy_object, Bucket=alice_bucket, Key="d",
                 CopySource={"Bucket": bucket, "Key": "sec"})


def test_existing_object_tag_deny_locks_tagging_calls(s3: Any, bucket: str,
                                                      policy: Callable[..., None]) -> None:
    s3.put_object(Bucket=bucket, Key="locked", Body=b"x", Tagging="locked=true")
    s3.put_object(Bucket=bucket, Key="open", Body=b"y", Tagging="locked=false")
    policy(stmt("Deny", "*", ["s3:PutObjectTagging", "s3:DeleteObjectTagging"],
                arn(bucket, "*"),
                Condition={"StringEquals": {"s3:ExistingObjectTag/locked": "true"}}))
    assert_error("AccessDenied", 403, s3.put_object_tagging, Bucket=bucket, Key="locked",
                 Tagging=tagset(locked="false"))
    assert_error("AccessDenied", 403, s3.delete_object_tagging, Bucket=bucket, Key="locked")
    s3.put_object_tagging(Bucket=bucket, Key="open", Tagging=tagset(locked="false", n="1"))
    assert s3.get_object_tagging(Bucket=bucket, Key="locked")["TagSet"] == [
        {"Key": "locked", "Value": "true"}]
    assert s3.get_object(Bucket=bucket, Key="locked")["Body"].read() == b"x"


def test_existing_object_tag_allows_reading_tags(s3: Any, alice: Any, bucket: str,
                                                 policy: Callable[..., None]) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", Tagging="team=ml")
    assert_error("AccessDenied", 403, alice.get_object_tagging, Bucket=bucket, Key="k")
    policy(stmt("Allow", ALICE, "s3:GetObjectTagging", arn(bucket, "*"),
                Condition={"StringEquals": {"s3:ExistingObjectTag/team": "ml"}}))
    assert alice.get_object_tagging(Bucket=bucket, Key="k")["TagSet"] == [
        {"Key": "team", "Value": "ml"}]
    assert_error("AccessDenied", 403, alice.get_object, Bucket=bucket, Key="k")


def test_tag_condition_keys_ignore_case(s3: Any, alice: Any, bucket: str,
                                        policy: Callable[..., None]) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", Tagging="Class=public")
    policy(stmt("Allow", ALICE, "s3:GetObject", arn(bucket, "*"),
                Condition={"StringEquals": {"S3:existingObjectTag/CLASS": "public"}}))
    assert alice.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"


def test_request_object_tag_on_put_object(s3: Any, bucket: str,
                                          policy: Callable[..., None]) -> None:
    policy(stmt("Deny", "*", "s3:PutObject", arn(bucket, "*"),
                Condition={"StringNotEquals": {"s3:RequestObjectTag/project": "alpha"}}))
    assert_error("AccessDenied", 403, s3.put_object, Bucket=bucket, Key="a", Body=b"x")
    assert_error("AccessDenied", 403, s3.put_object, Bucket=bucket, Key="a", Body=b"x",
                 Tagging="project=beta")
    s3.put_object(Bucket=bucket, Key="a", Body=b"x", Tagging="project=alpha&n=1")
    assert s3.get_object(Bucket=bucket, Key="a")["TagCount"] == 2


def test_malformed_tagging_header_under_a_policy(s3: Any, bucket: str,
                                                policy: Callable[..., None]) -> None:
    """Where the condition keys are read, a bad x-amz-tagging stays the handler's
    InvalidArgument on a write, and is ignored on a read, as S3 does."""
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    policy(stmt("Allow", "*", "s3:GetObject", arn(bucket, "*"),
                Condition={"StringEquals": {"s3:RequestObjectTag/a": "1"}}))
    assert_error("InvalidArgument", 400, s3.put_object, Bucket=bucket, Key="j", Body=b"x",
                 Tagging="a=%zz")

    def bad_header(request: Any, **_: Any) -> None:
        request.headers["x-amz-tagging"] = "a=%zz"
    s3.meta.events.register("before-sign.s3.GetObject", bad_header)
    try:
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"
    finally:
        s3.meta.events.unregister("before-sign.s3.GetObject", bad_header)


def test_request_object_tag_on_copy_and_create_multipart(s3: Any, bucket: str,
                                                         policy: Callable[..., None]) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"x", Tagging="project=alpha")
    policy(stmt("Deny", "*", "s3:PutObject", arn(bucket, "*"),
                Condition={"StringNotEquals": {"s3:RequestObjectTag/project": "alpha"}}))
    src = {"Bucket": bucket, "Key": "src"}
    assert_error("AccessDenied", 403, s3.copy_object, Bucket=bucket, Key="c", CopySource=src)
    s3.copy_object(Bucket=bucket, Key="c", CopySource=src, TaggingDirective="REPLACE",
                   Tagging="project=alpha")
    assert_error("AccessDenied", 403, s3.create_multipart_upload, Bucket=bucket, Key="m",
                 Tagging="project=beta")
    up = s3.create_multipart_upload(Bucket=bucket, Key="m", Tagging="project=alpha")
    s3.abort_multipart_upload(Bucket=bucket, Key="m", UploadId=up["UploadId"])


def test_request_object_tag_of_put_object_tagging_body(s3: Any, alice: Any, bucket: str,
                                                       policy: Callable[..., None]) -> None:
    """PutObjectTagging is judged on the tags of its body: an Allow for alice only when
    she sets class=ok, a Deny for everyone who sets class=forbidden."""
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    policy(stmt("Allow", ALICE, "s3:PutObjectTagging", arn(bucket, "*"),
                Condition={"StringEquals": {"s3:RequestObjectTag/class": "ok"}}),
           stmt("Deny", "*", "s3:PutObjectTagging", arn(bucket, "*"),
                Condition={"StringEquals": {"s3:RequestObjectTag/class": "forbidden"}}))
    alice.put_object_tagging(Bucket=bucket, Key="k", Tagging=tagset(**{"class": "ok"}))
    assert_error("AccessDenied", 403, alice.put_object_tagging, Bucket=bucket, Key="k",
                 Tagging=tagset(**{"class": "other"}))
    assert_error("AccessDenied", 403, s3.put_object_tagging, Bucket=bucket, Key="k",
                 Tagging=tagset(**{"class": "forbidden"}))
    assert s3.get_object_tagging(Bucket=bucket, Key="k")["TagSet"] == [
        {"Key": "class", "Value": "ok"}]


def test_anonymous_object_tagging_allowed_by_policy(daemon: Daemon, s3: Any, bucket: str,
                                                    policy: Callable[..., None]) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", Tagging="a=1")
    url = f"{daemon.url}/{bucket}/k?tagging"
    assert requests.get(url, timeout=10).status_code == 403
    policy(stmt("Allow", "*", "s3:GetObjectTagging", arn(bucket, "k")))
    r = requests.get(url, timeout=10)
    assert r.status_code == 200 and "<Key>a</Key><Value>1</Value>" in r.text, r.text
    body = b"<Tagging><TagSet><Tag><Key>b</Key><Value>2</Value></Tag></TagSet></Tagging>"
    assert requests.put(url, data=body, timeout=10).status_code == 403


def test_bucket_tagging_by_policy(s3: Any, alice: Any, bucket: str,
                                  policy: Callable[..., None]) -> None:
    s3.put_bucket_tagging(Bucket=bucket, Tagging=tagset(team="ml"))
    assert_error("AccessDenied", 403, alice.get_bucket_tagging, Bucket=bucket)
    policy(stmt("Allow", ALICE, ["s3:GetBucketTagging", "s3:PutBucketTagging"], arn(bucket)))
    assert alice.get_bucket_tagging(Bucket=bucket)["TagSet"] == [{"Key": "team",
                                                                   "Value": "ml"}]
    alice.put_bucket_tagging(Bucket=bucket, Tagging=tagset(team="infra"))
    alice.delete_bucket_tagging(Bucket=bucket)  # DeleteBucketTagging is s3:PutBucketTagging
    assert_error("NoSuchTagSet", 404, s3.get_bucket_tagging, Bucket=bucket)


def test_explicit_deny_binds_the_bucket_owner(s3: Any, bucket: str,
                                              policy: Callable[..., None]) -> None:
    policy(stmt("Deny", "*", "s3:PutBucketTagging", arn(bucket)))
    assert_error("AccessDenied", 403, s3.put_bucket_tagging, Bucket=bucket,
                 Tagging=tagset(a="1"))
    assert_error("AccessDenied", 403, s3.delete_bucket_tagging, Bucket=bucket)


@pytest.mark.parametrize("key", ["s3:ExistingObjectTag/", "s3:RequestObjectTag/",
                                 "s3:ResourceTag/x"])
def test_malformed_tag_condition_keys(s3: Any, bucket: str, key: str) -> None:
    e = assert_error("MalformedPolicy", 400, s3.put_bucket_policy, Bucket=bucket,
                     Policy=doc(stmt("Allow", "*", "s3:GetObject", arn(bucket, "*"),
                                     Condition={"StringEquals": {key: "v"}})))
    assert "unknown condition key" in e["Error"]["Message"]


def test_aws_cli_put_object_tagging_under_a_policy(aws: Callable[..., str], s3: Any,
                                                   bucket: str,
                                                   policy: Callable[..., None]) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    policy(stmt("Deny", "*", "s3:PutObjectTagging", arn(bucket, "*"),
                Condition={"StringNotEquals": {"s3:RequestObjectTag/env": "prod"}}))
    with pytest.raises(AssertionError, match="denied by the bucket policy"):
        aws("s3api", "put-object-tagging", "--bucket", bucket, "--key", "k", "--tagging",
            json.dumps(tagset(env="dev")))
    aws("s3api", "put-object-tagging", "--bucket", bucket, "--key", "k", "--tagging",
        json.dumps(tagset(env="prod")))
    assert s3.get_object_tagging(Bucket=bucket, Key="k")["TagSet"] == [
        {"Key": "env", "Value": "prod"}]
