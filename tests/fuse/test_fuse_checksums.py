"""Checksums stay true across doors: an object uploaded with a checksum (boto3 and the aws
cli store a CRC32 by default) and then changed through the mount must still download with
checksum validation on -- the stored checksum goes with the content it described.

Differential: each case writes through one door and reads through the other with the
clients' validation on (boto3 ``ChecksumMode=ENABLED``, ``aws s3 cp``, minio with the
checksum it is given checked against the bytes it got).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import ACCESS_KEY, BUCKET, SECRET_KEY, Daemon, run, s3_client

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def s3(daemon: Daemon) -> Any:
    """Checksums on every request that can carry one, checked on every answer."""
    return s3_client(daemon, request_checksum_calculation="when_supported",
                     response_checksum_validation="when_supported")


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _aws(daemon: Daemon, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    aws = shutil.which("aws", path=os.path.dirname(sys.executable)) or shutil.which("aws")
    if aws is None:
        pytest.fail("the aws cli is not installed (pip install awscli: the test extra)")
    creds = tmp / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {ACCESS_KEY}\n"
                     f"aws_secret_access_key = {SECRET_KEY}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIERD_"))}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_CONFIG_FILE=str(tmp / "none"),
               AWS_DEFAULT_REGION="us-east-1")
    ep = daemon.endpoints()["s3"]
    assert isinstance(ep, dict)
    return run([aws, "--endpoint-url", ep["url"], *args], env=env, check=False)


def _key(tag: str, name: str) -> str:
    return f"cks-{tag}/{name}"


def test_boto3_checksum_after_append_and_rewrite_through_the_mount(
        daemon: Daemon, s3: Any) -> None:
    tag = uuid.uuid4().hex[:8]
    key = _key(tag, "appended.bin")
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"first version\n")  # boto3 sends a CRC32
    head = s3.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert head.get("ChecksumCRC32") == _crc32(b"first version\n"), head
    path = daemon.mnt / BUCKET / key
    with open(path, "ab") as f:
        f.write(b"appended through the mount\n")
    want = b"first version\nappended through the mount\n"
    got = s3.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert got["Body"].read() == want  # FlexibleChecksumError before the fix
    head = s3.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert head.get("ChecksumCRC32") in (None, _crc32(want)), head  # never the old one
    path.write_bytes(b"rewritten")  # O_TRUNC then write
    got = s3.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert got["Body"].read() == b"rewritten"
    os.truncate(path, 4)  # truncate(2) alone changes the content too
    got = s3.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert got["Body"].read() == b"rewr"


def test_aws_cli_download_after_a_change_through_the_mount(
        daemon: Daemon, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    key = _key(tag, "cli.txt")
    src = tmp_path / "src.txt"
    src.write_bytes(b"uploaded by aws s3 cp\n" * 100)
    r = _aws(daemon, tmp_path, "s3", "cp", str(src), f"s3://{BUCKET}/{key}")
    assert r.returncode == 0, r.stderr
    path = daemon.mnt / BUCKET / key
    with open(path, "r+b") as f:  # rewrite in place, same size
        f.write(b"CHANGED")
    want = src.read_bytes()
    want = b"CHANGED" + want[7:]
    out = tmp_path / "out.txt"
    r = _aws(daemon, tmp_path, "s3", "cp", f"s3://{BUCKET}/{key}", str(out))
    assert r.returncode == 0, r.stderr  # "Expected checksum ... did not match" before
    assert out.read_bytes() == want


def test_multipart_checksum_and_parts_after_a_change_through_the_mount(
        daemon: Daemon, s3: Any) -> None:
    tag = uuid.uuid4().hex[:8]
    key = _key(tag, "parts.bin")
    part = os.urandom(5 << 20)
    up = s3.create_multipart_upload(Bucket=BUCKET, Key=key, ChecksumAlgorithm="CRC32")
    etags = []
    for n in (1, 2):
        r = s3.upload_part(Bucket=BUCKET, Key=key, UploadId=up["UploadId"], PartNumber=n,
                           Body=part, ChecksumAlgorithm="CRC32")
        etags.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumCRC32": r["ChecksumCRC32"]})
    s3.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": etags})
    head = s3.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert head.get("ChecksumCRC32", "").endswith("-2"), head
    assert s3.head_object(Bucket=BUCKET, Key=key, PartNumber=1)["PartsCount"] == 2
    path = daemon.mnt / BUCKET / key
    with open(path, "ab") as f:
        f.write(b"+tail")
    head = s3.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert "ChecksumCRC32" not in head, head
    assert head["ContentLength"] == 2 * len(part) + 5
    # one part now: the layout described the uploaded parts, not these bytes
    assert s3.head_object(Bucket=BUCKET, Key=key, PartNumber=1).get("PartsCount", 1) == 1
    assert not head["ETag"].strip('"').endswith("-2"), head
    got = s3.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")["Body"].read()
    assert got == part + part + b"+tail"


def test_minio_reads_what_the_mount_wrote_with_a_true_checksum(
        daemon: Daemon, s3: Any) -> None:
    minio = pytest.importorskip("minio")
    ep = daemon.endpoints()["s3"]
    assert isinstance(ep, dict)
    host = ep["url"].split("://", 1)[1]
    client = minio.Minio(host, access_key=ACCESS_KEY, secret_key=SECRET_KEY, secure=False,
                         region="us-east-1")
    tag = uuid.uuid4().hex[:8]
    key = _key(tag, "minio.bin")
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"via boto3")
    (daemon.mnt / BUCKET / key).write_bytes(b"via the mount, longer than before")
    resp = client.get_object(BUCKET, key, request_headers={"x-amz-checksum-mode": "ENABLED"})
    try:
        data = resp.read()
        stored = resp.headers.get("x-amz-checksum-crc32")
    finally:
        resp.close()
        resp.release_conn()
    assert data == b"via the mount, longer than before"
    assert stored in (None, _crc32(data)), stored
    # the other way: written through the mount first, read through S3 with validation
    path = daemon.mnt / BUCKET / _key(tag, "mount-first.bin")
    path.write_bytes(b"mount first")
    got = s3.get_object(Bucket=BUCKET, Key=_key(tag, "mount-first.bin"),
                        ChecksumMode="ENABLED")
    assert got["Body"].read() == b"mount first"


def test_a_change_cut_short_by_a_crash_drops_the_checksum(tmp_path: Path) -> None:
    """An in-place write through the mount that a crash cut short (its bytes on disk, its
    commit not): the next start gives the file a new version, and the checksum boto3 stored
    for the old bytes must go with them.  ``write.done`` is a step of the WRITE path: write
    passthrough (the default) is off for it."""
    from durability.test_hot_crash import BUCKET as HOT
    from durability.test_hot_crash import Node, crash_during

    node = Node(tmp_path)
    node.settings["TIERD_FUSE_PASSTHROUGH_WRITES"] = "false"
    try:
        node.start(crashpoint="write.done")
        s3 = node.s3()
        s3.create_bucket(Bucket=HOT)
        old = os.urandom(256 << 10)
        s3.put_object(Bucket=HOT, Key="f", Body=old, ChecksumAlgorithm="CRC32")
        assert "ChecksumCRC32" in s3.head_object(Bucket=HOT, Key="f", ChecksumMode="ENABLED")
        patch = tmp_path / "patch"
        patch.write_bytes(b"P" * 4096)
        crash_during(node, "write.done", lambda: node.fuse(
            "fd = os.open(a[0], os.O_WRONLY)\n"
            "os.pwrite(fd, open(a[1], 'rb').read(), 0)\nos.close(fd)",
            node.path("f"), str(patch)))
        node.start()
        s3 = node.s3()
        got = s3.get_object(Bucket=HOT, Key="f", ChecksumMode="ENABLED")["Body"].read()
        assert got in (old, b"P" * 4096 + old[4096:])
        head = s3.head_object(Bucket=HOT, Key="f", ChecksumMode="ENABLED")
        assert head.get("ChecksumCRC32") in (None, _crc32(got)), head
    finally:
        node.stop()
