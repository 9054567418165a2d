"""One test per S3 error code of the gateway: HTTP status, code, and the XML error body."""

from __future__ import annotations

import base64
import datetime
import hashlib
import uuid
from typing import Any

import requests

from .conftest import Daemon, assert_error, client_error
from .test_auth import send, signed


def xml_error(r: requests.Response, code: str, status: int) -> None:
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"].startswith("application/xml")
    assert f"<Code>{code}</Code>" in r.text
    assert f"<RequestId>{r.headers['x-amz-request-id']}</RequestId>" in r.text


def test_no_such_bucket(s3: Any) -> None:
    resp = assert_error("NoSuchBucket", 404, s3.list_objects_v2, Bucket="no-such-bucket-x")
    assert resp["Error"]["BucketName"] == "no-such-bucket-x"
    assert_error("NoSuchBucket", 404, s3.get_object, Bucket="no-such-bucket-x", Key="k")
    assert_error("NoSuchBucket", 404, s3.put_object, Bucket="no-such-bucket-x", Key="k",
                 Body=b"")
    assert_error("NoSuchBucket", 404, s3.delete_object, Bucket="no-such-bucket-x", Key="k")
    assert_error("NoSuchBucket", 404, s3.delete_bucket, Bucket="no-such-bucket-x")


def test_no_such_key(s3: Any, bucket: str) -> None:
    resp = assert_error("NoSuchKey", 404, s3.get_object, Bucket=bucket, Key="missing/key")
    assert resp["Error"]["Key"] == "missing/key"
    assert_error("404", 404, s3.head_object, Bucket=bucket, Key="missing")


