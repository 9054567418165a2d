"""Multipart uploads through boto3: transfers with default checksums, every call, errors."""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig

from .conftest import assert_error

MiB = 1 << 20


def mpu_etag(parts: list[bytes]) -> str:
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    return f'"{digest}-{len(parts)}"'


def test_upload_file_download_file_multipart(s3: Any, bucket: str, tmp_path: Path) -> None:
    """boto3's transfer manager as the benchmark runs it: 8 MiB parts, CRC32 checksums on by
    default (boto3 >= 1.36), 10 concurrent part uploads, ranged downloads."""
    data = os.urandom(21 * MiB + 12345)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    cfg = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB,
                         max_concurrency=10)
    s3.upload_file(str(src), bucket, "big/file.bin", Config=cfg)
    parts = [data[i:i + 8 * MiB] for i in range(0, len(data), 8 * MiB)]
    h = s3.head_object(Bucket=bucket, Key="big/file.bin", ChecksumMode="ENABLED")
    assert h["ETag"] == mpu_etag(parts)
    assert h["ContentLength"] == len(data)
    # the composite CRC32 of the parts, as AWS computes it
    crcs = b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts)
    want = base64.b64encode(zlib.crc32(crcs).to_bytes(4, "big")).decode() + f"-{len(parts)}"
    assert h["ChecksumCRC32"] == want and h["ChecksumType"] == "COMPOSITE"
    dst = tmp_path / "dst.bin"
    s3.download_file(bucket, "big/file.bin", str(dst), Config=cfg)
    assert dst.read_bytes() == data
    # GET by part number
    for n, part in enumerate(parts, 1):
        g = s3.get_object(Bucket=bucket, Key="big/file.bin", PartNumber=n)
        assert g["PartsCount"] == len(parts)
        assert g["Body"].read() == part
    assert_error("InvalidPartNumber", 416, s3.get_object, Bucket=bucket, Key="big/file.bin",
                 PartNumber=4)
    # small files go in one PUT with a CRC32 header
    s3.upload_file(str(src), bucket, "small",
                   Config=TransferConfig(multipart_threshold=64 * MiB))
    etag = s3.head_object(Bucket=bucket, Key="small")["ETag"]
    assert etag == f'"{hashlib.md5(data).hexdigest()}"'


def test_multipart_calls(s3: Any, bucket: str) -> None:
    key = "mp/obj"
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, ContentType="text/csv",
                                    Metadata={"m": "1"})
    uid = up["UploadId"]
    p1, p2, p3 = os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(1000)
    e1 = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=p1)["ETag"]
    e3 = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=3, Body=p3)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=2, Body=p2)["ETag"]
    assert e1 == f'"{hashlib.md5(p1).hexdigest()}"'
    # uploads and parts are listed
    ups = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in ups] == [(key, uid)]
    lp = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in lp["Parts"]] == [
        (1, e1, len(p1)), (2, e2, len(p2)), (3, e3, len(p3))]
    lp = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid, MaxParts=2)
    assert lp["IsTruncated"] and lp["NextPartNumberMarker"] == 2
    lp = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid, PartNumberMarker=2)
    assert [p["PartNumber"] for p in lp["Parts"]] == [3] and not lp["IsTruncated"]
    # a part uploaded again replaces the earlier one
    e2 = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=2, Body=p2)["ETag"]
    parts = [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2},
             {"PartNumber": 3, "ETag": e3}]
    assert_error("InvalidPartOrder", 400, s3.complete_multipart_upload, Bucket=bucket,
                 Key=key, UploadId=uid, MultipartUpload={"Parts": parts[::-1]})
    assert_error("InvalidPart", 400, s3.complete_multipart_upload, Bucket=bucket, Key=key,
                 UploadId=uid, MultipartUpload={"Parts": [
                     {"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e1}]})
    assert_error("InvalidPart", 400, s3.complete_multipart_upload, Bucket=bucket, Key=key,
                 UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 9, "ETag": e1}]})
    r = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                     MultipartUpload={"Parts": parts})
    assert r["ETag"] == mpu_etag([p1, p2, p3])
    g = s3.get_object(Bucket=bucket, Key=key)
    assert g["Body"].read() == p1 + p2 + p3
    assert g["ContentType"] == "text/csv" and g["Metadata"] == {"m": "1"}
    assert g["ETag"] == r["ETag"]
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert_error("NoSuchUpload", 404, s3.list_parts, Bucket=bucket, Key=key, UploadId=uid)
    # the listing shows the multipart ETag
    obj = s3.list_objects_v2(Bucket=bucket, Prefix="mp/")["Contents"][0]
    assert obj["ETag"] == r["ETag"] and obj["Size"] == len(p1 + p2 + p3)


