"""Content-Encoding is object metadata to S3: a gzip object keeps its bytes, ETag and
encoding; the gateway never decompresses a request body (aiohttp would by default).  Stored
headers come back byte for byte (an encoding list, raw UTF-8 and RFC 2047 metadata), and
the STANDARD storage class is accepted and listed."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.client
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from tierd.s3.common import stored_encoding

from .conftest import Daemon, assert_error
from .test_auth import signed
from .test_clients import aws  # noqa: F401  (the AWS CLI fixture)


def test_gzip_object_is_stored_as_sent(s3: Any, bucket: str) -> None:
    raw = gzip.compress(b"hello world " * 1000)
    r = s3.put_object(Bucket=bucket, Key="a.txt.gz", Body=raw, ContentEncoding="gzip",
                      ContentType="text/plain")
    assert r["ETag"].strip('"') == hashlib.md5(raw).hexdigest()
    got = s3.get_object(Bucket=bucket, Key="a.txt.gz")
    assert got["Body"].read() == raw
    assert got["ContentEncoding"] == "gzip" and got["ContentLength"] == len(raw)
    # a body that is not gzip at all is still just bytes
    s3.put_object(Bucket=bucket, Key="b", Body=b"plain bytes", ContentEncoding="gzip")
    assert s3.get_object(Bucket=bucket, Key="b")["Body"].read() == b"plain bytes"


def test_admin_api_does_not_decode_bodies(daemon: Daemon) -> None:
    """A refused admin request with a bogus gzip body gets its 401, and the daemon logs no
    decoding traceback while draining the body (a fuzz test found this)."""
    admin = json.loads((daemon.data_dir / "endpoints.json").read_text())["admin"]["url"]
    r = requests.put(admin + "/v1/pool", data=b"not gzip", timeout=10,
                     headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code == 401
    assert "Can not decode content-encoding" not in daemon.log.read_text()


# -- stored headers, byte for byte -------------------------------------------------------

def _raw(daemon: Daemon, method: str, path: str, body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, list[tuple[str, bytes]], bytes]:
    """A signed request whose header values go out as UTF-8 bytes (http.client would send
    latin-1); the answer's headers as the bytes that came back."""
    req, _ = signed(daemon, method, path, body, headers=headers)
    conn = http.client.HTTPConnection(daemon.url.removeprefix("http://"), timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in req.headers.items():
            conn.putheader(k, v.encode() if isinstance(v, str) else v)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, [(k, v.encode("latin-1")) for k, v in resp.getheaders()], data
    finally:
        conn.close()


def _header(headers: list[tuple[str, bytes]], name: str) -> bytes | None:
    return next((v for k, v in headers if k.lower() == name), None)


def test_content_encoding_list_is_returned_exactly_as_sent(s3: Any, bucket: str) -> None:
    for value in ("deflate, gzip", "gzip,br", "identity"):
        s3.put_object(Bucket=bucket, Key="e", Body=b"x", ContentEncoding=value)
        assert s3.head_object(Bucket=bucket, Key="e")["ContentEncoding"] == value
        assert s3.get_object(Bucket=bucket, Key="e")["ContentEncoding"] == value


def test_content_encoding_bytes_on_the_wire(daemon: Daemon, bucket: str) -> None:
    status, _, body = _raw(daemon, "PUT", f"/{bucket}/c", b"x",
                           {"Content-Encoding": "deflate,  gzip"})
    assert status == 200, body
    for method in ("HEAD", "GET"):
        _, headers, _ = _raw(daemon, method, f"/{bucket}/c")
        assert _header(headers, "content-encoding") == b"deflate,  gzip"


def test_only_aws_chunked_is_dropped_from_content_encoding() -> None:
    """``aws-chunked`` describes the transfer, not the object (tests/s3/test_auth.py sends
    real aws-chunked bodies); every other coding is kept as sent."""
    assert stored_encoding("aws-chunked, gzip") == "gzip"
    assert stored_encoding("gzip,aws-chunked") == "gzip"
    assert stored_encoding("AWS-Chunked") == ""
    assert stored_encoding("deflate, gzip") == "deflate, gzip"
    assert stored_encoding("deflate, aws-chunked, gzip") == "deflate, gzip"


def test_copy_keeps_content_encoding_exactly(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"x", ContentEncoding="deflate, gzip")
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    assert s3.head_object(Bucket=bucket, Key="dst")["ContentEncoding"] == "deflate, gzip"


def test_raw_utf8_metadata_round_trips_as_sent(daemon: Daemon, s3: Any, bucket: str) -> None:
    value = "héllo wörld ✓ 日本"
    status, _, body = _raw(daemon, "PUT", f"/{bucket}/u", b"x", {"x-amz-meta-note": value})
    assert status == 200, body
    status, headers, _ = _raw(daemon, "HEAD", f"/{bucket}/u")
    assert _header(headers, "x-amz-meta-note") == value.encode()
    status, headers, data = _raw(daemon, "GET", f"/{bucket}/u")
    assert data == b"x" and _header(headers, "x-amz-meta-note") == value.encode()
    # boto3 reads header bytes as latin-1 (http.client): the same bytes underneath
    got = s3.head_object(Bucket=bucket, Key="u")["Metadata"]["note"]
    assert got.encode("latin-1").decode() == value


def test_rfc2047_metadata_from_boto3_round_trips_as_sent(s3: Any, bucket: str) -> None:
    """boto3 refuses non-ASCII metadata, so applications send it RFC 2047-encoded: stored
    and returned as sent, not decoded."""
    value = "=?UTF-8?B?" + base64.b64encode("héllo ✓".encode()).decode() + "?="
    s3.put_object(Bucket=bucket, Key="r", Body=b"x", Metadata={"note": value, "q": "a  b"})
    meta = s3.head_object(Bucket=bucket, Key="r")["Metadata"]
    assert meta == {"note": value, "q": "a  b"}
    assert s3.get_object(Bucket=bucket, Key="r")["Metadata"] == meta


def test_utf8_metadata_counts_bytes_toward_the_limit(daemon: Daemon, bucket: str) -> None:
    """2 KB of user metadata is counted in UTF-8 bytes: 700 three-byte characters are
    2100 bytes, over the limit."""
    status, _, body = _raw(daemon, "PUT", f"/{bucket}/big", b"x",
                           {"x-amz-meta-n": "✓" * 700})
    assert status == 400 and b"MetadataTooLarge" in body


# -- storage class -----------------------------------------------------------------------

def test_standard_storage_class_accepted_and_listed(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="s", Body=b"x", StorageClass="STANDARD")
    # AWS sends no x-amz-storage-class for STANDARD objects on GET/HEAD
    head = s3.head_object(Bucket=bucket, Key="s")
    assert "x-amz-storage-class" not in head["ResponseMetadata"]["HTTPHeaders"]
    assert head.get("StorageClass") is None
    assert s3.list_objects(Bucket=bucket)["Contents"][0]["StorageClass"] == "STANDARD"
    assert s3.list_objects_v2(Bucket=bucket)["Contents"][0]["StorageClass"] == "STANDARD"
    assert s3.list_object_versions(Bucket=bucket)["Versions"][0]["StorageClass"] == "STANDARD"
    attrs = s3.get_object_attributes(Bucket=bucket, Key="s", ObjectAttributes=["StorageClass"])
    assert attrs["StorageClass"] == "STANDARD"
    s3.copy_object(Bucket=bucket, Key="s2", CopySource={"Bucket": bucket, "Key": "s"},
                   StorageClass="STANDARD")


def test_standard_storage_class_in_multipart_listings(s3: Any, bucket: str) -> None:
    up = s3.create_multipart_upload(Bucket=bucket, Key="m", StorageClass="STANDARD")
    s3.upload_part(Bucket=bucket, Key="m", UploadId=up["UploadId"], PartNumber=1, Body=b"p")
    assert s3.list_parts(Bucket=bucket, Key="m",
                         UploadId=up["UploadId"])["StorageClass"] == "STANDARD"
    ups = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [u["StorageClass"] for u in ups] == ["STANDARD"]


def test_other_storage_classes_are_refused(s3: Any, bucket: str) -> None:
    assert_error("NotImplemented", 501, s3.put_object, Bucket=bucket, Key="g", Body=b"x",
                 StorageClass="GLACIER")
    assert_error("InvalidStorageClass", 400, s3.put_object, Bucket=bucket, Key="g",
                 Body=b"x", StorageClass="SHINY")


def test_aws_cli_storage_class_and_encoding(aws: Callable[..., str], bucket: str,  # noqa: F811
                                            tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"data")
    aws("s3api", "put-object", "--bucket", bucket, "--key", "cli", "--body", str(src),
        "--storage-class", "STANDARD", "--content-encoding", "deflate, gzip")
    head = json.loads(aws("s3api", "head-object", "--bucket", bucket, "--key", "cli",
                          "--output", "json"))
    assert head["ContentEncoding"] == "deflate, gzip" and "StorageClass" not in head
    listed = json.loads(aws("s3api", "list-objects-v2", "--bucket", bucket, "--output",
                            "json"))
    assert [(o["Key"], o["StorageClass"]) for o in listed["Contents"]] == [("cli", "STANDARD")]
