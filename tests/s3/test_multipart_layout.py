"""Multipart layouts through the running gateway with boto3: parts written into the upload's
data file complete without a copy, every other layout is assembled by copying, and none of
them changes the bytes, the ETag, ListParts or the checksums.  Also what must survive: an
acknowledged part across a killed daemon, an acknowledged part across a failed re-upload."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .conftest import Daemon, assert_error, start_daemon
from .test_multipart import mpu_etag

MiB = 1 << 20
S = 5 * MiB  # the parts' size: s3_min_part_size


def data_file(d: Daemon, upload_id: str) -> Path:
    return d.data_dir / "hot" / "mpu" / upload_id / "data"


def hot_inodes(d: Daemon) -> set[int]:
    """Inode numbers of every object file of the hot tier."""
    out = set()
    for dirpath, dirnames, files in os.walk(d.data_dir / "hot"):
        dirnames[:] = [n for n in dirnames if n not in ("mpu", "tmp")]
        out |= {os.stat(os.path.join(dirpath, f)).st_ino for f in files}
    return out


def upload_parts(s3: Any, bucket: str, key: str, uid: str, parts: dict[int, bytes],
                 threads: int = 4, **kw: Any) -> dict[int, str]:
    def one(n: int) -> str:
        etag: str = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n,
                                   Body=parts[n], **kw)["ETag"]
        return etag
    with cf.ThreadPoolExecutor(threads) as ex:
        return dict(zip(parts, ex.map(one, parts), strict=True))


def complete(s3: Any, bucket: str, key: str, uid: str, etags: dict[int, str]) -> Any:
    return s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e}
                                   for n, e in sorted(etags.items())]})


def test_concurrent_fixed_size_parts_complete_without_copy(daemon: Daemon, s3: Any,
                                                           bucket: str) -> None:
    parts = {n: os.urandom(S) for n in range(1, 6)}
    parts[6] = os.urandom(12345)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="z", ChecksumAlgorithm="CRC32")[
        "UploadId"]
    etags = upload_parts(s3, bucket, "z", uid, parts, ChecksumAlgorithm="CRC32")
    listed = s3.list_parts(Bucket=bucket, Key="z", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed] == [
        (n, etags[n], len(parts[n])) for n in sorted(parts)]
    ino = data_file(daemon, uid).stat().st_ino
    r = complete(s3, bucket, "z", uid, etags)
    whole = [parts[n] for n in sorted(parts)]
    assert r["ETag"] == mpu_etag(whole) and r["ChecksumCRC32"].endswith("-6")
    assert ino in hot_inodes(daemon)  # the upload's data file is the object: no copy
    assert s3.get_object(Bucket=bucket, Key="z")["Body"].read() == b"".join(whole)
    assert not data_file(daemon, uid).parent.exists()


def test_mixed_sizes_are_copied(daemon: Daemon, s3: Any, bucket: str) -> None:
    """Part 1 sets the slot size; a larger part 2 goes to its own file, a re-uploaded
    part 3 beside its acknowledged first version: Complete copies, bytes stay right."""
    p1, p2, p3a, p3b = (os.urandom(S), os.urandom(S + 4096), os.urandom(S),
                        os.urandom(S - 1))
    uid = s3.create_multipart_upload(Bucket=bucket, Key="m")["UploadId"]
    e = upload_parts(s3, bucket, "m", uid, {1: p1, 2: p2, 3: p3a}, threads=1)
    e3b = s3.upload_part(Bucket=bucket, Key="m", UploadId=uid, PartNumber=3, Body=p3b)["ETag"]
    assert_error("InvalidPart", 400, complete, s3, bucket, "m", uid, e)  # 3 was replaced
    ino = data_file(daemon, uid).stat().st_ino
    r = complete(s3, bucket, "m", uid, {1: e[1], 2: e[2], 3: e3b})
    assert r["ETag"] == mpu_etag([p1, p2, p3b])
    assert ino not in hot_inodes(daemon)
    assert s3.get_object(Bucket=bucket, Key="m")["Body"].read() == p1 + p2 + p3b


def test_failed_reupload_keeps_the_acknowledged_part(daemon: Daemon, s3: Any,
                                                     bucket: str) -> None:
    p1, p2, other = os.urandom(S), os.urandom(S), os.urandom(S)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="f")["UploadId"]
    e = upload_parts(s3, bucket, "f", uid, {1: p1, 2: p2}, threads=1)
    # a wrong checksum: BadDigest, after the bytes were written beside part 2
    assert_error("BadDigest", 400, s3.upload_part, Bucket=bucket, Key="f", UploadId=uid,
                 PartNumber=2, Body=other, ChecksumCRC32="AAAAAA==")
    # a client that dies halfway through a re-upload of part 1
    url = s3.generate_presigned_url("upload_part", Params={
        "Bucket": bucket, "Key": "f", "UploadId": uid, "PartNumber": 1})
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port)) as sock:
        sock.sendall(f"PUT {u.path}?{u.query} HTTP/1.1\r\nHost: {u.netloc}\r\n"
                     f"Content-Length: {S}\r\n\r\n".encode() + other[:S // 2])
    lp = s3.list_parts(Bucket=bucket, Key="f", UploadId=uid)["Parts"]
    assert [p["ETag"] for p in lp] == [e[1], e[2]]
    complete(s3, bucket, "f", uid, e)
    assert s3.get_object(Bucket=bucket, Key="f")["Body"].read() == p1 + p2


def test_concurrent_uploads_of_one_part_number(s3: Any, bucket: str) -> None:
    bodies = [os.urandom(S) for _ in range(4)]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="c")["UploadId"]

    def one(b: bytes) -> str:
        etag: str = s3.upload_part(Bucket=bucket, Key="c", UploadId=uid, PartNumber=1,
                                   Body=b)["ETag"]
        return etag
    with cf.ThreadPoolExecutor(4) as ex:
        etags = list(ex.map(one, bodies))
    winner = s3.list_parts(Bucket=bucket, Key="c", UploadId=uid)["Parts"][0]["ETag"]
    assert winner in etags
    complete(s3, bucket, "c", uid, {1: winner})
    assert s3.get_object(Bucket=bucket, Key="c")["Body"].read() == bodies[etags.index(winner)]


def test_upload_part_copy_and_abort(daemon: Daemon, s3: Any, bucket: str) -> None:
    src = os.urandom(2 * S + 100)
    s3.put_object(Bucket=bucket, Key="src", Body=src)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="pc")["UploadId"]
    etags = {}
    for n, (a, b) in enumerate([(0, S - 1), (S, 2 * S - 1), (2 * S, len(src) - 1)], 1):
        r = s3.upload_part_copy(Bucket=bucket, Key="pc", UploadId=uid, PartNumber=n,
                                CopySource={"Bucket": bucket, "Key": "src"},
                                CopySourceRange=f"bytes={a}-{b}")
        etags[n] = r["CopyPartResult"]["ETag"]
        assert etags[n] == f'"{hashlib.md5(src[a:b + 1]).hexdigest()}"'
    ino = data_file(daemon, uid).stat().st_ino
    complete(s3, bucket, "pc", uid, etags)
    assert ino in hot_inodes(daemon)
    assert s3.get_object(Bucket=bucket, Key="pc")["Body"].read() == src
    uid = s3.create_multipart_upload(Bucket=bucket, Key="ab")["UploadId"]
    upload_parts(s3, bucket, "ab", uid, {1: os.urandom(S)})
    s3.abort_multipart_upload(Bucket=bucket, Key="ab", UploadId=uid)
    assert not data_file(daemon, uid).parent.exists()
    assert_error("NoSuchUpload", 404, s3.upload_part, Bucket=bucket, Key="ab", UploadId=uid,
                 PartNumber=2, Body=b"x")
    assert_error("404", 404, s3.head_object, Bucket=bucket, Key="ab")


def test_acknowledged_parts_survive_a_killed_daemon(tmp_path: Path) -> None:
    d = start_daemon(tmp_path / "data")
    try:
        s3 = d.client()
        s3.create_bucket(Bucket="crash")
        parts = {1: os.urandom(S), 2: os.urandom(S), 3: os.urandom(999)}
        uid = s3.create_multipart_upload(Bucket="crash", Key="k")["UploadId"]
        e = upload_parts(s3, "crash", "k", uid, {1: parts[1], 2: parts[2]})
        d.proc.kill()  # SIGKILL: no shutdown, whatever was acknowledged must be on disk
        d.proc.wait(10)
        d = start_daemon(tmp_path / "data")
        s3 = d.client()
        assert_error("404", 404, s3.head_object, Bucket="crash", Key="k")  # not an object
        lp = s3.list_parts(Bucket="crash", Key="k", UploadId=uid)["Parts"]
        assert [(p["PartNumber"], p["ETag"]) for p in lp] == [(1, e[1]), (2, e[2])]
        e[3] = s3.upload_part(Bucket="crash", Key="k", UploadId=uid, PartNumber=3,
                              Body=parts[3])["ETag"]
        ino = data_file(d, uid).stat().st_ino
        complete(s3, "crash", "k", uid, e)
        assert ino in hot_inodes(d)  # the slot size came back from the part records
        assert s3.get_object(Bucket="crash", Key="k")["Body"].read() == b"".join(
            parts[n] for n in (1, 2, 3))
    finally:
        d.stop()