def test_no_such_upload(s3: Any, bucket: str) -> None:
    assert_error("NoSuchUpload", 404, s3.list_parts, Bucket=bucket, Key="k", UploadId="nope")
    assert_error("NoSuchUpload", 404, s3.complete_multipart_upload, Bucket=bucket, Key="k",
                 UploadId="nope",
                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"x"'}]})


def test_bucket_already_owned_by_you_and_exists(s3: Any, alice: Any, bucket: str) -> None:
    # us-east-1 answers 200 to your own bucket (tests/s3/test_list_buckets_paging.py has
    # the 409 BucketAlreadyOwnedByYou of other regions)
    assert s3.create_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert_error("BucketAlreadyExists", 409, alice.create_bucket, Bucket=bucket)


def test_bucket_not_empty(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert_error("BucketNotEmpty", 409, s3.delete_bucket, Bucket=bucket)


def test_invalid_bucket_name(s3: Any) -> None:
    for name in ("ab", "Upper-Case", "bad_name", "-dash", "192.168.1.1", "a..b", "x" * 64):
        resp = assert_error("InvalidBucketName", 400, s3.create_bucket, Bucket=name)
        assert "bucket name" in resp["Error"]["Message"]


def test_key_too_long(s3: Any, bucket: str) -> None:
    assert_error("KeyTooLongError", 400, s3.put_object, Bucket=bucket, Key="k" * 1025,
                 Body=b"")


def test_invalid_argument(s3: Any, bucket: str) -> None:
    resp = assert_error("InvalidArgument", 400, s3.put_object, Bucket=bucket, Key="a//b",
                        Body=b"")
    assert "segment" in resp["Error"]["Message"]
    assert_error("InvalidArgument", 400, s3.list_objects, Bucket=bucket, MaxKeys=-1)


def test_invalid_range(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"0123")
    assert_error("InvalidRange", 416, s3.get_object, Bucket=bucket, Key="k", Range="bytes=4-")


def test_precondition_failed(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    resp = assert_error("PreconditionFailed", 412, s3.get_object, Bucket=bucket, Key="k",
                        IfMatch='"0"')
    assert resp["Error"]["Condition"] == "If-Match"


def test_not_modified(s3: Any, bucket: str) -> None:
    etag = s3.put_object(Bucket=bucket, Key="k", Body=b"x")["ETag"]
    resp = assert_error("304", 304, s3.get_object, Bucket=bucket, Key="k", IfNoneMatch=etag)
    assert resp["ResponseMetadata"]["HTTPHeaders"].get("content-length", "0") == "0"


def test_signature_does_not_match(daemon: Daemon) -> None:
    from .conftest import ROOT_KEY
    e = client_error(daemon.client(ROOT_KEY, "not-the-secret-at-all").list_buckets)
    assert e.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert "CanonicalRequest" in e.response["Error"]


def test_invalid_access_key_id(daemon: Daemon) -> None:
    e = client_error(daemon.client("AKIANOSUCHKEY", "whatever-secret").list_buckets)
    assert e.response["Error"]["Code"] == "InvalidAccessKeyId"
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_access_denied(daemon: Daemon, alice: Any, bucket: str) -> None:
    xml_error(requests.get(f"{daemon.url}/{bucket}", timeout=10), "AccessDenied", 403)
    assert_error("AccessDenied", 403, alice.put_object, Bucket=bucket, Key="k", Body=b"x")


def test_request_time_too_skewed(daemon: Daemon, bucket: str) -> None:
    when = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(
        hours=1)
    r = send(signed(daemon, "GET", f"/{bucket}", when=when)[0])
    xml_error(r, "RequestTimeTooSkewed", 403)
    assert "<MaxAllowedSkewMilliseconds>900000</MaxAllowedSkewMilliseconds>" in r.text


def test_bad_digest(s3: Any, bucket: str) -> None:
    md5 = base64.b64encode(hashlib.md5(b"something else").digest()).decode()
    assert_error("BadDigest", 400, s3.put_object, Bucket=bucket, Key="k", Body=b"data",
                 ContentMD5=md5)
    assert_error("InvalidDigest", 400, s3.put_object, Bucket=bucket, Key="k", Body=b"data",
                 ContentMD5="bm90LW1kNQ==")


def test_x_amz_content_sha256_mismatch(daemon: Daemon, bucket: str) -> None:
    req, _ = signed(daemon, "PUT", f"/{bucket}/k", b"body",
                    {"X-Amz-Content-SHA256": hashlib.sha256(b"other").hexdigest()})
    xml_error(send(req), "XAmzContentSHA256Mismatch", 400)


def test_malformed_xml(daemon: Daemon, bucket: str) -> None:
    body = b"<Delete><Object><Key>k</Key></Object>"
    req, _ = signed(daemon, "POST", f"/{bucket}?delete", body)
    xml_error(send(req), "MalformedXML", 400)
    req, _ = signed(daemon, "PUT", f"/{bucket}-{uuid.uuid4().hex[:6]}", b"<Create")
    xml_error(send(req), "MalformedXML", 400)


def test_method_not_allowed(daemon: Daemon, bucket: str) -> None:
    for method, path in (("POST", "/"), ("DELETE", "/"), ("PATCH", f"/{bucket}"),
                         ("PATCH", f"/{bucket}/key")):
        xml_error(send(signed(daemon, method, path)[0]), "MethodNotAllowed", 405)


def test_not_implemented(daemon: Daemon, s3: Any, bucket: str) -> None:
    """Features tierd lacks answer 501, never a wrong success."""
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    calls = [
        (s3.put_bucket_lifecycle_configuration, {"Bucket": bucket, "LifecycleConfiguration": {
            "Rules": [{"ID": "r", "Status": "Enabled", "Filter": {"Prefix": ""},
                       "Transitions": [{"Days": 1, "StorageClass": "GLACIER"}]}]}}),
        (s3.put_object, {"Bucket": bucket, "Key": "sse", "Body": b"x",
                         "ServerSideEncryption": "AES256"}),
        (s3.put_object, {"Bucket": bucket, "Key": "cls", "Body": b"x",
                         "StorageClass": "GLACIER"}),
    ]
    for fn, kw in calls:
        assert_error("NotImplemented", 501, fn, **kw)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["k"]  # nothing was stored by the refused calls
    assert_error("InvalidStorageClass", 400, s3.put_object, Bucket=bucket, Key="c", Body=b"",
                 StorageClass="FANCY")


def test_error_bodies_are_s3_xml(daemon: Daemon, bucket: str) -> None:
    r = send(signed(daemon, "GET", f"/{bucket}/nope")[0])
    xml_error(r, "NoSuchKey", 404)
    assert "<Key>nope</Key>" in r.text and f"<Resource>/{bucket}/nope</Resource>" in r.text
    r = send(signed(daemon, "HEAD", f"/{bucket}/nope")[0])
    assert r.status_code == 404 and r.content == b""
    assert r.headers["x-amz-request-id"]
