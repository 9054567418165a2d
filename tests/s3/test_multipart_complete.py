"""CompleteMultipartUpload as S3 clients use it (boto3): the object checksum header, a retry
after a lost response, conditional completion, and the bucket owner's rights over other
users' uploads in its bucket."""

from __future__ import annotations

import base64
import os
import uuid
import zlib
from typing import Any

import pytest

from .conftest import Daemon, assert_error, new_user

MiB = 1 << 20


def _crc(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _upload(s3: Any, bucket: str, key: str, parts: list[bytes], **create: Any
            ) -> tuple[str, list[dict[str, Any]]]:
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, **create)
    listed = []
    for n, data in enumerate(parts, 1):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=n,
                           Body=data, **({"ChecksumAlgorithm": "CRC32"} if create else {}))
        row = {"PartNumber": n, "ETag": r["ETag"]}
        if "ChecksumCRC32" in r:
            row["ChecksumCRC32"] = r["ChecksumCRC32"]
        listed.append(row)
    return up["UploadId"], listed


@pytest.fixture(scope="module")
def parts() -> list[bytes]:
    return [os.urandom(5 * MiB), os.urandom(MiB + 7)]


def test_full_object_crc_header_is_checked_against_the_object(
        s3: Any, bucket: str, parts: list[bytes]) -> None:
    uid, listed = _upload(s3, bucket, "full", parts, ChecksumAlgorithm="CRC32",
                          ChecksumType="FULL_OBJECT")
    whole = _crc(b"".join(parts))
    assert_error("BadDigest", 400, s3.complete_multipart_upload, Bucket=bucket, Key="full",
                 UploadId=uid, MultipartUpload={"Parts": listed}, ChecksumCRC32=_crc(b"x"),
                 ChecksumType="FULL_OBJECT")
    r = s3.complete_multipart_upload(Bucket=bucket, Key="full", UploadId=uid,
                                     MultipartUpload={"Parts": listed},
                                     ChecksumCRC32=whole, ChecksumType="FULL_OBJECT")
    assert r["ChecksumCRC32"] == whole
    head = s3.head_object(Bucket=bucket, Key="full", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == whole and head["ChecksumType"] == "FULL_OBJECT"


def test_composite_crc_header_with_and_without_the_part_count(
        s3: Any, bucket: str, parts: list[bytes]) -> None:
    crcs = b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts)
    composite = _crc(crcs)
    for key, given in (("comp-n", f"{composite}-2"), ("comp", composite)):
        uid, listed = _upload(s3, bucket, key, parts, ChecksumAlgorithm="CRC32")
        assert_error("BadDigest", 400, s3.complete_multipart_upload, Bucket=bucket, Key=key,
                     UploadId=uid, MultipartUpload={"Parts": listed},
                     ChecksumCRC32=f"{_crc(b'wrong')}-2")
        r = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                         MultipartUpload={"Parts": listed},
                                         ChecksumCRC32=given)
        assert r["ChecksumCRC32"] == f"{composite}-2", r
    # another algorithm than the upload's is refused, not compared with the wrong sums
    uid, listed = _upload(s3, bucket, "other-alg", parts, ChecksumAlgorithm="CRC32")
    assert_error("InvalidRequest", 400, s3.complete_multipart_upload, Bucket=bucket,
                 Key="other-alg", UploadId=uid, MultipartUpload={"Parts": listed},
                 ChecksumSHA256=base64.b64encode(b"\0" * 32).decode())


def test_a_retried_complete_answers_like_the_first(
        s3: Any, bucket: str, parts: list[bytes]) -> None:
    uid, listed = _upload(s3, bucket, "retry", parts)
    first = s3.complete_multipart_upload(Bucket=bucket, Key="retry", UploadId=uid,
                                         MultipartUpload={"Parts": listed})
    again = s3.complete_multipart_upload(Bucket=bucket, Key="retry", UploadId=uid,
                                         MultipartUpload={"Parts": listed})
    assert again["ETag"] == first["ETag"] and again["Key"] == "retry"
    # an upload id that never completed this key stays unknown
    assert_error("NoSuchUpload", 404, s3.complete_multipart_upload, Bucket=bucket,
                 Key="retry", UploadId=uid + "x", MultipartUpload={"Parts": listed})
    # and once the key holds something else, the old upload is gone for good
    s3.put_object(Bucket=bucket, Key="retry", Body=b"overwritten")
    assert_error("NoSuchUpload", 404, s3.complete_multipart_upload, Bucket=bucket,
                 Key="retry", UploadId=uid, MultipartUpload={"Parts": listed})


def test_conditional_complete(s3: Any, bucket: str, parts: list[bytes]) -> None:
    s3.put_object(Bucket=bucket, Key="cond", Body=b"already here")
    etag = s3.head_object(Bucket=bucket, Key="cond")["ETag"]
    uid, listed = _upload(s3, bucket, "cond", parts)
    assert_error("PreconditionFailed", 412, s3.complete_multipart_upload, Bucket=bucket,
                 Key="cond", UploadId=uid, MultipartUpload={"Parts": listed},
                 IfNoneMatch="*")
    assert s3.get_object(Bucket=bucket, Key="cond")["Body"].read() == b"already here"
    assert_error("PreconditionFailed", 412, s3.complete_multipart_upload, Bucket=bucket,
                 Key="cond", UploadId=uid, MultipartUpload={"Parts": listed},
                 IfMatch='"0123456789abcdef0123456789abcdef"')
    # the upload survived both refusals; the right ETag completes it
    r = s3.complete_multipart_upload(Bucket=bucket, Key="cond", UploadId=uid,
                                     MultipartUpload={"Parts": listed}, IfMatch=etag)
    assert r["ETag"].endswith('-2"')
    uid, listed = _upload(s3, bucket, "fresh", parts)
    s3.complete_multipart_upload(Bucket=bucket, Key="fresh", UploadId=uid,
                                 MultipartUpload={"Parts": listed}, IfNoneMatch="*")
    assert s3.get_object(Bucket=bucket, Key="fresh")["Body"].read() == b"".join(parts)


def test_the_bucket_owner_lists_and_aborts_other_users_uploads(
        daemon: Daemon, alice: Any, parts: list[bytes]) -> None:
    bob = new_user(daemon, "bob", 4101)
    bucket = f"owned-{uuid.uuid4().hex[:8]}"
    alice.create_bucket(Bucket=bucket, ACL="public-read-write")  # others may write keys
    up = bob.create_multipart_upload(Bucket=bucket, Key="bobs")
    ups = alice.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["UploadId"] for u in ups] == [up["UploadId"]]
    parts_seen = alice.list_parts(Bucket=bucket, Key="bobs", UploadId=up["UploadId"])
    assert parts_seen.get("Parts", []) == []
    # not the bucket owner: neither listing nor aborting someone else's upload
    carol = new_user(daemon, "carol", 4102)
    assert carol.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert_error("AccessDenied", 403, carol.abort_multipart_upload, Bucket=bucket,
                 Key="bobs", UploadId=up["UploadId"])
    alice.abort_multipart_upload(Bucket=bucket, Key="bobs", UploadId=up["UploadId"])
    assert alice.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    # the bucket owner may end an upload, not finish it as another user's object
    up = bob.create_multipart_upload(Bucket=bucket, Key="bobs2")
    r = bob.upload_part(Bucket=bucket, Key="bobs2", UploadId=up["UploadId"], PartNumber=1,
                        Body=b"x")
    assert_error("AccessDenied", 403, alice.complete_multipart_upload, Bucket=bucket,
                 Key="bobs2", UploadId=up["UploadId"],
                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": r["ETag"]}]})

