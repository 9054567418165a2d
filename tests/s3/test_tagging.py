"""Object and bucket tagging through boto3 and the AWS CLI (``s3api``) against a real daemon:
Get/Put/DeleteObjectTagging, ``x-amz-tagging`` on PutObject, CreateMultipartUpload and
CopyObject (``x-amz-tagging-directive``), ``x-amz-tagging-count``, Get/Put/DeleteBucketTagging,
S3's limits and error codes, the POSIX checks, and tags surviving kill -9."""

from __future__ import annotations

import io
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import minio
import minio.commonconfig
import pytest
import requests

from . import test_clients
from .conftest import REGION, ROOT_KEY, ROOT_SECRET, Daemon, assert_error, start_daemon
from .test_auth import send, signed

aws = test_clients.aws  # the AWS CLI (s3api) as a fixture, with the root key


def tagset(**tags: str) -> dict[str, Any]:
    return {"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]}


def tags_of(s3: Any, bucket: str, key: str, **kw: Any) -> dict[str, str]:
    return {t["Key"]: t["Value"]
            for t in s3.get_object_tagging(Bucket=bucket, Key=key, **kw)["TagSet"]}


# -- object tags ----------------------------------------------------------------------------

def test_put_get_delete_object_tagging_keeps_etag_and_time(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"data")
    before = s3.head_object(Bucket=bucket, Key="k")
    assert s3.get_object_tagging(Bucket=bucket, Key="k")["TagSet"] == []
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tagset(a="1", b="two words"))
    assert tags_of(s3, bucket, "k") == {"a": "1", "b": "two words"}
    after = s3.head_object(Bucket=bucket, Key="k")
    assert after["ETag"] == before["ETag"]
    assert after["LastModified"] == before["LastModified"]
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"data"
    r = s3.delete_object_tagging(Bucket=bucket, Key="k")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert s3.get_object_tagging(Bucket=bucket, Key="k")["TagSet"] == []
    assert s3.head_object(Bucket=bucket, Key="k")["ETag"] == before["ETag"]


def test_put_object_tagging_replaces_the_whole_set(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tagset(a="1", b="2"))
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tagset(c="3"))
    assert tags_of(s3, bucket, "k") == {"c": "3"}
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging={"TagSet": []})
    assert tags_of(s3, bucket, "k") == {}


def test_tag_order_and_special_characters_round_trip(s3: Any, bucket: str) -> None:
    tags = [("z", "last?"), ("ключ", "знач ение"), ("a+b", "c&d=e"), ("empty", "")]
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    s3.put_object_tagging(Bucket=bucket, Key="k",
                          Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in tags]})
    got = s3.get_object_tagging(Bucket=bucket, Key="k")["TagSet"]
    assert [(t["Key"], t["Value"]) for t in got] == tags