def test_entity_too_small_and_abort(s3: Any, bucket: str) -> None:
    uid = s3.create_multipart_upload(Bucket=bucket, Key="small")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="small", UploadId=uid, PartNumber=1,
                        Body=b"a" * 100)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="small", UploadId=uid, PartNumber=2,
                        Body=b"b" * 100)["ETag"]
    assert_error("EntityTooSmall", 400, s3.complete_multipart_upload, Bucket=bucket,
                 Key="small", UploadId=uid, MultipartUpload={"Parts": [
                     {"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    # one small part alone is fine (the last part may be small)
    s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": e2}]})
    assert s3.get_object(Bucket=bucket, Key="small")["Body"].read() == b"b" * 100
    uid = s3.create_multipart_upload(Bucket=bucket, Key="gone")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="gone", UploadId=uid, PartNumber=1, Body=b"x")
    s3.abort_multipart_upload(Bucket=bucket, Key="gone", UploadId=uid)
    assert_error("NoSuchUpload", 404, s3.abort_multipart_upload, Bucket=bucket, Key="gone",
                 UploadId=uid)
    assert_error("NoSuchUpload", 404, s3.upload_part, Bucket=bucket, Key="gone",
                 UploadId=uid, PartNumber=1, Body=b"x")
    assert_error("404", 404, s3.head_object, Bucket=bucket, Key="gone")
    assert_error("InvalidArgument", 400, s3.upload_part, Bucket=bucket, Key="gone",
                 UploadId="whatever", PartNumber=10001, Body=b"x")
    # an upload id used with another key is not found
    uid = s3.create_multipart_upload(Bucket=bucket, Key="a")["UploadId"]
    assert_error("NoSuchUpload", 404, s3.list_parts, Bucket=bucket, Key="b", UploadId=uid)
    assert_error("MalformedXML", 400, s3.complete_multipart_upload, Bucket=bucket, Key="a",
                 UploadId=uid, MultipartUpload={"Parts": []})


def test_upload_part_copy_with_range(s3: Any, bucket: str) -> None:
    src = os.urandom(12 * MiB)
    s3.put_object(Bucket=bucket, Key="src", Body=src)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst",
                                     ChecksumAlgorithm="SHA256")["UploadId"]
    r1 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1,
                             CopySource=f"{bucket}/src", CopySourceRange="bytes=0-5242879")
    r2 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=2,
                             CopySource={"Bucket": bucket, "Key": "src"},
                             CopySourceRange=f"bytes=5242880-{len(src) - 1}")
    sha = base64.b64encode(hashlib.sha256(src[:5 * MiB]).digest()).decode()
    assert r1["CopyPartResult"]["ChecksumSHA256"] == sha
    p3 = b"tail"
    r3 = s3.upload_part(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=3, Body=p3,
                        ChecksumAlgorithm="SHA256")
    assert_error("InvalidRange", 416, s3.upload_part_copy, Bucket=bucket, Key="dst",
                 UploadId=uid, PartNumber=4, CopySource=f"{bucket}/src",
                 CopySourceRange=f"bytes=0-{len(src)}")
    assert_error("PreconditionFailed", 412, s3.upload_part_copy, Bucket=bucket, Key="dst",
                 UploadId=uid, PartNumber=4, CopySource=f"{bucket}/src",
                 CopySourceIfMatch='"nope"')
    parts = [{"PartNumber": 1, "ETag": r1["CopyPartResult"]["ETag"]},
             {"PartNumber": 2, "ETag": r2["CopyPartResult"]["ETag"]},
             {"PartNumber": 3, "ETag": r3["ETag"], "ChecksumSHA256": r3["ChecksumSHA256"]}]
    r = s3.complete_multipart_upload(Bucket=bucket, Key="dst", UploadId=uid,
                                     MultipartUpload={"Parts": parts})
    body = src + p3
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == body
    assert r["ETag"] == mpu_etag([src[:5 * MiB], src[5 * MiB:], p3])
    digests = [hashlib.sha256(x).digest() for x in (src[:5 * MiB], src[5 * MiB:], p3)]
    want = base64.b64encode(hashlib.sha256(b"".join(digests)).digest()).decode() + "-3"
    assert r["ChecksumSHA256"] == want
    h = s3.head_object(Bucket=bucket, Key="dst", ChecksumMode="ENABLED")
    assert h["ChecksumSHA256"] == want and h["ChecksumType"] == "COMPOSITE"


