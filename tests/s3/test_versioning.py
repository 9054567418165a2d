"""Bucket versioning through boto3 and the AWS CLI: state, versions on every write, delete
markers, reads and deletes by version id, ``null`` versions, copies from a version."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from s3.test_clients import aws  # noqa: F401  (the AWS CLI fixture)

from .conftest import Daemon, assert_error, client_error


def wipe(s3: Any, name: str) -> None:
    """Every version and marker, then the bucket."""
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
        objs = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
        if objs:
            s3.delete_objects(Bucket=name, Delete={"Objects": objs, "Quiet": True})
    s3.delete_bucket(Bucket=name)


@pytest.fixture
def vb(s3: Any) -> Iterator[str]:
    """A bucket with versioning enabled."""
    name = f"v-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name)
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    yield name
    wipe(s3, name)


def body(s3: Any, bucket: str, key: str, **kw: Any) -> bytes:
    data: bytes = s3.get_object(Bucket=bucket, Key=key, **kw)["Body"].read()
    return data


# -- state -----------------------------------------------------------------------------

def test_versioning_state_round_trip(s3: Any, bucket: str) -> None:
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Suspended"


def test_versioning_errors(s3: Any, bucket: str, daemon: Daemon) -> None:
    assert_error("InvalidRequest", 400, s3.put_bucket_versioning, Bucket=bucket,
                 VersioningConfiguration={"Status": "Enabled", "MFADelete": "Enabled"},
                 MFA="serial 123456")
    assert_error("MalformedXML", 400, s3.put_bucket_versioning, Bucket=bucket,
                 VersioningConfiguration={"Status": "Off"})
    assert_error("NoSuchBucket", 404, s3.get_bucket_versioning, Bucket="no-such-bkt-x")
    # a body that is not XML at all
    s3.meta.events.register_first("before-sign.s3.PutBucketVersioning",
                                  _garble, unique_id="garble")
    try:
        assert_error("MalformedXML", 400, s3.put_bucket_versioning, Bucket=bucket,
                     VersioningConfiguration={"Status": "Enabled"})
    finally:
        s3.meta.events.unregister("before-sign.s3.PutBucketVersioning", unique_id="garble")
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)


def _garble(request: Any, **_: Any) -> None:
    request.data = b"<VersioningConfiguration><Status>Enabled"
    for name in list(request.headers.keys()):
        if name.lower() in ("content-md5", "content-length") or "checksum" in name.lower():
            del request.headers[name]


# -- versions on writes ----------------------------------------------------------------

def test_put_makes_versions_and_reads_by_id(s3: Any, vb: str) -> None:
    v1 = s3.put_object(Bucket=vb, Key="k", Body=b"one")["VersionId"]
    v2 = s3.put_object(Bucket=vb, Key="k", Body=b"two")["VersionId"]
    assert v1 != v2 and v1 != "null"
    assert body(s3, vb, "k") == b"two"
    assert body(s3, vb, "k", VersionId=v1) == b"one"
    assert body(s3, vb, "k", VersionId=v2) == b"two"
    h = s3.head_object(Bucket=vb, Key="k", VersionId=v1)
    assert h["VersionId"] == v1 and h["ContentLength"] == 3
    assert s3.get_object(Bucket=vb, Key="k")["VersionId"] == v2
    assert s3.get_object(Bucket=vb, Key="k", Range="bytes=1-1",
                         VersionId=v1)["Body"].read() == b"n"


def test_bad_version_ids(s3: Any, vb: str) -> None:
    s3.put_object(Bucket=vb, Key="k", Body=b"x")
    assert_error("InvalidArgument", 400, s3.get_object, Bucket=vb, Key="k",
                 VersionId="not-a-version")
    assert_error("NoSuchVersion", 404, s3.get_object, Bucket=vb, Key="k",
                 VersionId="0" * 16)
    e = client_error(s3.head_object, Bucket=vb, Key="k", VersionId="0" * 16)
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert_error("InvalidArgument", 400, s3.delete_object, Bucket=vb, Key="k",
                 VersionId="zz")


def test_copy_and_multipart_make_versions(s3: Any, vb: str) -> None:
    v1 = s3.put_object(Bucket=vb, Key="src", Body=b"first")["VersionId"]
    s3.put_object(Bucket=vb, Key="src", Body=b"second")
    r = s3.copy_object(Bucket=vb, Key="dst", CopySource={"Bucket": vb, "Key": "src",
                                                         "VersionId": v1})
    assert r["CopySourceVersionId"] == v1 and r["VersionId"] not in (None, "null")
    assert body(s3, vb, "dst") == b"first"
    up = s3.create_multipart_upload(Bucket=vb, Key="dst")["UploadId"]
    part = s3.upload_part_copy(Bucket=vb, Key="dst", UploadId=up, PartNumber=1,
                               CopySource={"Bucket": vb, "Key": "src", "VersionId": v1})
    done = s3.complete_multipart_upload(
        Bucket=vb, Key="dst", UploadId=up,
        MultipartUpload={"Parts": [{"PartNumber": 1,
                                    "ETag": part["CopyPartResult"]["ETag"]}]})
    assert done["VersionId"] not in (None, "null", r["VersionId"])
    assert body(s3, vb, "dst") == b"first"
    vids = [v["VersionId"] for v in s3.list_object_versions(Bucket=vb, Prefix="dst")
            ["Versions"]]
    assert vids == [done["VersionId"], r["VersionId"]]
    assert_error("InvalidArgument", 400, s3.copy_object, Bucket=vb, Key="x",
                 CopySource=f"{vb}/src?versionId=bogus")
    # restoring an old version: a copy of it onto its own key (refused without versionId)
    r = s3.copy_object(Bucket=vb, Key="src", CopySource={"Bucket": vb, "Key": "src",
                                                         "VersionId": v1})
    assert body(s3, vb, "src") == b"first" and r["VersionId"] != v1
    assert_error("InvalidRequest", 400, s3.copy_object, Bucket=vb, Key="src",
                 CopySource={"Bucket": vb, "Key": "src"})


# -- delete markers --------------------------------------------------------------------

def test_delete_makes_marker_and_version_delete_restores(s3: Any, vb: str) -> None:
    v1 = s3.put_object(Bucket=vb, Key="d/k", Body=b"one")["VersionId"]
    r = s3.delete_object(Bucket=vb, Key="d/k")
    assert r["DeleteMarker"] is True
    marker = r["VersionId"]
    e = client_error(s3.get_object, Bucket=vb, Key="d/k")
    assert e.response["Error"]["Code"] == "NoSuchKey"
    assert e.response["ResponseMetadata"]["HTTPHeaders"]["x-amz-delete-marker"] == "true"
    e = client_error(s3.get_object, Bucket=vb, Key="d/k", VersionId=marker)
    assert e.response["Error"]["Code"] == "MethodNotAllowed"
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 405
    assert body(s3, vb, "d/k", VersionId=v1) == b"one"
    assert "Contents" not in s3.list_objects_v2(Bucket=vb)
    # removing the marker makes v1 current again
    r = s3.delete_object(Bucket=vb, Key="d/k", VersionId=marker)
    assert r["DeleteMarker"] is True and r["VersionId"] == marker
    assert body(s3, vb, "d/k") == b"one"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=vb)["Contents"]] == ["d/k"]


def test_delete_current_version_promotes_previous(s3: Any, vb: str) -> None:
    v1 = s3.put_object(Bucket=vb, Key="k", Body=b"one")["VersionId"]
    v2 = s3.put_object(Bucket=vb, Key="k", Body=b"two")["VersionId"]
    r = s3.delete_object(Bucket=vb, Key="k", VersionId=v2)
    assert r["VersionId"] == v2 and not r.get("DeleteMarker")
    assert body(s3, vb, "k") == b"one"
    assert s3.head_object(Bucket=vb, Key="k")["VersionId"] == v1
    assert_error("NoSuchVersion", 404, s3.get_object, Bucket=vb, Key="k", VersionId=v2)
    s3.delete_object(Bucket=vb, Key="k", VersionId=v1)
    assert_error("NoSuchKey", 404, s3.get_object, Bucket=vb, Key="k")
    assert "Versions" not in s3.list_object_versions(Bucket=vb)
    # deleting a version that does not exist is a success, as S3
    s3.delete_object(Bucket=vb, Key="k", VersionId=v1)


def test_delete_bucket_with_versions_is_not_empty(s3: Any, vb: str) -> None:
    s3.put_object(Bucket=vb, Key="k", Body=b"x")
    s3.delete_object(Bucket=vb, Key="k")
    assert_error("BucketNotEmpty", 409, s3.delete_bucket, Bucket=vb)


# -- null versions ---------------------------------------------------------------------

def test_null_versions(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"old")
    assert "VersionId" not in s3.put_object(Bucket=bucket, Key="n", Body=b"x")
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    assert s3.head_object(Bucket=bucket, Key="k")["VersionId"] == "null"
    v1 = s3.put_object(Bucket=bucket, Key="k", Body=b"new")["VersionId"]
    assert body(s3, bucket, "k", VersionId="null") == b"old"
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    r = s3.put_object(Bucket=bucket, Key="k", Body=b"suspended")
    assert r["VersionId"] == "null"
    assert body(s3, bucket, "k", VersionId="null") == b"suspended"  # replaced the old null
    assert body(s3, bucket, "k", VersionId=v1) == b"new"
    r = s3.put_object(Bucket=bucket, Key="k", Body=b"again")
    vs = s3.list_object_versions(Bucket=bucket, Prefix="k")["Versions"]
    assert [v["VersionId"] for v in vs] == ["null", v1]
    r = s3.delete_object(Bucket=bucket, Key="k")
    assert r["DeleteMarker"] is True and r["VersionId"] == "null"
    lv = s3.list_object_versions(Bucket=bucket, Prefix="k")
    assert [v["VersionId"] for v in lv["Versions"]] == [v1]  # the null version went
    assert [(m["VersionId"], m["IsLatest"]) for m in lv["DeleteMarkers"]] == [("null", True)]
    wipe_versions = [{"Key": "k", "VersionId": v} for v in ("null", v1)] + [
        {"Key": "n", "VersionId": "null"}]
    s3.delete_objects(Bucket=bucket, Delete={"Objects": wipe_versions})


# -- DeleteObjects ---------------------------------------------------------------------

def test_delete_objects_with_versions(s3: Any, vb: str) -> None:
    v1 = s3.put_object(Bucket=vb, Key="a", Body=b"1")["VersionId"]
    v2 = s3.put_object(Bucket=vb, Key="a", Body=b"2")["VersionId"]
    s3.put_object(Bucket=vb, Key="b", Body=b"b")
    r = s3.delete_objects(Bucket=vb, Delete={"Objects": [
        {"Key": "a", "VersionId": v1}, {"Key": "b"}, {"Key": "c", "VersionId": "bad!"}]})
    deleted = {d["Key"]: d for d in r["Deleted"]}
    assert deleted["a"]["VersionId"] == v1 and "DeleteMarker" not in deleted["a"]
    assert deleted["b"]["DeleteMarker"] is True
    marker = deleted["b"]["DeleteMarkerVersionId"]
    assert [(e["Key"], e["Code"]) for e in r["Errors"]] == [("c", "NoSuchVersion")]
    assert body(s3, vb, "a") == b"2"
    assert_error("NoSuchVersion", 404, s3.get_object, Bucket=vb, Key="a", VersionId=v1)
    r = s3.delete_objects(Bucket=vb, Delete={"Objects": [{"Key": "b", "VersionId": marker}]})
    assert r["Deleted"][0]["DeleteMarker"] is True
    assert r["Deleted"][0]["DeleteMarkerVersionId"] == marker
    assert body(s3, vb, "b") == b"b"
    assert s3.head_object(Bucket=vb, Key="a")["VersionId"] == v2


# -- a second client -------------------------------------------------------------------

def test_aws_cli_versioning(aws: Any, s3: Any, vb: str, tmp_path: Any) -> None:  # noqa: F811
    out = json.loads(aws("s3api", "get-bucket-versioning", "--bucket", vb))
    assert out["Status"] == "Enabled"
    src = tmp_path / "f"
    src.write_bytes(b"cli-1")
    v1 = json.loads(aws("s3api", "put-object", "--bucket", vb, "--key", "c",
                        "--body", str(src)))["VersionId"]
    src.write_bytes(b"cli-2")
    aws("s3api", "put-object", "--bucket", vb, "--key", "c", "--body", str(src))
    dst = tmp_path / "out"
    aws("s3api", "get-object", "--bucket", vb, "--key", "c", "--version-id", v1, str(dst))
    assert dst.read_bytes() == b"cli-1"
    lv = json.loads(aws("s3api", "list-object-versions", "--bucket", vb))
    assert [v["IsLatest"] for v in lv["Versions"]] == [True, False]
    d = json.loads(aws("s3api", "delete-object", "--bucket", vb, "--key", "c"))
    assert d["DeleteMarker"] is True


def test_put_bucket_versioning_back_to_unversioned_is_refused(s3: Any, vb: str) -> None:
    with pytest.raises(ClientError):
        s3.put_bucket_versioning(Bucket=vb, VersioningConfiguration={"Status": "Disabled"})
    assert s3.get_bucket_versioning(Bucket=vb)["Status"] == "Enabled"


def test_policy_judges_version_actions(s3: Any, vb: str) -> None:
    """A request naming a version is s3:GetObjectVersion / s3:DeleteObjectVersion (as AWS):
    a Deny of those leaves the current version readable and every old one out of reach."""
    from s3.test_policy import arn, doc, stmt

    v1 = s3.put_object(Bucket=vb, Key="k", Body=b"one")["VersionId"]
    s3.put_object(Bucket=vb, Key="k", Body=b"two")
    s3.put_bucket_policy(Bucket=vb, Policy=doc(stmt(
        "Deny", "*", ["s3:GetObjectVersion", "s3:DeleteObjectVersion"], arn(vb, "*"))))
    try:
        assert body(s3, vb, "k") == b"two"
        assert_error("AccessDenied", 403, s3.get_object, Bucket=vb, Key="k", VersionId=v1)
        assert_error("AccessDenied", 403, s3.delete_object, Bucket=vb, Key="k", VersionId=v1)
        assert_error("AccessDenied", 403, s3.copy_object, Bucket=vb, Key="c",
                     CopySource={"Bucket": vb, "Key": "k", "VersionId": v1})
        r = s3.delete_objects(Bucket=vb, Delete={"Objects": [{"Key": "k", "VersionId": v1}]})
        assert [e["Code"] for e in r["Errors"]] == ["AccessDenied"]
    finally:
        s3.delete_bucket_policy(Bucket=vb)
    assert body(s3, vb, "k", VersionId=v1) == b"one"


def test_object_acls_by_version(s3: Any, vb: str) -> None:
    v1 = s3.put_object(Bucket=vb, Key="k", Body=b"one")["VersionId"]
    v2 = s3.put_object(Bucket=vb, Key="k", Body=b"two")["VersionId"]
    for vid in (v1, v2):
        assert s3.get_object_acl(Bucket=vb, Key="k", VersionId=vid)["Owner"]["ID"]
    s3.put_object_acl(Bucket=vb, Key="k", VersionId=v2, ACL="private")
    assert_error("NotImplemented", 501, s3.put_object_acl, Bucket=vb, Key="k", VersionId=v1,
                 ACL="private")
    assert_error("InvalidArgument", 400, s3.get_object_acl, Bucket=vb, Key="k",
                 VersionId="nope")
    assert_error("NoSuchVersion", 404, s3.get_object_acl, Bucket=vb, Key="k",
                 VersionId="0" * 16)
    marker = s3.delete_object(Bucket=vb, Key="k")["VersionId"]
    assert_error("MethodNotAllowed", 405, s3.get_object_acl, Bucket=vb, Key="k",
                 VersionId=marker)