def test_put_object_with_tagging_header_and_tag_count(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", Tagging="a=1&b=two%20words&c=x+y&d")
    assert tags_of(s3, bucket, "k") == {"a": "1", "b": "two words", "c": "x y", "d": ""}
    assert s3.get_object(Bucket=bucket, Key="k")["TagCount"] == 4
    head = s3.head_object(Bucket=bucket, Key="k")
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-amz-tagging-count"] == "4"


def test_no_tag_count_header_without_tags(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert "TagCount" not in s3.get_object(Bucket=bucket, Key="k")


def test_empty_tagging_header_stores_no_tags(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", Tagging="")
    assert tags_of(s3, bucket, "k") == {}


def test_overwrite_without_tagging_drops_tags(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"1", Tagging="a=1")
    s3.put_object(Bucket=bucket, Key="k", Body=b"2")
    assert tags_of(s3, bucket, "k") == {}


def test_tags_are_not_returned_as_metadata(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", Tagging="a=1", Metadata={"m": "v"})
    head = s3.head_object(Bucket=bucket, Key="k")
    assert head["Metadata"] == {"m": "v"}
    assert not any("tierd" in h for h in head["ResponseMetadata"]["HTTPHeaders"])


def test_multipart_upload_tags_apply_at_completion(s3: Any, bucket: str) -> None:
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp", Tagging="stage=raw&n=1")
    etag = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up["UploadId"], PartNumber=1,
                          Body=b"p" * 100)["ETag"]
    assert_error("NoSuchKey", 404, s3.get_object_tagging, Bucket=bucket, Key="mp")
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert tags_of(s3, bucket, "mp") == {"stage": "raw", "n": "1"}
    assert s3.get_object(Bucket=bucket, Key="mp")["TagCount"] == 2


def test_create_multipart_upload_refuses_bad_tags(s3: Any, bucket: str) -> None:
    assert_error("InvalidTag", 400, s3.create_multipart_upload, Bucket=bucket, Key="mp",
                 Tagging="aws:x=1")
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_copy_object_copies_tags_by_default(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"x", Tagging="a=1")
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    assert tags_of(s3, bucket, "dst") == {"a": "1"}


def test_copy_object_tagging_directive_copy_ignores_header(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"x", Tagging="a=1")
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"},
                   TaggingDirective="COPY", Tagging="b=2")
    assert tags_of(s3, bucket, "dst") == {"a": "1"}


def test_copy_object_tagging_directive_replace(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"x", Tagging="a=1")
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"},
                   TaggingDirective="REPLACE", Tagging="b=2")
    assert tags_of(s3, bucket, "dst") == {"b": "2"}
    s3.copy_object(Bucket=bucket, Key="dst2", CopySource={"Bucket": bucket, "Key": "src"},
                   TaggingDirective="REPLACE")
    assert tags_of(s3, bucket, "dst2") == {}
    assert tags_of(s3, bucket, "src") == {"a": "1"}


def test_copy_object_metadata_replace_keeps_tags_by_tagging_directive(s3: Any,
                                                                       bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", Tagging="a=1")
    s3.copy_object(Bucket=bucket, Key="k", CopySource={"Bucket": bucket, "Key": "k"},
                   MetadataDirective="REPLACE", Metadata={"m": "1"})
    assert tags_of(s3, bucket, "k") == {"a": "1"}
    assert s3.head_object(Bucket=bucket, Key="k")["Metadata"] == {"m": "1"}


def test_copy_object_unknown_tagging_directive(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"x")
    assert_error("InvalidArgument", 400, s3.copy_object, Bucket=bucket, Key="dst",
                 CopySource={"Bucket": bucket, "Key": "src"}, TaggingDirective="MERGE")


def test_object_tagging_of_missing_key_and_bucket(s3: Any, bucket: str) -> None:
    assert_error("NoSuchKey", 404, s3.get_object_tagging, Bucket=bucket, Key="nope")
    assert_error("NoSuchKey", 404, s3.put_object_tagging, Bucket=bucket, Key="nope",
                 Tagging=tagset(a="1"))
    assert_error("NoSuchKey", 404, s3.delete_object_tagging, Bucket=bucket, Key="nope")
    assert_error("NoSuchBucket", 404, s3.get_object_tagging, Bucket="no-such-bkt", Key="k")


def test_version_id_null_is_the_object(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    r = s3.put_object_tagging(Bucket=bucket, Key="k", VersionId="null", Tagging=tagset(a="1"))
    assert r["VersionId"] == "null"
    got = s3.get_object_tagging(Bucket=bucket, Key="k", VersionId="null")
    assert got["VersionId"] == "null" and got["TagSet"] == [{"Key": "a", "Value": "1"}]
    s3.delete_object_tagging(Bucket=bucket, Key="k", VersionId="null")
    assert tags_of(s3, bucket, "k") == {}


def test_unknown_version_id_is_refused(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    e = assert_error("InvalidArgument", 400, s3.get_object_tagging, Bucket=bucket, Key="k",
                     VersionId="3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY")
    assert e["Error"]["ArgumentName"] == "versionId"


def test_tagging_a_noncurrent_version(s3: Any, bucket: str) -> None:
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    v1 = s3.put_object(Bucket=bucket, Key="k", Body=b"1", Tagging="gen=1")["VersionId"]
    v2 = s3.put_object(Bucket=bucket, Key="k", Body=b"2", Tagging="gen=2")["VersionId"]
    assert tags_of(s3, bucket, "k", VersionId=v1) == {"gen": "1"}
    got = s3.get_object_tagging(Bucket=bucket, Key="k")
    assert got["VersionId"] == v2 and got["TagSet"] == [{"Key": "gen", "Value": "2"}]
    r = s3.put_object_tagging(Bucket=bucket, Key="k", VersionId=v1, Tagging=tagset(old="yes"))
    assert r["VersionId"] == v1
    assert tags_of(s3, bucket, "k", VersionId=v1) == {"old": "yes"}
    assert tags_of(s3, bucket, "k") == {"gen": "2"}
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=v1)["TagCount"] == 1
    s3.delete_object_tagging(Bucket=bucket, Key="k", VersionId=v2)
    assert tags_of(s3, bucket, "k", VersionId=v2) == {}
    # tagging makes no version and moves none
    listed = s3.list_object_versions(Bucket=bucket, Prefix="k")["Versions"]
    assert [(v["VersionId"], v["IsLatest"]) for v in listed] == [(v2, True), (v1, False)]


def test_tagging_of_delete_markers_and_missing_versions(s3: Any, bucket: str) -> None:
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    v1 = s3.put_object(Bucket=bucket, Key="k", Body=b"1")["VersionId"]
    marker = s3.delete_object(Bucket=bucket, Key="k")["VersionId"]
    e = assert_error("NoSuchKey", 404, s3.get_object_tagging, Bucket=bucket, Key="k")
    assert e["ResponseMetadata"]["HTTPHeaders"]["x-amz-delete-marker"] == "true"
    assert_error("MethodNotAllowed", 405, s3.put_object_tagging, Bucket=bucket, Key="k",
                 VersionId=marker, Tagging=tagset(a="1"))
    s3.put_object_tagging(Bucket=bucket, Key="k", VersionId=v1, Tagging=tagset(a="1"))
    assert tags_of(s3, bucket, "k", VersionId=v1) == {"a": "1"}
    missing = "0" * 16
    assert_error("NoSuchVersion", 404, s3.get_object_tagging, Bucket=bucket, Key="k",
                 VersionId=missing)


def test_directory_marker_keys_take_tags(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="dir/", Body=b"")
    s3.put_object_tagging(Bucket=bucket, Key="dir/", Tagging=tagset(kind="dir"))
    assert tags_of(s3, bucket, "dir/") == {"kind": "dir"}


# -- limits and errors -----------------------------------------------------------------------

def test_ten_object_tags_allowed_eleven_refused(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    ten = {f"k{i}": str(i) for i in range(10)}
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tagset(**ten))
    assert tags_of(s3, bucket, "k") == ten
    assert_error("InvalidTag", 400, s3.put_object_tagging, Bucket=bucket, Key="k",
                 Tagging=tagset(**ten, k10="x"))
    assert tags_of(s3, bucket, "k") == ten


def test_eleven_tags_in_header_refused(s3: Any, bucket: str) -> None:
    header = "&".join(f"k{i}=v" for i in range(11))
    assert_error("InvalidTag", 400, s3.put_object, Bucket=bucket, Key="k", Body=b"x",
                 Tagging=header)
    assert_error("NoSuchKey", 404, s3.get_object, Bucket=bucket, Key="k")


def test_key_and_value_lengths_count_unicode_characters(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    key, value = "ж" * 128, "ж" * 256  # 256 and 512 bytes of UTF-8: characters count
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tagset(**{key: value}))
    assert tags_of(s3, bucket, "k") == {key: value}
    assert_error("InvalidTag", 400, s3.put_object_tagging, Bucket=bucket, Key="k",
                 Tagging=tagset(**{"ж" * 129: "v"}))
    assert_error("InvalidTag", 400, s3.put_object_tagging, Bucket=bucket, Key="k",
                 Tagging=tagset(k="ж" * 257))


def test_duplicate_keys_in_body_are_invalid_tag(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert_error("InvalidTag", 400, s3.put_object_tagging, Bucket=bucket, Key="k",
                 Tagging={"TagSet": [{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}]})


def test_aws_prefix_is_reserved(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert_error("InvalidTag", 400, s3.put_object_tagging, Bucket=bucket, Key="k",
                 Tagging=tagset(**{"aws:cloudformation": "x"}))
    assert_error("InvalidTag", 400, s3.put_object, Bucket=bucket, Key="k2", Body=b"x",
                 Tagging="AWS:x=1")


def test_empty_tag_key_is_invalid_tag(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")  # (boto3 refuses to send one)
    body = b"<Tagging><TagSet><Tag><Key></Key><Value>x</Value></Tag></TagSet></Tagging>"
    r = send(signed(daemon, "PUT", f"/{bucket}/k?tagging", body)[0])
    assert r.status_code == 400 and "<Code>InvalidTag</Code>" in r.text, r.text
    assert_error("InvalidTag", 400, s3.put_object, Bucket=bucket, Key="k", Body=b"x",
                 Tagging="=x")


@pytest.mark.parametrize("body", [
    b"<Tagging><TagSet><Tag><Key>a</Key>",  # not well-formed
    b"<Tagging></Tagging>",  # no TagSet
    b"<Tagging><TagSet><Tag><Key>a</Key></Tag></TagSet></Tagging>",  # no Value
    b"<Tagging><TagSet><Tag><Value>a</Value></Tag></TagSet></Tagging>",  # no Key
    b"<Tagging><TagSet><Other/></TagSet></Tagging>",
    b"<Tags><TagSet/></Tags>",  # wrong root
    b"",
])
def test_malformed_tagging_documents(daemon: Daemon, s3: Any, bucket: str,
                                     body: bytes) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    for path in (f"/{bucket}/k?tagging", f"/{bucket}?tagging"):
        r = send(signed(daemon, "PUT", path, body)[0])
        assert r.status_code == 400 and "<Code>MalformedXML</Code>" in r.text, (path, r.text)
    assert tags_of(s3, bucket, "k") == {}


@pytest.mark.parametrize("header", ["a=%zz", "a=%ff", "a=1&a=2", "%c3%28=x"])
def test_bad_tagging_header_is_invalid_argument(s3: Any, bucket: str, header: str) -> None:
    e = assert_error("InvalidArgument", 400, s3.put_object, Bucket=bucket, Key="k", Body=b"x",
                     Tagging=header)
    assert e["Error"]["ArgumentName"] == "x-amz-tagging"
    assert_error("NoSuchKey", 404, s3.get_object, Bucket=bucket, Key="k")


def test_post_on_tagging_is_method_not_allowed(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    r = send(signed(daemon, "POST", f"/{bucket}/k?tagging", b"")[0])
    assert r.status_code == 405 and "<Code>MethodNotAllowed</Code>" in r.text


# -- bucket tags ----------------------------------------------------------------------------

def test_bucket_without_tags_is_no_such_tag_set(s3: Any, bucket: str) -> None:
    e = assert_error("NoSuchTagSet", 404, s3.get_bucket_tagging, Bucket=bucket)
    assert e["Error"]["BucketName"] == bucket


def test_put_get_delete_bucket_tagging(s3: Any, bucket: str) -> None:
    r = s3.put_bucket_tagging(Bucket=bucket, Tagging=tagset(team="ml", cost="42"))
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204
    got = s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
    assert got == [{"Key": "team", "Value": "ml"}, {"Key": "cost", "Value": "42"}]
    assert s3.delete_bucket_tagging(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert_error("NoSuchTagSet", 404, s3.get_bucket_tagging, Bucket=bucket)


def test_empty_bucket_tag_set_removes_tags(s3: Any, bucket: str) -> None:
    s3.put_bucket_tagging(Bucket=bucket, Tagging=tagset(a="1"))
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": []})
    assert_error("NoSuchTagSet", 404, s3.get_bucket_tagging, Bucket=bucket)


def test_fifty_bucket_tags_allowed_fifty_one_refused(s3: Any, bucket: str) -> None:
    fifty = {f"k{i}": str(i) for i in range(50)}
    s3.put_bucket_tagging(Bucket=bucket, Tagging=tagset(**fifty))
    assert len(s3.get_bucket_tagging(Bucket=bucket)["TagSet"]) == 50
    assert_error("InvalidTag", 400, s3.put_bucket_tagging, Bucket=bucket,
                 Tagging=tagset(**fifty, k50="x"))
    assert len(s3.get_bucket_tagging(Bucket=bucket)["TagSet"]) == 50


def test_bucket_tag_rules(s3: Any, bucket: str) -> None:
    for bad in (tagset(**{"aws:x": "1"}), tagset(**{"k" * 129: "1"}), tagset(k="v" * 257),
                {"TagSet": [{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}]}):
        assert_error("InvalidTag", 400, s3.put_bucket_tagging, Bucket=bucket, Tagging=bad)
    assert_error("NoSuchTagSet", 404, s3.get_bucket_tagging, Bucket=bucket)


def test_bucket_tagging_of_missing_bucket(s3: Any) -> None:
    assert_error("NoSuchBucket", 404, s3.get_bucket_tagging, Bucket="no-such-bkt")
    assert_error("NoSuchBucket", 404, s3.put_bucket_tagging, Bucket="no-such-bkt",
                 Tagging=tagset(a="1"))
    assert_error("NoSuchBucket", 404, s3.delete_bucket_tagging, Bucket="no-such-bkt")


def test_bucket_tags_do_not_tag_objects(s3: Any, bucket: str) -> None:
    s3.put_bucket_tagging(Bucket=bucket, Tagging=tagset(a="1"))
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert tags_of(s3, bucket, "k") == {}


# -- who may ---------------------------------------------------------------------------------

def test_other_users_cannot_read_or_change_private_object_tags(s3: Any, alice: Any,
                                                               bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", Tagging="a=1")
    assert_error("AccessDenied", 403, alice.get_object_tagging, Bucket=bucket, Key="k")
    assert_error("AccessDenied", 403, alice.put_object_tagging, Bucket=bucket, Key="k",
                 Tagging=tagset(b="2"))
    assert_error("AccessDenied", 403, alice.delete_object_tagging, Bucket=bucket, Key="k")
    assert tags_of(s3, bucket, "k") == {"a": "1"}


def test_read_grant_allows_reading_tags_but_not_changing_them(s3: Any, alice: Any,
                                                              bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", Tagging="a=1")
    s3.put_object_acl(Bucket=bucket, Key="k", ACL="public-read")  # r for others, as getxattr
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    assert tags_of(alice, bucket, "k") == {"a": "1"}
    assert_error("AccessDenied", 403, alice.put_object_tagging, Bucket=bucket, Key="k",
                 Tagging=tagset(b="2"))


def test_owner_of_object_changes_its_tags(alice: Any, alice_bucket: str) -> None:
    alice.put_object(Bucket=alice_bucket, Key="k", Body=b"x")
    alice.put_object_tagging(Bucket=alice_bucket, Key="k", Tagging=tagset(a="1"))
    assert tags_of(alice, alice_bucket, "k") == {"a": "1"}


def test_bucket_tagging_is_the_owners(s3: Any, alice: Any, bucket: str,
                                      alice_bucket: str) -> None:
    s3.put_bucket_tagging(Bucket=bucket, Tagging=tagset(a="1"))
    assert_error("AccessDenied", 403, alice.get_bucket_tagging, Bucket=bucket)
    assert_error("AccessDenied", 403, alice.put_bucket_tagging, Bucket=bucket,
                 Tagging=tagset(b="2"))
    assert_error("AccessDenied", 403, alice.delete_bucket_tagging, Bucket=bucket)
    assert s3.get_bucket_tagging(Bucket=bucket)["TagSet"] == [{"Key": "a", "Value": "1"}]
    alice.put_bucket_tagging(Bucket=alice_bucket, Tagging=tagset(mine="yes"))
    assert s3.get_bucket_tagging(Bucket=alice_bucket)["TagSet"] == [
        {"Key": "mine", "Value": "yes"}]  # root manages every bucket


def test_anonymous_tagging_is_refused(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", ACL="public-read")
    for path in (f"/{bucket}/k?tagging", f"/{bucket}?tagging"):
        r = requests.get(daemon.url + path, timeout=10)
        assert r.status_code == 403 and "<Code>AccessDenied</Code>" in r.text, r.text


# -- the AWS CLI ----------------------------------------------------------------------------

def test_aws_cli_object_and_bucket_tagging(aws: Callable[..., str], s3: Any,
                                           bucket: str) -> None:
    aws("s3api", "put-object", "--bucket", bucket, "--key", "k", "--tagging", "a=1&b=x%20y")
    out = json.loads(aws("s3api", "get-object-tagging", "--bucket", bucket, "--key", "k"))
    assert out["TagSet"] == [{"Key": "a", "Value": "1"}, {"Key": "b", "Value": "x y"}]
    aws("s3api", "put-object-tagging", "--bucket", bucket, "--key", "k", "--tagging",
        json.dumps(tagset(c="3")))
    assert tags_of(s3, bucket, "k") == {"c": "3"}
    aws("s3api", "copy-object", "--bucket", bucket, "--key", "k2", "--copy-source",
        f"{bucket}/k", "--tagging-directive", "REPLACE", "--tagging", "d=4")
    assert tags_of(s3, bucket, "k2") == {"d": "4"}
    aws("s3api", "delete-object-tagging", "--bucket", bucket, "--key", "k")
    assert tags_of(s3, bucket, "k") == {}
    aws("s3api", "put-bucket-tagging", "--bucket", bucket, "--tagging",
        json.dumps(tagset(team="ml")))
    out = json.loads(aws("s3api", "get-bucket-tagging", "--bucket", bucket))
    assert out["TagSet"] == [{"Key": "team", "Value": "ml"}]
    aws("s3api", "delete-bucket-tagging", "--bucket", bucket)
    assert_error("NoSuchTagSet", 404, s3.get_bucket_tagging, Bucket=bucket)


def test_minio_py_object_and_bucket_tags(daemon: Daemon, s3: Any, bucket: str) -> None:
    mc = minio.Minio(daemon.url.removeprefix("http://"), access_key=ROOT_KEY,
                     secret_key=ROOT_SECRET, secure=False, region=REGION)
    tags = minio.commonconfig.Tags.new_object_tags()
    tags["team"] = "ml"
    mc.put_object(bucket, "m", io.BytesIO(b"x"), 1, tags=tags)  # x-amz-tagging
    assert dict(mc.get_object_tags(bucket, "m") or {}) == {"team": "ml"}
    tags["stage"] = "raw"
    mc.set_object_tags(bucket, "m", tags)
    assert tags_of(s3, bucket, "m") == {"team": "ml", "stage": "raw"}
    mc.delete_object_tags(bucket, "m")
    assert not mc.get_object_tags(bucket, "m")
    btags = minio.commonconfig.Tags.new_bucket_tags()
    btags["cost"] = "42"
    mc.set_bucket_tags(bucket, btags)
    assert dict(mc.get_bucket_tags(bucket) or {}) == {"cost": "42"}
    mc.delete_bucket_tags(bucket)
    assert mc.get_bucket_tags(bucket) is None  # minio-py's answer to NoSuchTagSet


# -- durability ------------------------------------------------------------------------------

def test_tags_survive_kill_9(tmp_path: Path) -> None:
    """An acknowledged PutObjectTagging / PutBucketTagging is durable: kill -9, restart."""
    d = start_daemon(tmp_path / "data")
    try:
        c = d.client()
        c.create_bucket(Bucket="bkt")
        c.put_object(Bucket="bkt", Key="k", Body=b"x", Tagging="h=1")
        c.put_object(Bucket="bkt", Key="j", Body=b"y")
        c.put_object_tagging(Bucket="bkt", Key="j", Tagging=tagset(p="2"))
        c.put_bucket_tagging(Bucket="bkt", Tagging=tagset(bt="3"))
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        d = start_daemon(tmp_path / "data")
        c = d.client()
        assert tags_of(c, "bkt", "k") == {"h": "1"}
        assert tags_of(c, "bkt", "j") == {"p": "2"}
        assert c.get_bucket_tagging(Bucket="bkt")["TagSet"] == [{"Key": "bt", "Value": "3"}]
    finally:
        d.stop()
