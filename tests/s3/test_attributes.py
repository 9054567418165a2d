"""GetObjectAttributes (``GET ?attributes``) through boto3, the AWS CLI and raw signed
requests: each attribute, the multipart part layout and its paging, and the error cases."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .conftest import Daemon, assert_error
from .test_auth import send, signed
from .test_clients import aws  # noqa: F401  (the AWS CLI fixture)

MiB = 1 << 20
ALL = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"]


@pytest.fixture(scope="module")
def mpu(daemon: Daemon) -> Iterator[tuple[str, list[int], bytes]]:
    """A bucket with a three-part object ``big`` (5 MiB, 5 MiB, 3 bytes), built once."""
    s3 = daemon.client()
    name = f"attr-{os.urandom(6).hex()}"
    s3.create_bucket(Bucket=name)
    sizes = [5 * MiB, 5 * MiB, 3]
    data = os.urandom(sum(sizes))
    up = s3.create_multipart_upload(Bucket=name, Key="big")["UploadId"]
    parts, at = [], 0
    for n, size in enumerate(sizes, 1):
        r = s3.upload_part(Bucket=name, Key="big", UploadId=up, PartNumber=n,
                           Body=data[at:at + size])
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
        at += size
    s3.complete_multipart_upload(Bucket=name, Key="big", UploadId=up,
                                 MultipartUpload={"Parts": parts})
    yield name, sizes, data
    s3.delete_object(Bucket=name, Key="big")
    s3.delete_bucket(Bucket=name)


def test_single_part_object_every_attribute(s3: Any, bucket: str) -> None:
    body = b"hello attributes"
    s3.put_object(Bucket=bucket, Key="k", Body=body)
    r = s3.get_object_attributes(Bucket=bucket, Key="k", ObjectAttributes=ALL)
    assert r["ETag"] == hashlib.md5(body).hexdigest()  # unquoted, as AWS answers
    assert r["ObjectSize"] == len(body)
    assert r["StorageClass"] == "STANDARD"
    assert "ObjectParts" not in r  # not a multipart object
    # boto3 sends a CRC32 of every PUT by default: stored, and given back
    crc = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    assert r["Checksum"] == {"ChecksumCRC32": crc, "ChecksumType": "FULL_OBJECT"}
    head = s3.head_object(Bucket=bucket, Key="k")
    assert r["LastModified"] == head["LastModified"]


def test_only_the_requested_attributes(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"abc")
    r = s3.get_object_attributes(Bucket=bucket, Key="k", ObjectAttributes=["ObjectSize"])
    assert r["ObjectSize"] == 3
    assert not {"ETag", "StorageClass", "Checksum", "ObjectParts"} & r.keys()


def test_object_without_checksum_has_no_checksum_element(daemon: Daemon, s3: Any,
                                                         bucket: str) -> None:
    assert send(signed(daemon, "PUT", f"/{bucket}/raw", b"no checksum")[0]).status_code == 200
    r = s3.get_object_attributes(Bucket=bucket, Key="raw", ObjectAttributes=ALL)
    assert "Checksum" not in r and r["ObjectSize"] == 11


def test_checksum_of_a_single_part_object(s3: Any, bucket: str) -> None:
    body = b"checksummed"
    s3.put_object(Bucket=bucket, Key="k", Body=body, ChecksumAlgorithm="SHA256")
    r = s3.get_object_attributes(Bucket=bucket, Key="k", ObjectAttributes=["Checksum"])
    want = base64.b64encode(hashlib.sha256(body).digest()).decode()
    assert r["Checksum"] == {"ChecksumSHA256": want, "ChecksumType": "FULL_OBJECT"}


def test_multipart_object_parts(s3: Any, mpu: tuple[str, list[int], bytes]) -> None:
    name, sizes, data = mpu
    r = s3.get_object_attributes(Bucket=name, Key="big", ObjectAttributes=ALL)
    assert r["ObjectSize"] == len(data) and r["ETag"].endswith("-3")
    parts = r["ObjectParts"]
    assert parts["TotalPartsCount"] == 3 and parts["IsTruncated"] is False
    assert [(p["PartNumber"], p["Size"]) for p in parts["Parts"]] == [(1, sizes[0]),
                                                                     (2, sizes[1]),
                                                                     (3, sizes[2])]


def test_multipart_parts_are_paged(s3: Any, mpu: tuple[str, list[int], bytes]) -> None:
    name, sizes, _ = mpu
    first = s3.get_object_attributes(Bucket=name, Key="big", ObjectAttributes=["ObjectParts"],
                                     MaxParts=2)["ObjectParts"]
    assert first["IsTruncated"] is True and first["MaxParts"] == 2
    assert first["NextPartNumberMarker"] == 2
    assert [p["PartNumber"] for p in first["Parts"]] == [1, 2]
    rest = s3.get_object_attributes(Bucket=name, Key="big", ObjectAttributes=["ObjectParts"],
                                    MaxParts=2, PartNumberMarker=2)["ObjectParts"]
    assert rest["IsTruncated"] is False and rest["PartNumberMarker"] == 2
    assert [(p["PartNumber"], p["Size"]) for p in rest["Parts"]] == [(3, sizes[2])]


def test_composite_checksum_of_a_multipart_object(s3: Any, bucket: str) -> None:
    up = s3.create_multipart_upload(Bucket=bucket, Key="c", ChecksumAlgorithm="CRC32")
    r = s3.upload_part(Bucket=bucket, Key="c", UploadId=up["UploadId"], PartNumber=1,
                       Body=b"only part", ChecksumAlgorithm="CRC32")
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="c", UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": r["ETag"],
                                    "ChecksumCRC32": r["ChecksumCRC32"]}]})
    got = s3.get_object_attributes(Bucket=bucket, Key="c", ObjectAttributes=["Checksum"])
    assert got["Checksum"]["ChecksumCRC32"] == done["ChecksumCRC32"]
    assert got["Checksum"]["ChecksumType"] == "COMPOSITE"


def _attrs(daemon: Daemon, path: str, headers: dict[str, str]) -> Any:
    return send(signed(daemon, "GET", path, headers=headers)[0])


def test_missing_attributes_header_is_invalid_argument(daemon: Daemon, s3: Any,
                                                        bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    for headers in ({}, {"x-amz-object-attributes": ","}):
        r = _attrs(daemon, f"/{bucket}/k?attributes", headers)
        assert r.status_code == 400, r.text
        assert ET.fromstring(r.content).findtext("Code") == "InvalidArgument"


def test_unknown_attribute_is_invalid_argument(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    resp = assert_error("InvalidArgument", 400, s3.get_object_attributes, Bucket=bucket,
                        Key="k", ObjectAttributes=["ETag", "Colour"])
    assert resp["Error"]["ArgumentValue"] == "Colour"


@pytest.mark.parametrize("header,value", [("x-amz-max-parts", "1001"),
                                          ("x-amz-max-parts", "-1"),
                                          ("x-amz-part-number-marker", "x")])
def test_bad_part_paging_headers_are_invalid_argument(daemon: Daemon, s3: Any, bucket: str,
                                                      header: str, value: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    r = _attrs(daemon, f"/{bucket}/k?attributes",
               {"x-amz-object-attributes": "ObjectParts", header: value})
    assert r.status_code == 400, r.text
    assert ET.fromstring(r.content).findtext("ArgumentName") == header


def test_missing_key_and_bucket(s3: Any, bucket: str) -> None:
    assert_error("NoSuchKey", 404, s3.get_object_attributes, Bucket=bucket, Key="nope",
                 ObjectAttributes=["ETag"])
    assert_error("NoSuchBucket", 404, s3.get_object_attributes, Bucket=bucket + "-gone",
                 Key="k", ObjectAttributes=["ETag"])


def test_another_users_private_object_is_access_denied(s3: Any, alice: Any,
                                                       bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert_error("AccessDenied", 403, alice.get_object_attributes, Bucket=bucket, Key="k",
                 ObjectAttributes=["ETag"])


def test_aws_cli_get_object_attributes(aws: Callable[..., str],  # noqa: F811
                                       mpu: tuple[str, list[int], bytes]) -> None:
    name, sizes, data = mpu
    out = json.loads(aws("s3api", "get-object-attributes", "--bucket", name, "--key", "big",
                         "--object-attributes", "ObjectSize", "ObjectParts", "StorageClass",
                         "--max-parts", "1", "--output", "json"))
    assert out["ObjectSize"] == len(data) and out["StorageClass"] == "STANDARD"
    assert out["ObjectParts"]["TotalPartsCount"] == 3
    assert out["ObjectParts"]["Parts"] == [{"PartNumber": 1, "Size": sizes[0]}]


def test_versions_of_a_versioned_object(s3: Any, bucket: str) -> None:
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    v1 = s3.put_object(Bucket=bucket, Key="v", Body=b"first")["VersionId"]
    v2 = s3.put_object(Bucket=bucket, Key="v", Body=b"second!")["VersionId"]
    cur = s3.get_object_attributes(Bucket=bucket, Key="v", ObjectAttributes=["ObjectSize"])
    assert cur["ObjectSize"] == 7 and cur["VersionId"] == v2
    old = s3.get_object_attributes(Bucket=bucket, Key="v", VersionId=v1,
                                   ObjectAttributes=["ObjectSize", "ETag"])
    assert old["ObjectSize"] == 5 and old["VersionId"] == v1
    assert old["ETag"] == hashlib.md5(b"first").hexdigest()
    marker = s3.delete_object(Bucket=bucket, Key="v")["VersionId"]
    resp = assert_error("NoSuchKey", 404, s3.get_object_attributes, Bucket=bucket, Key="v",
                        ObjectAttributes=["ETag"])
    assert resp["ResponseMetadata"]["HTTPHeaders"]["x-amz-delete-marker"] == "true"
    assert_error("MethodNotAllowed", 405, s3.get_object_attributes, Bucket=bucket, Key="v",
                 VersionId=marker, ObjectAttributes=["ETag"])
    assert_error("InvalidArgument", 400, s3.get_object_attributes, Bucket=bucket, Key="v",
                 VersionId="not a version", ObjectAttributes=["ETag"])
    for vid in (v1, v2, marker):
        s3.delete_object(Bucket=bucket, Key="v", VersionId=vid)