def test_full_object_crc_and_part_checksum_mismatch(s3: Any, bucket: str) -> None:
    p1, p2 = os.urandom(5 * MiB), os.urandom(777)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="f", ChecksumAlgorithm="CRC32C",
                                     ChecksumType="FULL_OBJECT")["UploadId"]
    r1 = s3.upload_part(Bucket=bucket, Key="f", UploadId=uid, PartNumber=1, Body=p1,
                        ChecksumAlgorithm="CRC32C")
    r2 = s3.upload_part(Bucket=bucket, Key="f", UploadId=uid, PartNumber=2, Body=p2,
                        ChecksumAlgorithm="CRC32C")
    bad = [{"PartNumber": 1, "ETag": r1["ETag"], "ChecksumCRC32C": r2["ChecksumCRC32C"]},
           {"PartNumber": 2, "ETag": r2["ETag"]}]
    assert_error("InvalidPart", 400, s3.complete_multipart_upload, Bucket=bucket, Key="f",
                 UploadId=uid, MultipartUpload={"Parts": bad})
    good = [{"PartNumber": 1, "ETag": r1["ETag"], "ChecksumCRC32C": r1["ChecksumCRC32C"]},
            {"PartNumber": 2, "ETag": r2["ETag"], "ChecksumCRC32C": r2["ChecksumCRC32C"]}]
    r = s3.complete_multipart_upload(Bucket=bucket, Key="f", UploadId=uid,
                                     MultipartUpload={"Parts": good})
    from awscrt import checksums as crt
    want = base64.b64encode(crt.crc32c(p1 + p2).to_bytes(4, "big")).decode()
    assert r["ChecksumCRC32C"] == want and r["ChecksumType"] == "FULL_OBJECT"
    g = s3.get_object(Bucket=bucket, Key="f", ChecksumMode="ENABLED")
    assert g["Body"].read() == p1 + p2  # botocore verified the full-object CRC32C


def test_list_multipart_uploads_pagination_and_delimiter(s3: Any, bucket: str) -> None:
    ids = {}
    for key in ("a/1", "a/2", "b", "c/x/y", "c/z"):
        ids[key] = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    page = s3.list_multipart_uploads(Bucket=bucket, MaxUploads=2)
    assert [u["Key"] for u in page["Uploads"]] == ["a/1", "a/2"] and page["IsTruncated"]
    page = s3.list_multipart_uploads(Bucket=bucket, KeyMarker=page["NextKeyMarker"],
                                     UploadIdMarker=page["NextUploadIdMarker"])
    assert [u["Key"] for u in page["Uploads"]] == ["b", "c/x/y", "c/z"]
    page = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert [u["Key"] for u in page["Uploads"]] == ["b"]
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["a/", "c/"]
    page = s3.list_multipart_uploads(Bucket=bucket, Prefix="c/")
    assert [u["Key"] for u in page["Uploads"]] == ["c/x/y", "c/z"]
    assert page["Uploads"][0]["Initiator"]["DisplayName"] == "root"
